"""The trainer's loss assembly (``Trainer.update`` / ``Trainer._micro_step``), hand-computed on a table policy.

The policy is a table: the log-prob of response token (i, t) is the parameter ``theta[i, t]`` itself (the training
forward ``token_logprobs`` is replaced by a lookup), so the gradient the optimizer receives is d loss / d logp,
which these tests write down by hand for each choice: the KL term's sign, coefficient and estimator, the importance
ratio's old log-probs, truncated importance sampling, the four aggregations' normalisers under micro-batches,
mini-batches, inactive rows and two data-parallel processes. The optimizer's learning rate is 0, so every recorded
gradient is taken at the same ``theta``.

Shapes: N = 4 responses (B = 2 prompts, G = 2), T = 3 response positions, generation limit L_max = 5 (> T, so
Dr. GRPO's constant N * L_max is not N * T). Response lengths 3, 2, 1, 2 (8 tokens).
"""

import contextlib
import math

import pytest
import torch

from capo.rollout import Rollout
from capo.trainer import loop
from capo.trainer.config import load_config
from capo.trainer.loop import Trainer, UpdateBatch

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])  # [N, T], lengths 3, 2, 1, 2
LENGTHS = torch.tensor([3.0, 2.0, 1.0, 2.0])
ADV = torch.tensor([1.0, -0.5, 2.0, -1.5])  # [N]
THETA = torch.tensor([[-0.5, -1.0, -1.5], [-0.2, -0.4, -9.0], [-1.2, -9.0, -9.0], [-0.3, -0.6, -9.0]])  # [N, T]
D = torch.tensor([[0.3, -0.2, 0.1], [0.5, 0.2, 7.0], [-0.4, 7.0, 7.0], [0.1, -0.3, 7.0]])  # ref_logp - logp
E = torch.tensor([[0.02, 0.08, -0.04], [0.06, -0.1, 0.0], [0.03, 0.0, 0.0], [-0.05, 0.09, 0.0]])  # logp - old_logp
ENTROPY = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 60.0], [7.0, 80.0, 90.0], [1.5, 2.5, 70.0]])
L_MAX = 5
M = MASK.float()


class TablePolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(THETA.clone())


PROMPT_IDS = torch.tensor([[0, 5], [1, 6], [2, 7], [3, 8]])  # column 0: the row, read by the table forward
PROMPT_MASK = torch.tensor([[1, 1], [0, 1], [1, 1], [0, 1]])
RESPONSE_IDS = torch.arange(12).view(4, 3)


def table_logprobs(model, prompt_ids, prompt_mask, response_ids, mask, *, autocast_bf16, share_prefix,
                   attention_impl, with_entropy=False):
    """The training forward of the table policy: row ``prompt_ids[:, 0]`` of ``theta`` (and fixed entropies). It
    checks that it is handed the rows' own prompt mask, response ids and mask, and the configured knobs."""
    rows = prompt_ids[:, 0]
    assert torch.equal(prompt_ids, PROMPT_IDS[rows]) and torch.equal(prompt_mask, PROMPT_MASK[rows])
    assert torch.equal(response_ids, RESPONSE_IDS[rows]) and torch.equal(mask, MASK[rows])
    assert (autocast_bf16, share_prefix, attention_impl) == model.knobs
    logp = model.theta[rows]
    return (logp, ENTROPY[rows]) if with_entropy else logp


class TwinProcesses:
    """The accelerator of one of ``world`` data-parallel processes that all hold the same rows: a sum over
    processes is ``world`` times the local value; DDP's gradient average over equal gradients is the local one."""

    device = torch.device("cpu")

    def __init__(self, world: int):
        self.num_processes = world
        self.synced = []  # per backward: False inside no_sync(model) (DDP all-reduces no gradient there)
        self.unsynced_models = []
        self._sync = True

    def reduce(self, x, op):
        assert op == "sum"
        return x * self.num_processes

    def gather(self, x):
        return x.repeat(self.num_processes)

    def backward(self, loss):
        self.synced.append(self._sync)
        loss.backward()

    @contextlib.contextmanager
    def no_sync(self, model):
        self.unsynced_models.append(model)
        self._sync = False
        yield
        self._sync = True

    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def make_trainer(monkeypatch, world=1, tis_cap=0.0, **overrides):
    """A Trainer with only what ``update`` reads: config, accelerator, table policy, SGD at lr 0; and the grads
    list that each optimizer step appends the gradient it receives to."""
    cfg = load_config(None, {"rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": L_MAX,
                             "optim.max_grad_norm": 0.0, **overrides})
    monkeypatch.setattr(loop, "token_logprobs", table_logprobs)
    tr = Trainer.__new__(Trainer)
    tr.cfg, tr.acc, tr.world, tr.tis_cap = cfg, TwinProcesses(world), world, tis_cap
    tr.model = TablePolicy()
    tr.model.knobs = (cfg.model.autocast_bf16, cfg.rollout.share_prefix, cfg.model.attention)
    tr.opt = torch.optim.SGD(tr.model.parameters(), lr=0.0)
    grads = []
    tr.opt.register_step_pre_hook(lambda opt, args, kwargs: grads.append(tr.model.theta.grad.detach().clone()))
    tr.sched = torch.optim.lr_scheduler.LambdaLR(tr.opt, lambda s: 1.0)
    return tr, grads


def make_batch(gen_logp=THETA, old_logp=None, ref_logp=None, active=(True, True, True, True)):
    ro = Rollout(prompt_ids=PROMPT_IDS, prompt_mask=PROMPT_MASK, response_ids=RESPONSE_IDS, response_mask=MASK,
                 gen_logp=gen_logp.clone(),
                 texts=["a", "b", "c", "d"], truncated=torch.zeros(4, dtype=torch.bool))
    return UpdateBatch(ro, ADV.clone(), torch.tensor(active), old_logp, ref_logp, {})


# d kl / d logp of each estimator, with d = ref_logp - logp: k1 = -d, k2 = d^2 / 2, k3 = e^d - d - 1
KL_GRAD = {"k1": lambda d: torch.ones_like(d), "k2": lambda d: -d, "k3": lambda d: 1 - torch.exp(d)}
KL_VALUE = {"k1": lambda d: -d, "k2": lambda d: 0.5 * d * d, "k3": lambda d: torch.exp(d) - d - 1}


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_is_added_with_its_coefficient_and_estimator(monkeypatch, estimator):
    """On-policy (ratio 1) PPO-clip, token-mean: d loss / d logp_{i,t} = m_{i,t} (-A_i + beta dkl/dlogp) / 8."""
    beta = 0.1
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "algo.kl_coef": beta,
                                            "algo.kl_estimator": estimator})
    out = tr.update(make_batch(ref_logp=THETA + D))
    want = M * (-ADV[:, None] + beta * KL_GRAD[estimator](D)) / 8
    (got,) = grads
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    kl = KL_VALUE[estimator](D)
    assert out["policy/kl"] == pytest.approx(float((kl * M).sum() / 8), rel=1e-6)
    assert out["policy/loss"] == pytest.approx(float(((-ADV[:, None] + beta * kl) * M).sum() / 8), rel=1e-6)


def test_kl_by_hand_one_token():
    """The k3 numbers the test above relies on, for one token: d = 0.3 -> k3 = e^0.3 - 1.3, d k3/d logp = 1 - e^0.3."""
    d = torch.tensor([[0.3]])
    assert float(KL_VALUE["k3"](d)) == pytest.approx(0.0498588, abs=1e-7)
    assert float(KL_GRAD["k3"](d)) == pytest.approx(-0.3498588, abs=1e-7)
    assert float(loop.kl_penalty(torch.zeros(1, 1), d, "k3")) == pytest.approx(0.0498588, abs=1e-7)


def test_no_kl_term_without_a_coefficient(monkeypatch):
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "algo.kl_coef": 0.0})
    out = tr.update(make_batch(ref_logp=THETA + D))
    torch.testing.assert_close(grads[0], M * -ADV[:, None] / 8, rtol=1e-6, atol=1e-7)
    assert "policy/kl" not in out


# each aggregation's weight of token (i, t) in the loss: d loss / d l_{i,t} (N = 4 sequences, 8 tokens, L_max 5)
SCALE = {"token-mean": torch.full((4, 1), 1 / 8), "seq-mean-token-mean": 1 / (4 * LENGTHS[:, None]),
         "seq-mean-token-sum": torch.full((4, 1), 1 / 4), "seq-mean-token-sum-norm": torch.full((4, 1), 1 / 20)}


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("micro", [0, 2])
@pytest.mark.parametrize("aggregation", sorted(SCALE))
def test_normalisers_are_global_over_micro_batches_and_processes(monkeypatch, aggregation, micro, world):
    """Micro-batches (rows 0-1: 5 tokens, rows 2-3: 3 tokens) and two processes holding the same rows give the
    one-process full-batch gradient m_{i,t} (-A_i) * scale_{i,t}."""
    tr, grads = make_trainer(monkeypatch, world, **{"algo.aggregation": aggregation, "optim.micro_batch_size": micro})
    out = tr.update(make_batch())
    (got,) = grads
    torch.testing.assert_close(got, M * -ADV[:, None] * SCALE[aggregation], rtol=1e-6, atol=1e-7)
    # the logged loss is that of the global batch (the processes' parts summed): with two processes holding the
    # same rows, the one-process loss
    assert out["policy/loss"] == pytest.approx(float((M * -ADV[:, None] * SCALE[aggregation]).sum()), rel=1e-6)
    assert out["policy/updates"] == 1 and out["policy/skipped_updates"] == 0


@pytest.mark.parametrize("micro, synced", [(0, [True]), (2, [False, True])])
def test_gradients_are_all_reduced_once_per_mini_batch(monkeypatch, micro, synced):
    """Data parallel: every micro-batch but the last backpropagates inside the model's no_sync (no all-reduce), the
    last one synchronises the accumulated gradient."""
    tr, _ = make_trainer(monkeypatch, 2, **{"algo.aggregation": "token-mean", "optim.micro_batch_size": micro})
    tr.update(make_batch())
    assert tr.acc.synced == synced
    assert all(m is tr.model for m in tr.acc.unsynced_models) and len(tr.acc.unsynced_models) == synced.count(False)


def test_importance_ratio_uses_the_batchs_old_logprobs(monkeypatch):
    """With old log-probs, r = exp(logp - old) = e^E and d(-A r)/d logp = -A r (no token clipped: |E| < 0.18);
    micro-batches of 2 rows read their own rows of old_logp."""
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "optim.micro_batch_size": 2})
    out = tr.update(make_batch(old_logp=THETA - E))
    r = torch.exp(E)
    torch.testing.assert_close(grads[0], M * -ADV[:, None] * r / 8, rtol=1e-6, atol=1e-7)
    # the step's mean over its 8 real tokens, the micro-batches (5 and 3 tokens) pooled: not their means weighted by
    # rows, 0.5 (sum / 5 + sum / 3), which changed with the micro-batch size
    assert out["policy/ratio_mean"] == pytest.approx(float((r * M).sum() / 8), rel=1e-6)


def test_loss_kwargs_reach_the_policy_loss(monkeypatch):
    """eps_high = 0.05: tokens with A > 0 and r = e^E > 1.05 (E = 0.08, 0.06 is A < 0) take the clipped branch,
    gradient 0; the others -A r."""
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "algo.loss_kwargs": {"eps_high": 0.05}})
    tr.update(make_batch(old_logp=THETA - E))
    clipped = torch.tensor([[0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    want = torch.where(clipped, 0.0, M * -ADV[:, None] * torch.exp(E) / 8)
    torch.testing.assert_close(grads[0], want, rtol=1e-6, atol=1e-7)


def test_truncated_importance_weights_multiply_each_tokens_loss(monkeypatch):
    """Engine log-probs gen = old - F: each token's loss is weighted by min(e^F, 1.5), detached:
    d loss / d logp = -A r min(e^F, 1.5) / 8 (F = 0.5 and 0.7 hit the cap e^0.405 = 1.5)."""
    F = torch.tensor([[0.5, -0.3, 0.1], [0.7, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.2, 0.4, 0.0]])
    old = THETA - E
    tr, grads = make_trainer(monkeypatch, tis_cap=1.5, **{"algo.aggregation": "token-mean",
                                                           "optim.micro_batch_size": 2})
    out = tr.update(make_batch(gen_logp=old - F, old_logp=old))
    w = torch.minimum(torch.exp(F), torch.tensor(1.5))
    torch.testing.assert_close(grads[0], M * -ADV[:, None] * torch.exp(E) * w / 8, rtol=1e-6, atol=1e-7)
    assert out["rollout/logprob_diff_mean"] == pytest.approx(float((F.abs() * M).sum() / 8), rel=1e-6)
    assert out["rollout/logprob_diff_max"] == pytest.approx(1.0, rel=1e-6)


def test_mini_batches_epochs_and_inactive_rows(monkeypatch):
    """Active rows 0, 1, 2 in 2 mini-batches ([0, 1]: 5 tokens, [2]: 1 token) x 2 epochs = 4 optimizer steps, each
    normalised by its own mini-batch's tokens; row 3 never takes part, nor counts. KL k1 (beta 0.1) on top:
    d loss / d logp = -A r + beta."""
    beta = 0.1
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "optim.mini_batches": 2,
                                            "optim.ppo_epochs": 2, "algo.kl_coef": beta, "algo.kl_estimator": "k1"})
    out = tr.update(make_batch(old_logp=THETA - E, ref_logp=THETA + D, active=(True, True, True, False)))
    g = M * (-ADV[:, None] * torch.exp(E) + beta)
    first, second = torch.zeros(4, 3), torch.zeros(4, 3)
    first[:2], second[2] = g[:2] / 5, g[2] / 1
    assert len(grads) == 4 and out["policy/updates"] == 4 and out["policy/skipped_updates"] == 0
    for got, want in zip(grads, [first, second, first, second]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # logged values: means over the 4 updates of each update's value
    assert out["policy/grad_norm"] == pytest.approx((float(first.norm()) + float(second.norm())) / 2, rel=1e-6)
    tok_loss = M * (-ADV[:, None] * torch.exp(E) + beta * -D)  # k1 = logp - ref = -D
    assert out["policy/loss"] == pytest.approx(float(tok_loss[:2].sum() / 5 + tok_loss[2].sum()) / 2, rel=1e-6)
    assert out["policy/kl"] == pytest.approx(float((-D * M)[:2].sum() / 5 + (-D * M)[2].sum()) / 2, rel=1e-6)
    ent = (ENTROPY * M)[:2].sum() / 5, (ENTROPY * M)[2].sum() / 1
    assert out["policy/entropy"] == pytest.approx(float(sum(ent)) / 2, rel=1e-6)
    diff = (E.abs() * M)[:3]  # gen_logp = theta, old = theta - E, over the active rows' 6 tokens
    assert out["rollout/logprob_diff_mean"] == pytest.approx(float(diff.sum() / 6), rel=1e-6)
    assert out["rollout/logprob_diff_max"] == pytest.approx(0.1, rel=1e-6)  # row 3's 0.09 would not change it


def test_no_active_row_makes_no_update(monkeypatch):
    """Every group filtered (DAPO): no step, no loss, and the mismatch metric has no token (NaN, max 0)."""
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean"})
    out = tr.update(make_batch(active=(False, False, False, False)))
    assert grads == [] and out["policy/updates"] == 0 and out["policy/skipped_updates"] == 0
    assert "policy/loss" not in out and "policy/grad_norm" not in out
    assert math.isnan(out["rollout/logprob_diff_mean"]) and out["rollout/logprob_diff_max"] == 0.0


def test_mismatch_over_one_token(monkeypatch):
    """Only row 2 (one token) takes part: the mismatch metric is that token's |old - engine| = 0.03."""
    tr, _ = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean"})
    out = tr.update(make_batch(gen_logp=THETA + E, active=(False, False, True, False)))
    assert out["rollout/logprob_diff_mean"] == pytest.approx(0.03, rel=1e-6) and out["policy/updates"] == 1


def test_the_losss_extra_inputs_are_the_micro_batchs_rows(monkeypatch):
    """C2GSPG reads rewards [N]: each micro-batch's loss gets its own rows of them and of the advantages, in the
    log-probs' dtype, with the configured loss_kwargs."""
    seen, real = [], loop.policy_loss

    def spy(name, logp, old, adv, mask, **kw):
        seen.append((name, kw["rewards"], kw["lam"], adv.clone()))
        return real(name, logp, old, adv, mask, **kw)

    tr, _ = make_trainer(monkeypatch, **{"algo.name": "c2gspg", "optim.micro_batch_size": 2,
                                         "algo.loss_kwargs": {"lam": 0.5}})
    monkeypatch.setattr(loop, "policy_loss", spy)
    batch = make_batch()
    batch.loss_inputs = {"rewards": torch.tensor([1, 0, 0, 1], dtype=torch.int64)}
    batch.advantages = batch.advantages.double()  # the advantages too reach the loss in the log-probs' dtype
    tr.update(batch)
    assert [(n, r.tolist(), r.dtype, lam) for n, r, lam, _ in seen] == [
        ("c2gspg", [1.0, 0.0], torch.float32, 0.5), ("c2gspg", [0.0, 1.0], torch.float32, 0.5)]
    assert [(a.tolist(), a.dtype) for *_, a in seen] == [([1.0, -0.5], torch.float32), ([2.0, -1.5], torch.float32)]


def test_on_policy_old_logprobs_are_the_forwards_own(monkeypatch):
    """Without old log-probs the ratio is 1 (old = the training forward's detached log-probs) and the mismatch
    metric compares those with the engine's: gen = theta + E."""
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "optim.micro_batch_size": 2})
    out = tr.update(make_batch(gen_logp=THETA + E))
    torch.testing.assert_close(grads[0], M * -ADV[:, None] / 8, rtol=1e-6, atol=1e-7)
    assert out["policy/ratio_mean"] == pytest.approx(1.0, rel=1e-7)
    assert out["rollout/logprob_diff_mean"] == pytest.approx(float((E.abs() * M).sum() / 8), rel=1e-6)
    assert out["rollout/logprob_diff_max"] == pytest.approx(0.1, rel=1e-6)


def test_gradient_clip_bounds_the_step_and_logs_the_norm_before_clipping(monkeypatch):
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "optim.max_grad_norm": 0.05})
    out = tr.update(make_batch())
    g = M * -ADV[:, None] / 8  # norm sqrt(3 * 1 + 2 * 0.25 + 4 + 2 * 2.25) / 8 = sqrt(12) / 8 = 0.433
    assert out["policy/grad_norm"] == pytest.approx(math.sqrt(12) / 8, rel=1e-6)
    torch.testing.assert_close(grads[0], g * 0.05 / float(g.norm()), rtol=1e-5, atol=1e-7)


def test_a_non_finite_gradient_skips_the_step_and_is_counted(monkeypatch):
    """NaN advantages in the second mini-batch only: its step is skipped (and its norm not logged), the first's
    goes on: 1 update, 1 skipped, grad_norm the first step's."""
    tr, grads = make_trainer(monkeypatch, **{"algo.aggregation": "token-mean", "optim.mini_batches": 2})
    batch = make_batch(old_logp=THETA.clone())
    batch.advantages[2:] = float("nan")
    out = tr.update(batch)
    assert len(grads) == 1 and out["policy/updates"] == 1 and out["policy/skipped_updates"] == 1
    first = M[:2] * -ADV[:2, None] / 5
    torch.testing.assert_close(grads[0][:2], first, rtol=1e-6, atol=1e-7)
    assert out["policy/grad_norm"] == pytest.approx(float(first.norm()), rel=1e-6)
    assert out["policy/lr"] == 0.0
    batch.advantages[:] = float("nan")  # both mini-batches: two skipped, none logged
    out = tr.update(batch)
    assert len(grads) == 1 and out["policy/updates"] == 0 and out["policy/skipped_updates"] == 2
    assert "policy/grad_norm" not in out
