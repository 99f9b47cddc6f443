"""The calibration metrics compute on their inputs' device, never on torch's default device (the module's contract:
"computed in float64 on the inputs' device"), and the FFT convolution behind smooth ECE is a full linear
convolution (mutation testing: the ``core.calibration`` survivors, docs/testing.md "Mutation testing").

A machine without a GPU has one real device, so the test makes the *default* device differ from the inputs' one:
``torch.set_default_device("meta")`` while the inputs stay on the CPU. A tensor that the code allocates without
``device=`` (or with ``device=None``) then lands on the meta device, holds no values, and the computation fails
where it meets the CPU inputs or is read back; on a GPU the same mistake puts a CPU tensor next to CUDA inputs.
The bootstrap (``bootstrap_draws``, ``bootstrap_ci``, ``paired_difference``) resamples on the CPU by design, with a
CPU generator, and ``e_aurc`` / ``prr`` compute their perfect-ranking AURC on the CPU: each pins its device, so a
default device set to a GPU (or meta) changes nothing there either.
"""

import math

import numpy as np
import pytest
import torch

from _device import assert_same_on_the_meta_default_device  # tests/ is on sys.path (its conftest.py)
from capo.core import calibration as cal
from capo.tasks import stochastic

F64 = torch.float64
# six responses of three questions (labels 5, 7, 9; question 9 has one class only)
S = torch.tensor([0.9, 0.2, 0.6, 0.6, 0.3, 0.8], dtype=F64)
C = torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.bool)
G = torch.tensor([5, 5, 7, 7, 7, 9], dtype=torch.int64)
V = torch.tensor([0.5, math.nan, 1, 0, 0.25, 0.75], dtype=torch.float32)  # verbal confidences, one missing


def _metrics() -> dict:
    """Every metric that takes per-response inputs, on S, C, G, V (CPU tensors, made once at import: a tensor made
    here would take the default device); tensors come back as lists."""
    rel = lambda r: [r.bin_edges.tolist(), r.bin_confidence.tolist(), r.bin_accuracy.tolist(),  # noqa: E731
                     r.bin_count.tolist()]
    sel = cal.selective_curve(S, C)
    am = cal.auc_mean(S, C, G)
    return {
        "auroc": cal.auroc(S, C),
        "auc_mean": [am.value, am.per_group.tolist(), am.group_labels.tolist(), am.n_groups_used],
        "ece": cal.ece(S, C), "ece_quantile": cal.ece(S, C, n_bins=3, strategy="quantile"),
        "reliability": rel(cal.reliability_curve(S, C, n_bins=4)),
        "reliability_quantile": rel(cal.reliability_curve(S, C, n_bins=3, strategy="quantile")),
        "mce": cal.mce(S, C), "debiased_l2_ce": cal.debiased_l2_ce(S, C, n_bins=2),
        "smooth_ece": cal.smooth_ece(S, C, sigma=0.1), "brier": cal.brier(S, C),
        "selective": [sel.threshold.tolist(), sel.n_answered.tolist(), sel.coverage.tolist(),
                      sel.precision.tolist(), sel.risk.tolist()],
        "aurc": cal.aurc(S, C),
        "percentile_interval": cal.percentile_interval(S, 0.1),
        "summarize": cal.summarize(torch.log(S), C, G, verbal_conf=V),
        "stated_question_means": [t.tolist() for t in stochastic.stated_question_means(S, C, G, S / 2)],
        "stochastic_summary": stochastic.stochastic_summary(S, C, G, S / 2, chosen=C.to(F64)),
        "e_aurc": cal.e_aurc(S, C), "prr": cal.prr(S, C),
        "bootstrap_draws": cal.bootstrap_draws(3, 4, seed=1).tolist(),
        "bootstrap_ci": cal.bootstrap_ci(cal.brier, S, C, group_ids=G, n_boot=20, seed=2),
        "bootstrap_ci_groups": cal.bootstrap_ci(lambda s, c, g: cal.auc_mean(s, c, g).value, S, C, group_ids=G,
                                                n_boot=20, seed=3, pass_group_ids=True),
    }


def test_hand_values_of_the_device_case():
    """The case below, by hand: AUROC 8.5 / 9 (0.9 and 0.8 beat the three wrong, 0.6 beats two and ties one);
    per question AUC 1 (5), (1/2 + 1) / 2 (7), NaN (9: one class); Brier 0.7 / 6; AURC = mean of the selective
    risks 0, 0, (0 + 1/2) / 3 and 1/4 for the tied 0.6s, 2/5, 3/6."""
    m = _metrics()
    assert m["auroc"] == pytest.approx(8.5 / 9, abs=1e-15)
    assert m["auc_mean"][0] == pytest.approx(0.875, abs=1e-15)
    assert m["auc_mean"][1][:2] == pytest.approx([1.0, 0.75], abs=1e-15) and math.isnan(m["auc_mean"][1][2])
    assert m["brier"] == pytest.approx(0.7 / 6, abs=1e-15)
    assert m["aurc"] == pytest.approx((0 + 0 + 0.5 / 3 + 1 / 4 + 2 / 5 + 3 / 6) / 6, abs=1e-15)


def test_metrics_compute_on_the_inputs_device_not_the_default_one():
    """CPU inputs with the default device set to meta give exactly the values of the CPU default."""
    assert_same_on_the_meta_default_device(_metrics)


@pytest.mark.parametrize("na, nb", [(1, 1), (1, 4), (5, 5), (3, 6), (9, 8), (17, 16), (4, 29)])
def test_full_conv_is_the_full_linear_convolution(na, nb):
    """[A] * [B] -> [A + B - 1] equal to numpy's full convolution, also where A + B - 2 is a power of two (5 + 5,
    9 + 8, 17 + 16: an FFT size of A + B - 2 would wrap the last entry onto the first)."""
    rng = np.random.default_rng(na * 100 + nb)
    a, b = rng.integers(-9, 10, na).astype(float), rng.integers(-9, 10, nb).astype(float)
    got = cal._full_conv(torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64))
    assert got.dtype == F64 and got.shape == (na + nb - 1,)
    assert got.tolist() == pytest.approx(np.convolve(a, b).tolist(), abs=1e-9)
