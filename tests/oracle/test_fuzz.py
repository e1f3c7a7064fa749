"""Property-based fuzzing of the oracle's packing primitives where tests/oracle/test_layouts.py does
not reach: any nibble order along any dim, and the tensors KernelSpec.prepare hands a kernel.

W4A16_FUZZ=ci (default: derandomized, a few dozen examples) or W4A16_FUZZ=long (random, hundreds);
W4A16_FUZZ_EXAMPLES=N overrides every property's example count.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle import probe_weight
from oracle.kernel_spec import KernelSpec
from oracle.layouts import nibbles, unpack_zero_points, zero_points_from_float

PROFILE = os.environ.get("W4A16_FUZZ", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"W4A16_FUZZ must be 'ci' or 'long', got {PROFILE!r}")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def fuzz_settings(ci: int, long: int) -> settings:
    override = os.environ.get("W4A16_FUZZ_EXAMPLES")
    return settings(deadline=None, derandomize=PROFILE == "ci", database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow],
                    max_examples=int(override) if override else (ci if PROFILE == "ci" else long))


def never_called(*args, **kwargs):
    raise AssertionError("prepare must not call the kernel")


# ----------------------------------------------------------------------------------------------
# the oracle's packing, where tests/test_layouts.py does not fuzz it


@st.composite
def packable(draw):
    """(values uint8 0..15 of 1 to 3 dims, the packed dim, a nibble order): the packed dim's
    extent is a multiple of 8."""
    dims = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    dim = draw(st.integers(0, len(dims) - 1))
    dims[dim] = 8 * draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    return torch.randint(0, 16, dims, generator=g, dtype=torch.uint8), dim, tuple(draw(st.permutations(range(8))))


@fuzz_settings(ci=60, long=1000)
@given(packable())
def test_nibbles_any_order_along_any_dim(case):
    values, dim, order = case
    words = nibbles.pack(values, dim, order)
    assert words.dtype == torch.int32 and words.shape[dim] * 8 == values.shape[dim]
    assert torch.equal(nibbles.unpack(words, dim, order), values)
    assert torch.equal(nibbles.unpack(words.view(torch.uint32), dim, order), values)
    # Nibble p (bits 4p..4p+3) of word j holds element 8j + order[p], read back without `unpack`.
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    v = values.movedim(dim, -1)
    for p, e in enumerate(order):
        assert torch.equal(((w >> (4 * p)) & 0xF).to(torch.uint8), v[..., e::8]), (p, e)


PREPARE_LAYOUTS = [(wl, zl) for wl in ("kernel", "exllama", "canonical") for zl in ("packed", "unpacked", "canonical")]


@fuzz_settings(ci=40, long=500)
@given(st.sampled_from(PREPARE_LAYOUTS), st.sampled_from([8, 16, 24]), st.integers(1, 12),
       st.sampled_from([32, 64, -1]), st.booleans(), st.sampled_from(list(DTYPES.values())), st.integers(0, 2**16))
def test_prepare_hands_kernels_the_exact_weight(layouts, n, words, group_size, symmetric, dtype, seed):
    """KernelSpec.prepare (what every kernel under test is fed) decodes back to the canonical
    weight bit for bit, in every weight and zero-point layout it offers."""
    weight_layout, zero_layout = layouts
    k = 8 * words * (4 if group_size == 32 else 8)  # a multiple of 32 and 64
    w = probe_weight(n, k, group_size, symmetric, dtype, torch.Generator().manual_seed(seed))
    spec = KernelSpec(name="layouts", fn=never_called, weight_layout=weight_layout, zero_layout=zero_layout)
    weight, scales, zeros = spec.prepare(w, dtype)
    q = {"kernel": lambda: nibbles.unpack(weight, 1), "exllama": lambda: nibbles.unpack(weight, 1, nibbles.AWQ_ORDER),
         "canonical": lambda: weight}[weight_layout]()
    assert torch.equal(q, w.q)
    assert scales.dtype == dtype and torch.equal(scales, w.scales.to(dtype))
    if symmetric:
        assert zeros is None
    else:
        z = {"packed": unpack_zero_points, "unpacked": zero_points_from_float, "canonical": lambda t: t}[zero_layout](zeros)
        assert torch.equal(z, w.zeros)
