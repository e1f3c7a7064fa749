"""The fp64 reference: exact on exactly representable problems, chunked, bounded in memory."""

import subprocess
import sys
import textwrap

import pytest
import torch

from oracle import LayoutError, QuantizedWeight, plain_torch_matmul, random_quantized, reference_matmul
from oracle import reference as reference_module


def test_matches_an_independent_fp64_computation():
    g = torch.Generator().manual_seed(0)
    w = random_quantized(48, 256, 64, False, torch.bfloat16, generator=g)
    x = torch.randn(5, 256, generator=g).bfloat16()
    bias = torch.randn(48, generator=g).bfloat16()
    gi = torch.arange(256) // 64
    wd = (w.q.double() - w.zeros.double()[:, gi]) * w.scales.double()[:, gi]
    want = x.double() @ wd.t() + bias.double()
    ref = reference_matmul(x, w, bias)
    assert torch.equal(ref.y, want)
    assert torch.equal(ref.y_out, want.bfloat16())
    assert torch.equal(ref.abs_dot, x.double().abs() @ wd.abs().t() + bias.double().abs())


def test_chunking_over_n_changes_nothing(monkeypatch):
    g = torch.Generator().manual_seed(1)
    w = random_quantized(40, 512, 128, True, torch.float16, generator=g)
    x = torch.randn(3, 512, generator=g).half()
    whole = reference_matmul(x, w)
    monkeypatch.setattr(reference_module, "CHUNK_ELEMENTS", 512 * 7)
    chunked = reference_matmul(x, w)
    # fp64 sums of 512 exact products may round differently in another BLAS blocking (1e-16
    # relative); a misplaced or dropped chunk would be off by O(1).
    for name in ("y", "abs_dot", "rms_dot", "abs_scale_dot", "rms_scale_dot"):
        torch.testing.assert_close(getattr(whole, name), getattr(chunked, name), rtol=1e-13, atol=1e-13)


def test_act_order_g_idx_is_honoured():
    g = torch.Generator().manual_seed(2)
    k, group = 256, 32
    perm = torch.randperm(k, generator=g)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    q = torch.randint(0, 16, (16, k), generator=g, dtype=torch.uint8)
    z = torch.randint(0, 16, (16, k // group), generator=g, dtype=torch.uint8)
    s = torch.rand(16, k // group, generator=g).half()
    w = QuantizedWeight(q, s, z, group, g_idx)
    x = torch.randn(2, k, generator=g).half()
    wd = (q.double() - z.double()[:, g_idx.long()]) * s.double()[:, g_idx.long()]
    assert torch.equal(reference_matmul(x, w).y, x.double() @ wd.t())


def test_strided_activations_are_accepted():
    w = random_quantized(8, 128, 32, True, torch.float16)
    big = torch.randn(4, 256).half()
    x = big[:, :128]
    assert torch.equal(reference_matmul(x, w).y, reference_matmul(x.contiguous(), w).y)


def test_plain_torch_is_close_but_not_the_reference():
    g = torch.Generator().manual_seed(3)
    w = random_quantized(64, 4096, 128, False, torch.float16, generator=g)
    x = torch.randn(4, 4096, generator=g).half()
    ref = reference_matmul(x, w)
    plain = plain_torch_matmul(x, w)
    rel = float((plain.double() - ref.y).norm() / ref.y.norm())
    assert 0 < rel < 1e-2


@pytest.mark.parametrize("bad,match", [
    (lambda x, w: (x.float(), None), "expected dtype float16 or bfloat16"),
    (lambda x, w: (x[:, :64], None), r"expected shape \[\*, 128\]"),
    (lambda x, w: (x, torch.zeros(8, dtype=torch.bfloat16)), "bias: expected dtype float16"),
    (lambda x, w: (x, torch.zeros(9, dtype=torch.float16)), r"bias: expected shape \[8\]"),
], ids=["x-fp32", "x-wrong-k", "bias-dtype", "bias-shape"])
def test_bad_input_is_named(bad, match):
    w = random_quantized(8, 128, 32, True, torch.float16)
    x, bias = bad(torch.randn(2, 128).half(), w)
    with pytest.raises(LayoutError, match=match):
        reference_matmul(x, w, bias)


@pytest.mark.slow
def test_largest_shape_fits_in_bounded_memory():
    """K = 28672, N = 57344, M = 16 (Llama-3.3-70B's down and gate_up extents crossed): the weight
    is 1.6 GB of uint8; the reference may add at most ~2 GiB on top, not the 13 GB an unchunked
    fp64 dequant would take. Runs in a subprocess so its peak RSS is its own."""
    script = textwrap.dedent("""
        import resource, time, torch
        from oracle import QuantizedWeight, reference_matmul
        n, k = 57344, 28672
        q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
        w = QuantizedWeight(q, torch.rand(n, k // 128).half(), torch.randint(0, 16, (n, k // 128), dtype=torch.uint8), 128)
        x = torch.randn(16, k).half()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        ref = reference_matmul(x, w)
        print(time.perf_counter() - t, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**20)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    seconds, extra_gib = map(float, out.stdout.split())
    print(f"reference K=28672 N=57344 M=16: {seconds:.1f} s, {extra_gib:.2f} GiB above the weight")
    assert extra_gib < 2.5
