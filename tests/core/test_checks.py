"""The argument checks of ``capo.core.checks`` at their boundaries: what passes unchanged, what is refused, with which
error and message (mutation testing: the ``core.checks`` survivors, docs/testing.md "Mutation testing")."""

import math

import numpy as np
import pytest
import torch

from capo.core import checks


def test_tensor_passes_the_same_object_and_checks_ndim_and_dtype():
    x = torch.zeros(2, 3)
    assert checks.tensor("x", x) is x and checks.tensor("x", x, ndim=2, floating=True) is x
    assert checks.tensor("i", torch.zeros(2, dtype=torch.long), ndim=1) is not None  # integers fine unless floating
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, got list$"):
        checks.tensor("x", [1.0])
    with pytest.raises(ValueError, match=r"^x must have 1 dimension\(s\), got shape \(2, 3\)$"):
        checks.tensor("x", x, ndim=1)
    with pytest.raises(ValueError, match=r"^x must have 0 dimension\(s\), got shape \(2, 3\)$"):
        checks.tensor("x", x, ndim=0)
    with pytest.raises(TypeError, match=r"^i must have a floating dtype .* got torch.int64$"):
        checks.tensor("i", torch.zeros(2, dtype=torch.long), ndim=1, floating=True)
    with pytest.raises(TypeError, match=r"^b must have a floating dtype"):
        checks.tensor("b", torch.zeros(2, dtype=torch.bool), floating=True)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        checks.tensor("f", torch.zeros(2, dtype=dt), ndim=1, floating=True)


def test_same_shape_names_the_first_mismatch_against_the_first_tensor():
    a, b, c = torch.zeros(2), torch.zeros(2), torch.zeros(3)
    checks.same_shape(a=a, b=b)
    checks.same_shape(a=a)
    with pytest.raises(ValueError, match=r"^c has shape \(3,\) but a has shape \(2,\); they must match$"):
        checks.same_shape(a=a, b=b, c=c)
    with pytest.raises(ValueError, match=r"^b has shape \(2,\) but c has shape \(3,\)"):
        checks.same_shape(c=c, b=b, a=a)


def test_group_size():
    assert checks.group_size(6, 3) == 3 and checks.group_size(6, 1) == 1 and checks.group_size(6, 6) == 6
    assert checks.group_size(6, 2, min_size=2) == 2
    with pytest.raises(ValueError, match=r"^group_size must be >= 2, got 1$"):
        checks.group_size(6, 1, min_size=2)
    with pytest.raises(ValueError, match=r"^group_size must be >= 1, got 0$"):
        checks.group_size(6, 0)
    with pytest.raises(ValueError, match=r"^group_size=4 does not divide the number of responses N=6"):
        checks.group_size(6, 4)
    with pytest.raises(ValueError, match=r"^group_size=5 does not divide"):  # 6 % 5 == 1
        checks.group_size(6, 5)
    for bad, name in ((True, "bool"), (2.0, "float"), ("2", "str")):
        with pytest.raises(TypeError, match=rf"^group_size must be an int, got {name}$"):
            checks.group_size(6, bad)


def test_positive_and_non_negative():
    assert checks.positive("p", 1) == 1.0 and isinstance(checks.positive("p", 1), float)
    assert checks.positive("p", 0.5) == 0.5 and checks.positive("p", 1e-300) == 1e-300
    assert checks.non_negative("n", 0) == 0.0 and isinstance(checks.non_negative("n", 0), float)
    assert checks.non_negative("n", 0.5) == 0.5
    for bad in (0, 0.0, -1, math.nan, "1", None):
        with pytest.raises(ValueError, match=r"^p must be > 0, got "):
            checks.positive("p", bad)
    for bad in (-1e-9, -1, math.nan, "0", None):
        with pytest.raises(ValueError, match=r"^n must be >= 0, got "):
            checks.non_negative("n", bad)


def test_did_you_mean_and_choice():
    assert checks.did_you_mean("grop", ["grpo", "rloo"]) == " (did you mean 'grpo'?)"
    assert checks.did_you_mean("zzzz", ["grpo", "rloo"]) == ""
    assert checks.did_you_mean("abcdef", ["abcxyz"]) == ""  # similarity 0.5 < 0.6
    assert checks.did_you_mean("abcde", ["abcxy"]) == " (did you mean 'abcxy'?)"  # similarity 0.6: enough
    assert checks.did_you_mean(1, [10, 2]) == " (did you mean '10'?)"
    assert checks.choice("mode", "a", ("a", "b")) == "a"
    assert checks.choice("mode", "b", iter(["a", "b"])) == "b"  # any iterable, read once
    with pytest.raises(ValueError, match=r"^mode='c' is not allowed; allowed values: 'a', 'b'$"):
        checks.choice("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"^mode='grop' is not allowed \(did you mean 'grpo'\?\); allowed values: "
                                         r"'grpo', 'rloo'$"):
        checks.choice("mode", "grop", iter(["grpo", "rloo"]))


def test_array1d_accepts_tensors_arrays_lists_and_names_the_rest():
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    out = checks.array1d("x", t)
    assert not out.requires_grad and out.tolist() == [1.0, 2.0]
    assert checks.array1d("x", np.array([1, 2])).tolist() == [1, 2]
    assert checks.array1d("x", [0.5, 1.5]).dtype == torch.float64
    assert checks.array1d("x", (True, False)).dtype == torch.bool
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, numpy array or list, got dict$"):
        checks.array1d("x", {})
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor, numpy array or list, got int$"):
        checks.array1d("x", 3)
    with pytest.raises(TypeError, match=r"^x must hold numbers"):
        checks.array1d("x", [[1], [2, 3]])
    with pytest.raises(TypeError, match=r"^x must be real, got dtype torch.complex64$"):
        checks.array1d("x", torch.tensor([1 + 2j], dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^x must have 1 dimension\(s\), got shape \(1, 2\)$"):
        checks.array1d("x", [[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"^x must have 1 dimension\(s\), got shape \(\)$"):
        checks.array1d("x", torch.tensor(1.0))


def test_nonempty():
    checks.nonempty("x", torch.zeros(1))
    with pytest.raises(ValueError, match=r"^x is empty \(N = 0\)"):
        checks.nonempty("x", torch.zeros(0))


def test_scores():
    s = checks.scores("s", [1, -2, float("inf")])
    assert s.dtype == torch.float64 and s.tolist() == [1.0, -2.0, math.inf]
    assert checks.scores("s", torch.tensor([0.5], dtype=torch.float16)).dtype == torch.float64
    with pytest.raises(TypeError, match=r"^s must be a real-valued score, got a bool tensor$"):
        checks.scores("s", [True, False])
    with pytest.raises(ValueError, match=r"^s contains NaN \(first at index 1\)"):
        checks.scores("s", [0.0, math.nan, 1.0, math.nan])
    assert math.isnan(checks.scores("s", [0.0, math.nan], allow_nan=True)[1])


def test_probs():
    p, src = checks.probs("p", torch.tensor([0.0, 0.5, 1.0], dtype=torch.float32))
    assert p.dtype == torch.float64 and p.tolist() == [0.0, 0.5, 1.0] and src == torch.float32
    assert checks.probs("p", [0, 1])[1] == torch.float64  # integer input: float64 precision
    assert checks.probs("p", torch.tensor([0.25], dtype=torch.float16))[1] == torch.float16
    with pytest.raises(TypeError, match=r"^p must be a probability in \[0, 1\], got a bool tensor$"):
        checks.probs("p", [True])
    with pytest.raises(ValueError, match=r"^p must lie in \[0, 1\], got 1\.5 at index 2$"):
        checks.probs("p", [0.0, 1.0, 1.5, -1.0])
    with pytest.raises(ValueError, match=r"^p must lie in \[0, 1\], got -0\.1 at index 1$"):
        checks.probs("p", [0.0, -0.1, 2.0])
    with pytest.raises(ValueError, match=r"^p contains NaN"):
        checks.probs("p", [0.5, math.nan])
    assert math.isnan(checks.probs("p", [0.5, math.nan], allow_nan=True)[0][1])


def test_labels_and_group_ids():
    b = torch.tensor([True, False])
    assert checks.labels("c", b) is not None and checks.labels("c", b).tolist() == [True, False]
    out = checks.labels("c", [1, 0, 1.0, 0.0])
    assert out.dtype == torch.bool and out.tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match=r"^c must contain only 0/1 or True/False, got 2 at index 2$"):
        checks.labels("c", [1, 0, 2, -1])
    with pytest.raises(ValueError, match=r"^c must contain only 0/1 or True/False, got 0\.5 at index 0$"):
        checks.labels("c", [0.5])
    g = checks.group_ids_1d("g", np.array([3, 1], dtype=np.int32))
    assert g.dtype == torch.int64 and g.tolist() == [3, 1]
    with pytest.raises(TypeError, match=r"^g must have an integer dtype \(arbitrary question labels\), got torch.bool"):
        checks.group_ids_1d("g", [True, False])
    with pytest.raises(TypeError, match=r"^g must have an integer dtype .* got torch.float64$"):
        checks.group_ids_1d("g", [1.0, 2.0])


def test_probs_labels_and_group_ids_name_a_non_array():
    with pytest.raises(TypeError, match=r"^p must be a torch.Tensor, numpy array or list, got dict$"):
        checks.probs("p", {})
    with pytest.raises(ValueError, match=r"^c must have 1 dimension"):
        checks.labels("c", [[1, 0]])
    with pytest.raises(TypeError, match=r"^g must be a torch.Tensor, numpy array or list, got int$"):
        checks.group_ids_1d("g", 3)


def test_is_int_and_is_real_refuse_bools_and_what_is_not_a_number():
    """The one definition of "an integer" and "a number" that every bad-input check starts from (capo.errors):
    True is a Python int but never a count or a value here."""
    for v in (0, -3, 10**20, np.int64(2).item()):
        assert checks.is_int(v) and checks.is_real(v)
    for v in (0.5, -1e300, math.inf, math.nan):
        assert checks.is_real(v) and not checks.is_int(v)
    for v in (True, False, None, "1", [1], 1j):
        assert not checks.is_int(v) and not checks.is_real(v)
    for name, v in (("positive", True), ("non_negative", False)):  # were accepted as 1.0 / 0.0
        with pytest.raises(ValueError, match=r"^x must be >"):
            getattr(checks, name)("x", v)
