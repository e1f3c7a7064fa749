"""The round-to-nearest quantizer and the realistic weight generators."""

import pytest
import torch

from oracle import LayoutError, quantize_rtn, random_weight
from oracle.quantize import WEIGHT_KINDS


@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group", [32, 128, -1], ids=["G32", "G128", "Gk"])
def test_error_is_at_most_half_a_step_inside_the_range(kind, symmetric, group):
    g = torch.Generator().manual_seed(0)
    w = random_weight(48, 512, kind, g)
    qw = quantize_rtn(w, group, symmetric, torch.float32)
    err = (qw.dequantize() - w.double()).abs()
    step = qw.scales.double()[:, qw.group_index()]
    # Symmetric +absmax sits at 7.5 steps and clips to 7: still half a step.
    assert bool((err <= step * (0.5 + 1e-6)).all())
    assert symmetric == (qw.zeros is None)


def test_asymmetric_zero_points_span_the_range():
    w = torch.linspace(-1, 3, 128).repeat(8, 1)
    qw = quantize_rtn(w, 128, False, torch.float32)
    assert int(qw.q.min()) == 0 and int(qw.q.max()) == 15
    assert qw.zeros.unique().tolist() == [4]


def test_kinds_differ_in_tails():
    g = torch.Generator().manual_seed(1)
    gauss = random_weight(256, 1024, "gaussian", g)
    heavy = random_weight(256, 1024, "heavy_tailed", g)
    outl = random_weight(256, 1024, "outlier_channels", g)
    kurt = lambda t: float(((t - t.mean()) ** 4).mean() / t.var() ** 2)  # noqa: E731
    assert kurt(heavy) > 2 * kurt(gauss)
    assert float(outl.abs().amax(0).max()) > 5 * float(gauss.abs().amax(0).max())


def test_generators_are_seeded():
    a = random_weight(8, 64, "heavy_tailed", torch.Generator().manual_seed(5))
    b = random_weight(8, 64, "heavy_tailed", torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize("call,match", [
    (lambda: quantize_rtn(torch.randn(8, 100), 32, False), "group_size: expected a divisor of K=100"),
    (lambda: quantize_rtn(torch.randn(8, 64).int(), 32, False), "weight to quantize: expected dtype"),
    (lambda: quantize_rtn(torch.randn(8, 64), 32, False, torch.int8), "scale dtype: expected dtype"),
    (lambda: quantize_rtn(torch.randn(8, 64), 0, False), "group_size: expected -1 or a positive size"),
    (lambda: random_weight(8, 64, "uniform"), "weight kind: expected one of"),
], ids=["k-not-multiple-of-g", "int-weight", "int-scales", "group-0", "unknown-kind"])
def test_bad_input_is_named(call, match):
    with pytest.raises(LayoutError, match=match):
        call()
