"""capo's lean RL trainer: rollout -> reward -> advantage -> update -> log -> eval/save, every phase timed.

Runs on one CPU/GPU or data-parallel under ``accelerate launch`` (each process samples its share of the prompts;
losses are normalised by *global* token/sequence counts so 1 process and P processes, and any number of gradient
accumulation micro-batches, give the same update). What it computes only when the configuration needs it:
- reference log-probs: only when :func:`capo.rollout.method_inputs.needs_reference` says so (``algo.kl_coef > 0``, a
  noise mask, or an estimator built from them: ACE);
- old log-probs: only with several updates per rollout batch (``optim.ppo_epochs`` or ``optim.mini_batches`` > 1);
  otherwise the training forward's own (detached) log-probs are the old ones, exactly;
- CAPO's sequence confidences: the rollout-time log-probs recorded during generation (no extra pass).
Generation engine (``rollout.engine``): ``hf`` samples with the training model itself; ``vllm`` is a colocated vLLM
engine that receives the new weights before the first rollout after each optimizer step. With an engine whose
log-probs are not the trainer's own, each token's policy loss is weighted by truncated importance sampling
(``rollout.tis_cap``, :func:`capo.core.truncated_is_weights`); the mismatch is logged for every engine.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from capo.core import (
    POLICY_LOSSES,
    REWARDS,
    StepResult,
    aggregate,
    kl_penalty,
    logprob_advantage_covariance,
    logprob_mismatch,
    overlong_penalty,
    policy_loss,
    ppl_quantile_thresholds,
    sequence_logprob_mean,
    truncated_is_weights,
)
from capo.core.calibration import summarize
from capo.errors import CapoError, ConfigError
from capo.processes import leave_process_group
from capo.rollout import HFEngine, Rollout, grade, load_model, token_logprobs, train_top_layers
from capo.rollout.lora import adapter_state, add_lora, load_adapter_state, merged_state_dict
from capo.rollout.step import MaskThresholds, StepBatch, StepSpec, step_advantages
from capo.rundir import Progress, check_out_folder, run_lock
from capo.tasks.prompts import with_prefix
from capo.tasks.stochastic import stochastic_summary
from capo.trainer import checkpoint as ckpt
from capo.trainer.config import TrainConfig, dump_yaml, resume_changes
from capo.trainer.data import load_problems, render_prompts
from capo.trainer.logging import MetricsLogger, PolicyMeans, progress_info
from capo.trainer.user_reward import load_user_reward, user_rewards
from capo.verify import Verdict, Verifier


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class UpdateBatch:
    """What the advantage phase hands to the update phase.

    ro: the rollout; advantages [N]; active [N] bool rows that take part (filtered or bad groups do not, nor count
    in the loss normalisers); old_logp / ref_logp [N, T] (None: the training forward's own detached log-probs are
    the old ones / no reference); loss_inputs: the policy loss's extra [N] inputs (C2GSPG's rewards).
    """

    ro: Rollout
    advantages: torch.Tensor
    active: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    loss_inputs: dict


class Timer(dict):
    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        yield
        self[f"time/{phase}"] = self.get(f"time/{phase}", 0.0) + time.perf_counter() - t0


class Trainer:
    def __init__(self, cfg: TrainConfig, accelerator: Accelerator | None = None, engine=None):
        """``engine``: an already started generation engine for ``cfg.model.path`` (e.g. one vLLM engine shared by
        several runs in one process; its RNG stream is the caller's to seed); default: built from the config."""
        self.cfg = cfg
        self.acc = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.rank, self.world = self.acc.process_index, self.acc.num_processes
        if cfg.rollout.prompts_per_step % self.world:
            raise ValueError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must be divisible by the "
                             f"number of processes ({self.world})")
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.run_dir = Path(cfg.run.out_dir)
        check_out_folder(self.run_dir, kind="training run", flag="run.out_dir")
        self.train_set, self.eval_set = load_problems(cfg.data, seed=cfg.run.seed)
        resume_from = ckpt.latest_checkpoint(self.run_dir) if cfg.run.resume else None
        if resume_from is not None and (changed := resume_changes(self.run_dir, cfg)):
            raise ConfigError(f"{self.run_dir} holds a run trained with other settings ({'; '.join(changed)}): "
                              "resume it with the settings it was trained with, train in another run.out_dir, or "
                              "start it over with run.resume=false")
        # a LoRA run resumes on its base model (its checkpoints hold merged weights; the adapters are in their state)
        start = cfg.model.path if resume_from is None or cfg.model.lora_rank else str(resume_from)
        self.model, self.tok = load_model(start, DTYPES[cfg.model.dtype])
        self.ref = None
        if cfg.needs_reference:
            self.ref, _ = load_model(cfg.model.ref_path or cfg.model.path, DTYPES[cfg.model.ref_dtype or cfg.model.dtype])
            self.ref.requires_grad_(False)
            self.ref.to(self.acc.device)
        self.verifier = Verifier(workers=max(1, min(4, torch.get_num_threads())))
        self.user_reward = load_user_reward(cfg.algo.reward) if ":" in cfg.algo.reward else None
        self.reward_fn = None if self.user_reward else REWARDS.get(cfg.algo.reward)
        self.param_counts = self._choose_trained()
        o, params = cfg.optim, [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=o.fused or None)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (o.warmup_steps + 1)))
        self.model, self.opt, self.sched = self.acc.prepare(self.model, opt, sched)
        self.engine = engine if engine is not None else self._make_engine(resume_from)
        self.engine_step = None  # the step whose weights the engine holds (None: not synced yet)
        self.tis_cap = cfg.rollout.tis_cap if self.engine.name != "hf" else 0.0  # hf: the trainer's own log-probs
        self.step, self.data_pos, self.mask_thresholds = 0, 0, None
        self.saved_row: dict | None = None  # the metrics row of the checkpoint resumed from (see ``save``)
        self._seed_everything(cfg.run.seed)
        if resume_from:
            self._restore(resume_from)

    def leave_process_group(self) -> bool:
        """On several processes: wait for every process and leave the process group, DDP freed before the group
        (:func:`capo.processes.leave_process_group` says why). The model is the plain module afterwards, and the
        trainer cannot train on several processes again. Returns whether DDP was freed first."""
        return leave_process_group(self.acc, self.model,
                                   lambda: setattr(self, "model", self.acc.unwrap_model(self.model)))

    def _choose_trained(self) -> dict[str, int]:
        """Freeze what does not train (``model.train_top_layers``) or add LoRA adapters (``model.lora_rank``);
        the trained and total parameter counts, said when not every parameter trains."""
        m = self.cfg.model
        if m.lora_rank:
            with torch.random.fork_rng():  # the adapters' random A from the run's seed, the global stream untouched
                torch.manual_seed(self.cfg.run.seed)
                n = add_lora(self.model, m.lora_rank, m.lora_alpha, m.lora_targets)
            how = f"model.lora_rank={m.lora_rank}"
        else:
            n, how = train_top_layers(self.model, m.train_top_layers), f"model.train_top_layers={m.train_top_layers}"
        if n["trained"] < n["total"] and self.acc.is_main_process:
            print(f"capo train: training {n['trained'] / 1e6:.2f}M of {n['total'] / 1e6:.2f}M parameters ({how})",
                  file=sys.stderr, flush=True)
        return n

    def _make_engine(self, resume_from):
        r, autocast = self.cfg.rollout, "on" if self.cfg.model.autocast_bf16 else "off"
        if r.engine == "vllm":
            from capo.rollout.vllm_engine import VLLMEngine

            return VLLMEngine(str(resume_from or self.cfg.model.path), tokenizer=self.tok, dtype=self.cfg.model.dtype,
                              seed=self.cfg.run.seed + self.rank, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                              enable_sleep_mode=r.vllm_sleep_mode)
        return HFEngine(self.acc.unwrap_model(self.model), self.tok, autocast=autocast, share_prefix=r.share_prefix,
                        kv_cache=r.kv_cache, decode=r.decode)

    # ----------------------------------------------------------------------------------------------- the loop
    def train(self) -> dict:
        cfg, last = self.cfg, {}
        if self.acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(dump_yaml(cfg))
        if cfg.algo.noise_mask != "off" and self.mask_thresholds is None:
            self.mask_thresholds = self.calibrate_mask()
        with run_lock(self.run_dir, "train") if self.acc.is_main_process else contextlib.nullcontext(), \
                MetricsLogger(self.run_dir, self.step, enabled=self.acc.is_main_process) as log, \
                Progress(cfg.run.steps, self.step, label="train", unit="steps", every_s=30.0,
                         enabled=cfg.run.progress and self.acc.is_main_process) as bar:
            if self.saved_row is not None and self.saved_row["step"] > log.last_step:
                log.write(self.saved_row)  # killed after its checkpoint, before its row: the row from the checkpoint
            if cfg.run.eval_at_start and self.step == 0 and log.last_step < 0:
                log.write({**self.evaluate(), "step": 0})
            while self.step < cfg.run.steps:
                t = Timer()
                with t("step"):
                    problems = self.next_problems()
                    with t("rollout"):
                        ro = self.rollout(problems, cfg.rollout.group_size)
                    with t("reward"):
                        g, rewards = self.reward(ro, problems)
                    with t("reference"):
                        ref_logp = self.logprobs(self.ref, ro) if self.ref is not None else None
                    with t("old_logprobs"):
                        old_logp = None if cfg.single_update else self.logprobs(self.model, ro)
                    with t("advantage"):
                        batch, stats = self.advantages(ro, g, rewards, ref_logp, old_logp)
                    with t("update"):
                        stats |= self.update(batch)
                    self.step += 1
                    stats |= self.rollout_metrics(ro, g, rewards)
                    if self.step == cfg.run.steps or (cfg.run.eval_every and self.step % cfg.run.eval_every == 0):
                        with t("eval"):
                            stats |= self.evaluate()
                    if self.step == cfg.run.steps or (cfg.run.save_every and self.step % cfg.run.save_every == 0):
                        with t("save"):
                            self.save({**stats, "step": self.step})
                last = {**stats, **t, "step": self.step}
                log.write(last)
                bar.update(self.step, progress_info(last))
        return last

    # ------------------------------------------------------------------------------------------------ phases
    def next_problems(self):
        """This process's share of the next B prompts; the global order is a seeded permutation per epoch."""
        b, n = self.cfg.rollout.prompts_per_step, len(self.train_set)
        out = []
        for pos in range(self.data_pos, self.data_pos + b):
            epoch, i = divmod(pos, n)
            perm = np.random.default_rng([self.cfg.run.seed, epoch]).permutation(n)
            out.append(self.train_set[perm[i]])
        self.data_pos += b
        per = b // self.world
        return out[self.rank * per:(self.rank + 1) * per]

    def rollout(self, problems, group_size: int, engine=None, seed: int | None = None) -> Rollout:
        """``group_size`` responses per problem from the policy (or from ``engine``'s model, e.g. the reference);
        ``seed``: restart the engine's sampling stream from it first (None: continue it)."""
        c = self.cfg
        if engine is None:
            engine = self.engine
            model = self.acc.unwrap_model(self.model)
            model.eval()
            if self.engine_step != self.step:  # weights changed since the last sync (or never synced)
                engine.sync_weights(model)
                self.engine_step = self.step
        prompts = render_prompts(problems, self.tok, c.data, use_chat_template=c.model.chat_template)
        ro = engine.sample(prompts, k=group_size, max_new_tokens=c.rollout.max_new_tokens,
                           temperature=c.rollout.temperature, top_p=c.rollout.top_p, seed=seed)
        engine.sleep()  # vLLM sleep mode: give the memory back to training
        return ro.to(self.acc.device)

    def reward(self, ro: Rollout, problems):
        g_size = len(ro.texts) // len(problems)
        golds = [p.answer for p in problems for _ in range(g_size)]
        dev = ro.response_ids.device  # the step runs where the rollout is (the trainer's device)
        texts = with_prefix(self.cfg.data.response_prefix, ro.texts)  # as the model's turn reads
        g = grade(texts, golds, self.verifier, answer_format=self.cfg.data.answer_format, device=dev)
        if self.user_reward is not None:
            prompts = [p.prompt for p in problems for _ in range(g_size)]
            rewards, g.reward_errors, _ = user_rewards(self.user_reward, prompts, texts, golds,
                                                       timeout=self.cfg.algo.reward_timeout,
                                                       on_error=self.cfg.algo.reward_errors)
            rewards = rewards.to(dev)
        else:
            rewards = self.reward_fn(g.correct, confidence=g.confidence, format_ok=g.format_ok,
                                     **self.cfg.algo.reward_kwargs)
        if self.cfg.algo.overlong_cache:
            rewards = rewards + overlong_penalty(ro.lengths, self.cfg.rollout.max_new_tokens,
                                                 self.cfg.algo.overlong_cache)
        return g, rewards

    @torch.no_grad()
    def logprobs(self, model, ro: Rollout) -> torch.Tensor:
        model = self.acc.unwrap_model(model)
        out = []
        for idx in self._micro_batches(torch.arange(len(ro.texts))):
            out.append(self._forward(model, ro, idx))
        return torch.cat(out)

    def advantages(self, ro: Rollout, g, rewards, ref_logp, old_logp) -> tuple[UpdateBatch, dict]:
        """The one step shared with the TRL and verl adapters (:func:`capo.rollout.step.step_advantages`; verdicts
        decide correctness) -> the update's batch, and the phase's metrics (``calib/*`` included)."""
        lp = old_logp if old_logp is not None else ro.gen_logp  # the most exact rollout-time log-probs we have
        batch = StepBatch(rewards=rewards, group_size=self.cfg.rollout.group_size, mask=ro.response_mask,
                          correct=g.correct, token_logp=lp, ref_token_logp=ref_logp, answers=g.answers,
                          confidence=g.confidence, format_ok=g.format_ok, verifier=self.verifier,
                          answer_format=self.cfg.data.answer_format,
                          confidence_logp=None if old_logp is None else ro.gen_logp)  # calib/*: rollout-time lpm
        out = step_advantages(batch, self._step_spec())
        res = out.result
        stats = {"train/bad_samples": self._check_bad(ro, rewards, res), **out.metrics,
                 "policy/adv_abs_mean": self._mean(res.advantages.abs()),
                 "policy/logp_adv_cov": float(logprob_advantage_covariance(lp, res.advantages,
                                                                           ro.response_mask & res.active[:, None]))}
        return UpdateBatch(ro, res.advantages, res.active, old_logp, ref_logp, out.loss_inputs), stats

    def _step_spec(self) -> StepSpec:
        """The configured estimator, loss, reward, noise mask (any estimator, when on) and group filter."""
        a = self.cfg.algo
        mask = None
        if a.noise_mask != "off":  # thresholds measured or fixed before training (calibrate_mask)
            if self.mask_thresholds is None:
                raise CapoError(f"algo.noise_mask={a.noise_mask}: the mask's thresholds are not set yet (train() "
                                "measures them before its first step); outside train(), set "
                                "trainer.mask_thresholds = trainer.calibrate_mask() first")
            mask = MaskThresholds("fixed", *self.mask_thresholds, engine="capo train")
        return StepSpec(a.advantage, advantage_kwargs=a.advantage_kwargs, loss=a.loss,
                        reward=a.reward if ":" not in a.reward else "user", reward_kwargs=a.reward_kwargs, mask=mask,
                        group_filter=a.group_filter, group_filter_by=a.group_filter_by or "correct",
                        engine="capo train",
                        gather=lambda x: self.acc.gather(x.to(self.acc.device)))

    def _check_bad(self, ro: Rollout, rewards, res: StepResult) -> float:
        """Numerical guard: a NaN/inf reward or log-prob never reaches the parameters (the step drops the whole
        group of a bad sample). Returns how many there were over all processes; by ``run.on_bad_sample`` the run
        goes on, or stops naming the first one."""
        if res.bad.any() and self.cfg.run.on_bad_sample == "fail":
            i = int(res.bad.nonzero()[0])
            raise CapoError(f"step {self.step + 1}: response {i} ({ro.texts[i][:80]!r}) has reward "
                            f"{float(rewards[i])} and mean log-prob {float(res.scores[i])}; set "
                            "run.on_bad_sample=skip to drop such groups and count them instead")
        return self.acc.reduce(res.bad.sum().to(self.acc.device), "sum").item()

    def update(self, batch: UpdateBatch) -> dict:
        """PPO-style update over ``batch.active`` rows (filtered or bad groups take no part, nor count in
        normalisers)."""
        c, ro = self.cfg, batch.ro
        rows = torch.arange(len(batch.advantages), device=batch.active.device)[batch.active]
        # the old log-probs the loss saw, for the mismatch metric (without old_logp: the micro-steps' own)
        old_seen = batch.old_logp if batch.old_logp is not None else torch.zeros_like(ro.gen_logp)
        means, loss_total, grad_total, ran = PolicyMeans(), 0.0, 0.0, False
        n_updates = skipped = 0
        minis = self._mini_batches(rows)  # the same split every epoch
        for _ in range(c.optim.ppo_epochs):
            for mb in minis:
                n_tok = self.acc.reduce(ro.response_mask[mb].sum().float(), "sum").item()
                n_seq = self.acc.reduce(torch.tensor(float(len(mb)), device=self.acc.device), "sum").item()
                micros = self._micro_batches(mb) or [None]  # None: no row here, a zero-weight step for the all-reduce
                step_loss = 0.0
                for k, idx in enumerate(micros):
                    sync = k == len(micros) - 1
                    if idx is None:
                        self._zero_step(batch)
                        continue
                    with contextlib.nullcontext() if sync else self.acc.no_sync(self.model):
                        loss, m, old = self._micro_step(batch, idx, n_seq, n_tok)
                    if batch.old_logp is None:
                        old_seen[idx] = old.to(old_seen)
                    step_loss, ran = step_loss + loss, True  # global denominators: the parts sum
                    means.add(m)
                norm = float(self.acc.clip_grad_norm_(self.model.parameters(), c.optim.max_grad_norm or float("inf")))
                taken = math.isfinite(norm)  # never let a NaN/inf gradient reach the parameters
                if taken:
                    loss_total, grad_total, n_updates = loss_total + step_loss, grad_total + norm, n_updates + 1
                    self.opt.step()
                else:  # its metrics count nowhere
                    skipped += 1
                means.end_step(taken)
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
        out = means.result(self.acc)
        if ran or self.world > 1:  # every process reduces, those without a row too
            total = self.acc.reduce(torch.tensor(loss_total, device=self.acc.device), "sum").item()
            out["policy/loss"] = total / n_updates if n_updates else float("nan")
        if n_updates:
            out["policy/grad_norm"] = grad_total / n_updates
        out["policy/lr"] = self.sched.get_last_lr()[0]
        out["policy/updates"] = n_updates
        out["policy/skipped_updates"] = skipped
        return out | self._mismatch(ro, batch.active, old_seen)

    def _mismatch(self, ro: Rollout, active, old_seen) -> dict:
        """|trainer old log-prob - engine log-prob| over the tokens of the rows that took part in the update."""
        s = logprob_mismatch(old_seen, ro.gen_logp, ro.response_mask * active[:, None].to(ro.response_mask))
        dev = self.acc.device
        total = self.acc.reduce(torch.stack([s["sum"], s["count"]]).to(dev), "sum")
        peak = self.acc.gather(s["max"].reshape(1).to(dev)).max()
        mean = float(total[0] / total[1]) if float(total[1]) > 0 else float("nan")
        return {"rollout/logprob_diff_mean": mean, "rollout/logprob_diff_max": float(peak)}

    def _micro_step(self, batch: UpdateBatch, idx, n_seq, n_tok) -> tuple[float, dict, torch.Tensor]:
        """Forward + backward of rows ``idx`` -> (loss, metrics, the old log-probs the loss used); each metric as
        (its mean over the rows' real tokens or responses, that count), for :class:`PolicyMeans`."""
        c, a, ro = self.cfg, self.cfg.algo, batch.ro
        self.model.train()
        mask = ro.response_mask[idx]
        logp, entropy = self._forward(self.model, ro, idx, with_entropy=True)
        old = logp.detach() if batch.old_logp is None else batch.old_logp[idx]
        extra = {k: v[idx].to(logp.dtype) for k, v in batch.loss_inputs.items()}
        loss_tok, lm = policy_loss(a.loss, logp, old, batch.advantages[idx].to(logp.dtype), mask, **extra,
                                   **a.loss_kwargs)
        if self.tis_cap:  # the engine's sampling distribution is not the trainer's pi_old: reweight per token
            loss_tok = loss_tok * truncated_is_weights(old, ro.gen_logp[idx].to(old), mask, cap=self.tis_cap)
        kl = None
        if a.kl_coef > 0:
            kl = kl_penalty(logp, batch.ref_logp[idx], a.kl_estimator)
            loss_tok = loss_tok + a.kl_coef * kl
        agg = dict(num_seqs=n_seq, num_tokens=n_tok, max_len=c.rollout.max_new_tokens)
        loss = aggregate(loss_tok, mask, a.aggregation, **agg)
        self.acc.backward(loss * self.world)  # DDP averages gradients over processes; we want their sum
        mf = mask.float()
        tokens, responses = float(mf.sum()), float((mf.sum(-1) > 0).sum())
        per_response = POLICY_LOSSES.per_response(a.loss)
        out = {f"policy/{k}": (float(v), responses if k in per_response else tokens) for k, v in lm.items()}
        out["policy/entropy"] = (float((entropy * mf).sum() / mf.sum().clamp(min=1)), tokens)
        if kl is not None:
            out["policy/kl"] = (float((kl.detach() * mf).sum() / mf.sum().clamp(min=1)), tokens)
        return float(loss.detach()), out, old

    def _zero_step(self, batch: UpdateBatch) -> None:
        """This process has no row in a mini-batch that another process has rows in: a forward of one row and the
        backward of 0 times its real tokens' log-probs (the loss's inputs left out: a dropped row's may be NaN) join
        the gradients' all-reduce, adding nothing, so every process makes the same collective calls."""
        ro, one = batch.ro, torch.arange(1)
        self.model.train()
        logp = self._forward(self.model, ro, one)
        self.acc.backward(torch.where(ro.response_mask[one].bool(), logp, torch.zeros((), dtype=logp.dtype)).sum()
                          * 0.0)

    def _forward(self, model, ro: Rollout, idx, *, with_entropy: bool = False):
        """``model``'s forward of rollout rows ``idx`` with the run's knobs: their response tokens' log-probs [n, T]
        (and entropies); the one call of :func:`capo.rollout.logprobs.token_logprobs` here."""
        c = self.cfg
        return token_logprobs(model, ro.prompt_ids[idx], ro.prompt_mask[idx], ro.response_ids[idx],
                              ro.response_mask[idx], autocast_bf16=c.model.autocast_bf16, with_entropy=with_entropy,
                              share_prefix=c.rollout.share_prefix, attention_impl=c.model.attention)

    # ------------------------------------------------------------------------------------------- measurement
    def rollout_metrics(self, ro: Rollout, g, rewards) -> dict:
        """``train/*`` of the step's rollouts over every process (its ``calib/*`` come from the advantage step)."""
        G = self.cfg.rollout.group_size
        t = self.acc.gather
        correct, rewards, conf, fmt = t(g.correct), t(rewards), t(g.confidence), t(g.format_ok)
        lengths, trunc = t(ro.lengths.float()), t(ro.truncated.float())
        per_group = correct.view(-1, G).float().mean(1)
        return {
            "train/reward_mean": float(rewards.mean()), "train/accuracy": float(correct.float().mean()),
            "train/mixed_group_frac": float(((per_group > 0) & (per_group < 1)).float().mean()),
            "train/response_len": float(lengths.mean()), "train/truncated_frac": float(trunc.mean()),
            "train/format_ok_frac": float(fmt.float().mean()),
            "train/reward_errors": self.acc.reduce(torch.tensor(g.reward_errors, device=self.acc.device), "sum").item(),
            "train/verify_timeouts": self.acc.reduce(torch.tensor(sum(v == Verdict.TIMEOUT for v in g.verdicts),
                                                                  device=self.acc.device), "sum").item(),
            "train/verbal_conf_mean": float(torch.nanmean(conf)) if torch.isfinite(conf).any() else float("nan"),
        }

    def evaluate(self) -> dict:
        """Sample run.eval_samples responses for each held-out problem with a fixed seed (the same samples at every
        evaluation for a given model), without disturbing the training RNG stream."""
        k = self.cfg.run.eval_samples
        share = self.eval_set[self.rank::self.world]
        stream = self.engine.rng_state()  # an engine with its own stream: the training stream goes on after this
        with torch.random.fork_rng():
            seed = self.cfg.run.seed + 10_007 + self.rank
            torch.manual_seed(seed)
            ro = self.rollout(share, k, seed=seed)
        self.engine.set_rng_state(stream)
        g, _ = self.reward(ro, share)
        lpm = sequence_logprob_mean(ro.gen_logp, ro.response_mask)
        gid = torch.arange(len(share), device=self.acc.device).repeat_interleave(k) * self.world + self.rank
        t = self.acc.gather_for_metrics
        s = summarize(t(lpm).cpu(), t(g.correct).cpu(), t(gid).cpu(), verbal_conf=t(g.confidence).cpu())
        if share and g.outcome is not None and all(p.meta.get("rate") is not None for p in share):  # stochastic
            rate = torch.tensor([p.meta["rate"] for p in share], dtype=torch.float64, device=gid.device)
            s |= stochastic_summary(t(g.stated).cpu(), t(g.outcome).cpu(), t(gid).cpu(),
                                    t(rate.repeat_interleave(k)).cpu(),
                                    chosen=None if g.chosen is None else t(g.chosen).cpu())
        ent_sum, n_tok = self._entropy_sum(ro)
        s["entropy"] = float(self.acc.reduce(ent_sum, "sum") / self.acc.reduce(n_tok, "sum").clamp(min=1))
        return {f"eval/{key}": float(v) for key, v in s.items()}

    @torch.no_grad()
    def _entropy_sum(self, ro: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum over real response tokens of the policy's next-token entropy at temperature 1, token count)."""
        model = self.acc.unwrap_model(self.model)
        total = torch.zeros((), device=self.acc.device)
        for idx in self._micro_batches(torch.arange(len(ro.texts))):
            _, ent = self._forward(model, ro, idx, with_entropy=True)
            total = total + (ent.float() * ro.response_mask[idx]).sum()
        return total, ro.response_mask.sum().to(total)

    def calibrate_mask(self) -> tuple[float, float]:
        """CAPO's mask thresholds: fixed numbers, or quantiles of the reference model's PPL on its own rollouts."""
        a = self.cfg.algo
        if a.noise_mask == "fixed":
            return a.mask_low, a.mask_high
        n = max(1, a.mask_calib_prompts // self.world)
        probs = [self.train_set[i % len(self.train_set)] for i in range(self.rank * n, (self.rank + 1) * n)]
        ref_engine = HFEngine(self.ref, self.tok, autocast="on" if self.cfg.model.autocast_bf16 else "off",
                              share_prefix=self.cfg.rollout.share_prefix,
                              kv_cache=self.cfg.rollout.kv_cache,  # whatever rollout.engine: HF here
                              decode=self.cfg.rollout.decode)
        with torch.random.fork_rng():
            torch.manual_seed(self.cfg.run.seed + 20_011 + self.rank)
            ro = self.rollout(probs, self.cfg.rollout.group_size, engine=ref_engine)
        ppl = torch.exp(-sequence_logprob_mean(self.logprobs(self.ref, ro), ro.response_mask))
        low, high = ppl_quantile_thresholds(self.acc.gather(ppl.to(self.acc.device)).cpu(), a.mask_q_low,
                                            a.mask_q_high)
        if self.acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)  # called outside train() too
            (self.run_dir / "mask_thresholds.json").write_text(json.dumps({"low": low, "high": high}))
        return low, high

    # ------------------------------------------------------------------------------------------------ state
    def save(self, row: dict | None = None) -> None:
        """Checkpoint the whole training state. ``row``: this step's metrics row without its timings, kept in the
        checkpoint because the row is written after it: a run killed in between writes it on resume."""
        state = {"step": self.step, "data_pos": self.data_pos, "mask_thresholds": self.mask_thresholds,
                 "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(), "row": row}
        model, weights = self.acc.unwrap_model(self.model), None
        if self.cfg.model.lora_rank:  # a plain model of merged weights, the adapters in the state for resuming
            state["lora"], weights = adapter_state(model), merged_state_dict(model)
        ckpt.save_checkpoint(self.run_dir, self.step, model=self.model, tokenizer=self.tok, state=state,
                             accelerator=self.acc, keep=self.cfg.run.keep_checkpoints,
                             engine_rng=self.engine.rng_state(), weights=weights)

    def _restore(self, path: Path) -> None:
        state, rng = ckpt.load_state(path, self.rank)
        if self.cfg.model.lora_rank:
            if "lora" not in state:
                raise ConfigError(f"{path}: a checkpoint of a run without LoRA adapters; resume it with "
                                  "model.lora_rank=0, or start the LoRA run in another run.out_dir")
            load_adapter_state(self.acc.unwrap_model(self.model), state["lora"])
        elif "lora" in state:
            raise ConfigError(f"{path}: a checkpoint of a LoRA run; resume it with the model.lora_* settings it was "
                              "started with")
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step, self.data_pos = state["step"], state["data_pos"]
        self.mask_thresholds = state["mask_thresholds"]
        self.saved_row = state.get("row")
        if rng is not None:
            ckpt.set_rng_state(rng)
            self.engine.set_rng_state(rng.get("engine"))

    def _seed_everything(self, seed: int) -> None:
        random.seed(seed + self.rank)
        np.random.seed((seed + self.rank) % 2**32)
        torch.manual_seed(seed + self.rank)

    # ---------------------------------------------------------------------------------------------- helpers
    def _mini_batches(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """This process's ``optim.mini_batches`` shares of its active ``rows``, as many on every process (the most
        any process has; the others' extra shares are empty): each is one optimizer step that every process takes,
        whatever rows a group filter or the numerical guard left it."""
        chunks = list(rows.chunk(self.cfg.optim.mini_batches)) if len(rows) else []
        n = int(self.acc.gather(torch.tensor([len(chunks)], device=self.acc.device)).max()) if self.world > 1 else \
            len(chunks)
        return chunks + [rows[:0]] * (n - len(chunks))

    def _micro_batches(self, rows: torch.Tensor) -> list[torch.Tensor]:
        size = self.cfg.optim.micro_batch_size or len(rows)
        return list(rows.split(size)) if len(rows) else []

    def _mean(self, x: torch.Tensor) -> float:
        return float(self.acc.gather(x.float().reshape(-1).to(self.acc.device)).mean())


def train(cfg: TrainConfig) -> dict:
    """Train with ``cfg`` (already resolved); returns the last step's metrics."""
    trainer = Trainer(cfg)
    last = trainer.train()
    trainer.leave_process_group()
    return last
