"""Inputs, names in error messages, edges and devices of the voting and confidence functions that the hand cases
left open (mutation testing: the ``core.voting`` survivors, docs/testing.md "Mutation testing").

Error messages are matched from their start (``^name ...``), so a check that names the wrong argument fails.
"""

import math

import pytest
import torch

from _device import assert_same_on_the_meta_default_device  # tests/ is on sys.path (its conftest.py)
from capo.core import voting as vt
from capo.core.confidence import ConfidenceInputs, compute_confidence, token_statistics, topk_confidence

F64, I64 = torch.float64, torch.int64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


A, C, G = t([0, 1, 0, -1], I64), t([1, 0, 1, 0], torch.bool), t([3, 3, 3, 3], I64)
BAD_INPUTS = [
    (lambda: vt.mean_at_k(t([1, 2]), t([0, 0], I64)), ValueError, r"^correct must contain only 0/1"),
    (lambda: vt.mean_at_k(t([1, 0]), t([0.0, 0.0])), TypeError, r"^group_ids must have an integer dtype"),
    (lambda: vt.mean_at_k(t([], torch.bool), t([], I64)), ValueError, r"^correct is empty"),
    (lambda: vt.pass_at_k(4, 1.0, 1), TypeError, r"^c must be an int"),
    (lambda: vt.pass_at_k(4, 1, True), TypeError, r"^k must be an int >= 1, got bool"),
    (lambda: vt.pass_at_k_batch("4", t([1], I64), 1), TypeError, r"^n must be a torch.Tensor"),
    (lambda: vt.pass_at_k_batch(t([4], I64), "1", 1), TypeError, r"^c must be a torch.Tensor"),
    (lambda: vt.pass_at_k_batch(t([4], I64), t([1.0]), 1), TypeError, r"^c must have an integer dtype"),
    (lambda: vt.pass_at_k_batch(t([4, 4], I64), t([1], I64), 1), ValueError,
     r"^c has shape \(1,\) but n has shape \(2,\)"),
    (lambda: vt.pass_at_k_batch(t([4, 0], I64), t([1, 0], I64), 1), ValueError,
     r"^n must be >= 1; question 1 has n=0, c=0"),
    (lambda: vt.pass_at_k_batch(t([4, 2], I64), t([1, 3], I64), 1), ValueError,
     r"^c must be in \[0, n\]; question 1 has n=2, c=3"),
    (lambda: vt.max_confidence(A, C, G, t([True, False, True, True], torch.bool)), TypeError,
     r"^confidence must be a real-valued score"),
    (lambda: token_statistics([0.0, 1.0]), TypeError, r"^logits must be a torch.Tensor"),
    (lambda: token_statistics(t([0, 1], I64)), TypeError, r"^logits must have a floating dtype"),
    (lambda: token_statistics(t([0.0, 1.0]), True), ValueError, r"^top_k must be an int in \[1, V=2\], got True"),
    (lambda: topk_confidence([-1.0]), TypeError, r"^top_logp must be a torch.Tensor"),
    (lambda: topk_confidence(t([-1, -2], I64)), TypeError, r"^top_logp must have a floating dtype"),
    (lambda: topk_confidence(t(-1.0)), ValueError, r"^top_logp must have a non-empty last"),
    (lambda: topk_confidence(torch.zeros(2, 0, dtype=F64)), ValueError, r"^top_logp must have a non-empty last"),
    (lambda: compute_confidence("lpm", ConfidenceInputs(token_logp=t([-1.0]), mask=t([[1]], I64))), ValueError,
     r"^token_logp must have 2 dimension"),
    (lambda: compute_confidence("lpm", ConfidenceInputs(token_logp=t([[-1]], I64), mask=t([[1]], I64))), TypeError,
     r"^token_logp must have a floating dtype"),
    (lambda: compute_confidence("lpm", ConfidenceInputs(token_logp=t([[-1.0]]), mask=t([1], I64))), ValueError,
     r"^mask must have 2 dimension"),
    (lambda: compute_confidence("lpm", ConfidenceInputs(token_logp=t([[-1.0]]), mask=[[1]])), TypeError,
     r"^mask must be a torch.Tensor"),
    (lambda: compute_confidence("tail", ConfidenceInputs(topk_conf=t([[1.0]]), mask=t([[1]], I64)), k=True),
     ValueError, r"^k must be an int >= 1, got True"),
    (lambda: compute_confidence("bottom_group", ConfidenceInputs(topk_conf=t([[1.0]]), mask=t([[1]], I64)),
                                fraction=True), ValueError, r"^fraction must be a number in \[0, 1\], got True"),
]


@pytest.mark.parametrize("call, exc, match", BAD_INPUTS)
def test_bad_inputs_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_pass_at_k_batch_of_one_question_and_of_none():
    """One question: 1 - C(3, 2) / C(4, 2) = 1 - 3/6; no question: an empty float64 vector."""
    got = vt.pass_at_k_batch(t([4], I64), t([1], I64), 2)
    assert got.dtype == F64 and got.tolist() == [0.5]
    empty = vt.pass_at_k_batch(torch.zeros(0, dtype=I64), torch.zeros(0, dtype=I64), 3)
    assert empty.dtype == F64 and empty.shape == (0,)


def test_token_statistics_of_one_distribution():
    """A 1-D distribution p = (1/2, 1/4, 1/4): entropy 1.5 ln 2, KL(U || p) = -ln 3 + (ln 2 + 2 ln 4) / 3, the top 2
    log-probs' negated mean (ln 2 + ln 4) / 2; each a 0-d tensor."""
    st = token_statistics(torch.log(t([0.5, 0.25, 0.25])), 2)
    ln2 = math.log(2)
    assert st.entropy.shape == () and st.entropy.item() == pytest.approx(1.5 * ln2, abs=1e-12)
    assert st.kl_uniform.item() == pytest.approx(-math.log(3) + 5 * ln2 / 3, abs=1e-12)
    assert st.topk_conf.item() == pytest.approx(1.5 * ln2, abs=1e-12)
    assert topk_confidence(t([-1.0, -3.0])).item() == 2.0  # [k] -> 0-d


def test_token_statistics_normalized_reads_the_values_as_log_probs():
    """normalized=True skips the log_softmax: values (0, 0) are read as log p = 0 for both tokens (entropy 0,
    KL -ln 2), not normalised to (1/2, 1/2) (entropy ln 2, KL 0)."""
    st = token_statistics(t([0.0, 0.0]), 1, normalized=True)
    assert st.entropy.item() == 0.0 and st.kl_uniform.item() == pytest.approx(-math.log(2), abs=1e-15)
    st = token_statistics(t([0.0, 0.0]), 1)
    assert st.entropy.item() == pytest.approx(math.log(2), abs=1e-15) and st.kl_uniform.item() == 0.0


def test_float32_tokens_give_float64_estimates_and_one_token_rows_work():
    """float32 log-probs are widened before summing (every estimator returns float64); T = 1 works."""
    x = ConfidenceInputs(token_logp=t([[-0.1, -0.2], [-0.3, 0.0]], torch.float32), mask=t([[1, 1], [1, 0]], I64))
    got = compute_confidence("lpm", x)
    want = [(float(torch.tensor(-0.1, dtype=torch.float32)) + float(torch.tensor(-0.2, dtype=torch.float32))) / 2,
            float(torch.tensor(-0.3, dtype=torch.float32))]
    assert got.dtype == F64 and got.tolist() == want
    one = compute_confidence("lpm", ConfidenceInputs(token_logp=t([[-0.5], [-2.0]]), mask=t([[1], [0]], I64)))
    assert one[0].item() == -0.5 and math.isnan(one[1].item())


# seven responses of two questions (labels 3, 8), one without an answer; in both, every rule picks an answer whose
# first response is not the question's first row (answer 0, then 2), so a vote whose scores were lost (all tied
# at 0: first occurrence) picks another
VA, VC, VG = t([1, 0, 0, -1, 5, 2, 2], I64), t([0, 1, 1, 0, 0, 1, 1], torch.bool), t([3, 3, 3, 3, 8, 8, 8], I64)
VS = t([0.2, 0.9, 0.5, math.nan, 0.3, 0.8, 0.8])
VL, VP = t([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7]), t([0, 1, 2, 3, 0, 1, 2], I64)
VN, VK = t([4, 6], I64), t([1, 3], I64)
TL, TM = t([[-0.1, -0.2, -0.3, -0.4], [-1.0, -2.0, 0.0, 0.0]]), t([[1, 1, 1, 1], [1, 1, 0, 0]], I64)
VX = ConfidenceInputs(token_logp=TL, mask=TM, entropy=-TL, kl_uniform=-TL, topk_conf=-TL, verbal=t([0.5, math.nan]),
                      answer_ids=VA[:2], group_ids=VG[:2])
LOGP = torch.log(t([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))


def _device_cases() -> dict:
    """Every voter and estimator on the CPU tensors above (made at import: a tensor made here would take the default
    device); tensors come back as (device type, values)."""
    dv = lambda x: (x.device.type, x.tolist())  # noqa: E731
    vote = lambda v: [dv(v.chosen_answer), dv(v.chosen_index), dv(v.correct), v.accuracy, dv(v.group_labels)]  # noqa
    stats = lambda s: [dv(s.entropy), dv(s.kl_uniform), dv(s.topk_conf)]  # noqa: E731
    out = {
        "mean_at_k": vt.mean_at_k(VC, VG), "mean_pass_at_k": vt.mean_pass_at_k(VC, VG, 2),
        "pass_at_k_batch": dv(vt.pass_at_k_batch(VN, VK, 2)), "pass_at_k_batch_empty": dv(vt.pass_at_k_batch(
            VN[:0], VK[:0], 2)),
        "majority": vote(vt.majority_vote(VA, VC, VG)),
        "perplexity_consistency": vote(vt.perplexity_consistency(VA, VC, VG, VL, path_ids=VP)),
        "weighted": vote(vt.weighted_vote(VA, VC, VG, VS)), "conf_weighted": vote(vt.confidence_weighted_vote(
            VA, VC, VG, VS)),
        "filtered": vote(vt.filtered_vote(VA, VC, VG, VS, 0.5)),
        "filtered_weighted": vote(vt.filtered_vote(VA, VC, VG, VS, 0.5, weighted=True)),
        "max_confidence": vote(vt.max_confidence(VA, VC, VG, VS)),
        "token_statistics": stats(token_statistics(LOGP, 2)),
        "token_statistics_normalized": stats(token_statistics(LOGP, 2, normalized=True)),
        "topk_confidence": dv(topk_confidence(LOGP)),
    }
    for name in ("lpm", "sum_logprob", "min_token_prob", "neg_entropy", "self_certainty", "verbal", "consistency"):
        out[name] = dv(compute_confidence(name, VX))
    for name, kw in (("tail", dict(k=2)), ("bottom_group", dict(window=2, fraction=0.5)),
                     ("lowest_group", dict(window=2))):
        for token in ("topk", "logp", "neg_entropy"):
            out[f"{name}/{token}"] = dv(compute_confidence(name, VX, token=token, **kw))
    return out


def test_voters_and_estimators_compute_on_the_inputs_device_not_the_default_one():
    """CPU inputs with torch's default device set to meta give the same values, on the CPU."""
    votes = _device_cases()
    for key in ("majority", "perplexity_consistency", "weighted", "conf_weighted", "filtered", "filtered_weighted",
                "max_confidence"):
        assert votes[key][0] == ("cpu", [0, 2]) and votes[key][3] == 1.0, key
    assert_same_on_the_meta_default_device(_device_cases)


def test_perplexity_consistency_path_ids_of_three_questions():
    """Path id 0 and 1 in three questions are five paths: question 2's path 0 (p 0.9, answer 5) is not question 0's
    path 1 (whatever key arithmetic would merge them). Hand result: q0 answer 1 (0.3 > 0.2), q1 answer 0, q2 5."""
    r = vt.perplexity_consistency(t([0, 1, 0, 5, 6], I64), t([1, 0, 1, 1, 0], torch.bool), t([0, 0, 1, 2, 2], I64),
                                  torch.log(t([0.2, 0.3, 0.6, 0.9, 0.5])), path_ids=t([0, 1, 0, 0, 1], I64))
    assert r.chosen_answer.tolist() == [1, 0, 5] and r.chosen_index.tolist() == [1, 2, 3]
    assert r.correct.tolist() == [False, True, True]


@pytest.mark.parametrize("path_ids, exc, match", [
    (t([0.0, 1.0, 0.0, 1.0]), TypeError, r"^path_ids must have an integer dtype"),
    (t([0, 1, 0], I64), ValueError, r"^path_ids has shape \(3,\) but answer_ids has shape \(4,\)"),
    (t([0, 1, 0, 1], I64), ValueError, r"^path_ids marks identical responses, which must share one answer id; the "
                                       r"path of row 1 \(path_ids=1\) has answer ids 2 and 3$"),
])
def test_perplexity_consistency_bad_path_ids(path_ids, exc, match):
    """Rows 0 and 2 share path 0 and answer 4 (fine); rows 1 and 3 share path 1 with answers 2 and 3: named."""
    with pytest.raises(exc, match=match):
        vt.perplexity_consistency(t([4, 2, 4, 3], I64), t([1, 0, 1, 0], I64), t([7, 7, 7, 7], I64),
                                  t([-0.1, -0.2, -0.3, -0.4]), path_ids=path_ids)


I32 = torch.int32
VOTERS = {
    "majority": lambda a, c, g, s: vt.majority_vote(a, c, g),
    "weighted": vt.weighted_vote,
    "confidence_weighted": vt.confidence_weighted_vote,
    "filtered": vt.filtered_vote,
    "max_confidence": vt.max_confidence,
    "perplexity_consistency": lambda a, c, g, s: vt.perplexity_consistency(a, c, g, s - 1),
}
Q4 = t([0.2, 0.9, 0.5, 0.4])  # a score in [0, 1] for four responses (minus 1: log-probs for PC)


@pytest.mark.parametrize("voter", VOTERS)
@pytest.mark.parametrize("a, c, g, match", [
    ("0 1", C, G, r"^answer_ids must be a torch.Tensor"),
    (A, C, t([3.0, 3.0, 3.0, 3.0]), r"^group_ids must have an integer dtype"),
    (A[:3], C, G, r"^correct has shape \(4,\) but answer_ids has shape \(3,\); they must match"),
    (A, C[:3], G, r"^correct has shape \(3,\) but answer_ids has shape \(4,\); they must match"),
    (t([0, -1, -2, -3], I64), C, G, r"^answer_ids must be >= -1 \(-1 = no answer\), got -2 at index 2"),
])
def test_voters_name_bad_inputs(voter, a, c, g, match):
    with pytest.raises((TypeError, ValueError), match=match):
        VOTERS[voter](a, c, g, Q4)


@pytest.mark.parametrize("voter", VOTERS)
def test_voters_name_an_empty_input_and_return_int64_answers_for_int32_ids(voter):
    e = torch.zeros(0, dtype=I64)
    with pytest.raises(ValueError, match=r"^answer_ids is empty"):
        VOTERS[voter](e, e.bool(), e, e.to(F64))
    r = VOTERS[voter](A.to(I32), C, G.to(I32), Q4)  # answer 0 wins by every rule (rows 0, 2; row 1 has 0.9 alone)
    assert r.chosen_answer.dtype == I64 and r.group_labels.dtype == I64 and r.chosen_index.dtype == I64


@pytest.mark.parametrize("voter, name", [("weighted", "weights"), ("filtered", "confidence"),
                                         ("max_confidence", "confidence")])
def test_score_inputs_are_named(voter, name):
    with pytest.raises(TypeError, match=rf"^{name} must be a real-valued score"):
        VOTERS[voter](A, C, G, t([True, False, True, True], torch.bool))
    with pytest.raises(ValueError, match=rf"^{name} has shape \(3,\) but answer_ids has shape \(4,\)"):
        VOTERS[voter](A, C, G, Q4[:3])


def test_negative_weight_is_named_with_its_index():
    with pytest.raises(ValueError, match=r"^vote weights must be finite and >= 0, got -1.0 at index 1;"):
        vt.weighted_vote(A, C, G, t([0.5, -1.0, 0.2, 0.1]))
    with pytest.raises(ValueError, match=r"^vote weights must be finite and >= 0, got inf at index 2;"):
        vt.filtered_vote(A, C, G, t([0.5, 0.1, math.inf, 0.1]), 1.0, weighted=True)


def test_long_responses_with_holes_keep_their_token_order():
    """T = 200 (where torch's unstable CPU sort reorders ties): row 0's real tokens are the even positions holding
    0, 2, ..., 198, row 1's the first 150 holding 0..149. Tail of the last 3 real tokens: 196 and 148; the lowest
    window of 2 real tokens in a row: (0 + 2) / 2 and (0 + 1) / 2; bottom 10% of 99 / 149 windows of 2: the 9 / 14
    lowest, means (1 + 17) / 2 = 9 and (0.5 + 13.5) / 2 = 7."""
    v = torch.arange(200, dtype=F64).expand(2, 200)
    mask = torch.stack([torch.arange(200) % 2 == 0, torch.arange(200) < 150]).to(I64)
    x = ConfidenceInputs(token_logp=v, mask=mask)
    assert compute_confidence("tail", x, k=3, token="logp").tolist() == [196.0, 148.0]
    assert compute_confidence("lowest_group", x, window=2, token="logp").tolist() == [1.0, 0.5]
    assert compute_confidence("bottom_group", x, window=2, fraction=0.1, token="logp").tolist() == [9.0, 7.0]
