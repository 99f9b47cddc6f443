"""Bad inputs to the advantage estimators, masks, rewards and scores are refused with an error that names the
argument and the problem (mutation testing: the input checks of these functions had no test)."""

import pytest
import torch

from capo.core.advantage_variants import semantic_entropy
from capo.core.advantages import capo_advantage, grpo_advantage
from capo.core.dapo import informative_groups
from capo.core.rewards import rlcr_components, rlcr_reward
from capo.core.scores import sequence_logprob_mean, sequence_logprob_sum

f64 = dict(dtype=torch.float64)
R = torch.tensor([1.0, 0.0, 1.0, 0.0], **f64)
S = torch.tensor([-0.1, -0.2, -0.3, -0.4], **f64)
C = torch.tensor([True, False, True, False])
Q = torch.tensor([0.9, 0.2, 0.5, 0.1])
LP, M = torch.zeros(2, 3, **f64), torch.ones(2, 3, dtype=torch.bool)

CASES = [
    (lambda: grpo_advantage(R[None], 2), ValueError, r"^rewards must have 1 dimension"),
    (lambda: grpo_advantage(torch.tensor([1, 0]), 2), TypeError, r"^rewards must have a floating dtype"),
    (lambda: grpo_advantage(R, 1), ValueError, r"group_size"),
    (lambda: capo_advantage(R, 2, scores=S[None]), ValueError, r"^scores must have 1 dimension"),
    (lambda: capo_advantage(R, 2, scores=torch.tensor([1, 2, 3, 4])), TypeError, r"^scores must have a floating"),
    (lambda: capo_advantage(R, 2, scores=S[:2]), ValueError, r"^scores has shape \(2,\) but rewards has shape \(4,\)"),
    (lambda: capo_advantage(R, 2, scores=S, keep=C[None]), ValueError, r"^keep must have 1 dimension"),
    (lambda: capo_advantage(R, 2, scores=S, keep=C[:2]), ValueError, r"^keep has shape \(2,\) but rewards"),
    (lambda: capo_advantage(R, 2, scores=S, correct=C[None]), ValueError, r"^correct must have 1 dimension"),
    (lambda: capo_advantage(R, 2, scores=S, correct=C[:2]), ValueError, r"^correct has shape \(2,\) but rewards"),
    (lambda: capo_advantage(R, 2, scores=S, partners=C[None]), ValueError, r"^partners must have 1 dimension"),
    (lambda: capo_advantage(R, 2, scores=S, partners=C.long()), TypeError, r"^partners must be a bool tensor"),
    (lambda: capo_advantage(R, 2, scores=S, partners=C[:2]), ValueError, r"^partners has shape \(2,\) but rewards"),
    (lambda: informative_groups(R[None], 2), ValueError, r"^values must have 1 dimension"),
    (lambda: informative_groups(torch.tensor([1, 0]), 2), TypeError, r"^values must have a floating dtype"),
    (lambda: informative_groups(R, 1), ValueError, r"group_size"),
    (lambda: semantic_entropy(torch.tensor([0, 1, 0, 1]), 1), ValueError, r"group_size"),
    (lambda: semantic_entropy(torch.tensor([0, 1]), 2, estimator="x"), ValueError, r"^estimator"),
    (lambda: semantic_entropy(torch.tensor([0, 1]), 2, unanswered="x"), ValueError, r"^unanswered"),
    (lambda: rlcr_reward(C[None], confidence=Q), ValueError, r"^correct must have 1 dimension"),
    (lambda: rlcr_reward(C, confidence=Q[None]), ValueError, r"^confidence must have 1 dimension"),
    (lambda: rlcr_reward(C, confidence=torch.tensor([1, 0, 1, 0])), TypeError, r"^confidence must have a floating"),
    (lambda: rlcr_reward(C, confidence=Q[:2]), ValueError, r"^confidence has shape \(2,\) but correct"),
    (lambda: rlcr_reward(C, confidence=Q, format_ok=C[None]), ValueError, r"^format_ok must have 1 dimension"),
    (lambda: rlcr_reward(C, confidence=Q, format_ok=C[:2]), ValueError, r"^format_ok has shape \(2,\) but correct"),
    (lambda: rlcr_components(C, confidence=None), ValueError, r"the rlcr reward needs confidence"),
    (lambda: sequence_logprob_mean(LP[0], M), ValueError, r"^token_logp must have 2 dimension"),
    (lambda: sequence_logprob_mean(LP.long(), M), TypeError, r"^token_logp must have a floating"),
    (lambda: sequence_logprob_mean(LP, M[0]), ValueError, r"^mask must have 2 dimension"),
    (lambda: sequence_logprob_sum(LP, M[:1]), ValueError, r"^mask has shape \(1, 3\) but token_logp"),
]


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bad_input_names_the_argument(i):
    fn, err, match = CASES[i]
    with pytest.raises(err, match=match):
        fn()


def test_masked_partners_are_intersected_with_existing_rows():
    # CAPO with the noise mask dropping partners: a pair needs both rows kept AND existing. Row 1 (wrong) is masked,
    # row 3 (wrong) does not exist: prompt 0 has no pair, prompt 1 has none either -> all zero advantages.
    keep = torch.tensor([True, False, True, True])
    partners = torch.tensor([True, True, True, False])
    adv = capo_advantage(R, 2, scores=S, keep=keep, partners=partners, masked_partners="drop")
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    # with every row existing, prompt 1's pair (rows 2, 3) is back
    adv = capo_advantage(R, 2, scores=S, keep=keep, partners=torch.ones(4, dtype=torch.bool), masked_partners="drop")
    assert adv[2] > 0 > adv[3] and adv[:2].tolist() == [0.0, 0.0]


def test_knob_boundaries_are_allowed():
    from capo.core import capo_noise_mask, mask_knob_problem

    assert mask_knob_problem(1.0, 1.0, 0.0, 1.0) is None  # low == high, q_low = 0, q_high = 1
    ppl = torch.tensor([1.5, 2.0, 2.5], **f64)
    keep = capo_noise_mask(ppl, torch.tensor([True, False, False]), low=2.0, high=2.0)
    assert keep.tolist() == [True, True, True]  # right and PPL <= 2; wrong and PPL >= 2


def test_cluster_ids_must_be_integers_and_rlcr_is_float32():
    from capo.core.advantage_variants import seed_grpo_advantage

    for bad in (C, torch.tensor([0.0, 1.0, 0.0, 1.0])):  # bool and floating ids are refused
        with pytest.raises(TypeError, match="cluster_ids must have an integer dtype"):
            seed_grpo_advantage(R, 2, cluster_ids=bad)
    # RLCR's reward and components are float32 whatever the confidence's precision
    assert rlcr_reward(C, confidence=Q.double()).dtype == torch.float32
    assert rlcr_components(C, confidence=Q.double()).dtype == torch.float32
