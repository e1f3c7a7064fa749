"""The harness's checks beyond the error model, each proven both ways: a planted bug that only this
check catches (the verdict and the probes pass it), and a correct kernel that passes it.

Calibration of undeclared numerics, poisoned allocations, the repeated call, the opt-in
batch-invariance check, the fine-scale probes, and the diagnosis and probe localization of bugs
that used to go unnamed.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from fixtures import specs as fixture_specs
from fixtures.variants import BUGGY, blas_fp32, two_rounding_dequant
from oracle import Case, KernelSpec, LayoutError, QuantizedWeight, case, check_case, check_kernel, parity_cases
from oracle import check as check_module
from oracle.baselines import torch_dequant
from oracle.layouts import nibbles
from oracle.poison import poisoned

BUGS = {v.name: v for v in BUGGY}


def canonical(weight, scales, zeros, group_size, g_idx=None) -> QuantizedWeight:
    """The kernel-layout arguments (int32 [N, K/8], scales, int32 [N/8, groups]) as a canonical weight."""
    return QuantizedWeight(nibbles.unpack(weight, 1), scales, None if zeros is None else nibbles.unpack(zeros, 0),
                           group_size, g_idx)


def kernel_of(variant_fn):
    """A plain-torch W4A16 function fn(x, w, bias) behind the kernel calling convention."""
    def fn(x, weight, scales, zeros, group_size, bias, g_idx=None):
        return variant_fn(x, canonical(weight, scales, zeros, group_size, g_idx), bias)
    return fn


ASYM = parity_cases("cpu", keep=lambda c: not c.symmetric and c.k == 512 and c.group_size == 64 and c.m in (3, 17))


# ------------------------------------------------------------------------------------------------
# Numerics: undeclared roundings are calibrated, declared ones are held to.

def test_two_rounding_kernel_passes_undeclared_with_a_note_naming_the_declaration():
    spec = KernelSpec("folded-zero", kernel_of(two_rounding_dequant))
    reports = check_kernel(spec, parity_cases("cpu", keep=lambda c: not c.symmetric and c.m in (16, 129)))
    assert all(r.passed for r in reports), [r.case_id for r in reports if not r.passed]
    noted = [r for r in reports if r.notes]
    assert noted, "no case needed the two-rounding bound: the calibration is untested"
    assert "declare KernelSpec(dequant_roundings=2)" in noted[0].notes[0]


def test_declared_one_rounding_is_held_to_and_the_report_names_what_would_pass():
    spec = KernelSpec("folded-zero", kernel_of(two_rounding_dequant), dequant_roundings=1)
    reports = check_kernel(spec, parity_cases("cpu", keep=lambda c: not c.symmetric and c.m in (16, 129)))
    failed = [r for r in reports if not r.passed]
    assert failed
    assert "would pass declared dequant_dtype='activation', dequant_roundings=2" in failed[0].notes[0]


# ------------------------------------------------------------------------------------------------
# Poisoned allocations: an output never zeroed before partial sums are added into it.

def test_poisoned_allocations_hold_nan_and_restore_the_settings():
    before = torch.are_deterministic_algorithms_enabled()
    with poisoned("cpu"):
        assert torch.empty(4, dtype=torch.float16).isnan().all()
        assert (torch.empty(4, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert torch.are_deterministic_algorithms_enabled() == before


def unzeroed_split_k(alloc):
    """Bug: split-K partial sums added into a buffer from `alloc` that is never zeroed."""
    def fn(x, weight, scales, zeros, group_size, bias):
        w = canonical(weight, scales, zeros, group_size).dequantize(torch.float32)
        acc = alloc((x.shape[0], w.shape[0]))
        for xs, ws in zip(x.float().chunk(2, 1), w.chunk(2, 1)):
            acc += xs @ ws.t()
        return (acc if bias is None else acc + bias.float()).to(x.dtype)
    return fn


def test_poisoning_catches_an_output_never_zeroed():
    spec = KernelSpec("unzeroed", unzeroed_split_k(lambda shape: torch.empty(shape)), dequant_roundings=1)
    report = check_case(spec, ASYM[0], probes=False)
    assert not report.passed and "left unwritten" in report.diagnosis, report


def test_without_poisoning_a_buffer_that_happens_to_be_zero_hides_it(monkeypatch):
    """The same bug where fresh memory happened to be zero, with the poisoning switched off: it passes,
    as it did in shipped kernels whose tests never poisoned."""
    monkeypatch.setattr(check_module, "poisoned", lambda device: contextlib.nullcontext())
    spec = KernelSpec("unzeroed", unzeroed_split_k(lambda shape: torch.zeros(shape)), dequant_roundings=1)
    assert check_case(spec, ASYM[0]).passed


# ------------------------------------------------------------------------------------------------
# The repeated call: results that change from call to call.

def call_order_dependent():
    """Bug: fp16 partial sums over 8 K-slices added in an order that rotates with every call, as
    unordered atomics do; exact inputs (the probes) give the same bits in any order."""
    calls = itertools.count()

    def fn(x, weight, scales, zeros, group_size, bias):
        w = canonical(weight, scales, zeros, group_size).dequantize(torch.float32).to(x.dtype).float()
        parts = [(xs.float() @ ws.t()).to(x.dtype) for xs, ws in zip(x.chunk(8, 1), w.chunk(8, 1))]
        shift = next(calls) % len(parts)
        total = torch.zeros_like(parts[0], dtype=torch.float32)
        for p in parts[shift:] + parts[:shift]:
            total = (total + p.float()).to(x.dtype).float()
        return (total if bias is None else total + bias.float()).to(x.dtype)
    return fn


def test_repeated_call_catches_call_to_call_changes():
    report = check_case(KernelSpec("atomic-order", call_order_dependent(), dequant_roundings=1), ASYM[1])
    assert report.verdict.passed and report.probe.passed, "another check caught it: not a test of the repeat"
    assert not report.passed and report.error.startswith("nondeterministic"), report.error


def test_declared_atomics_skip_the_repeat():
    report = check_case(KernelSpec("atomic-order", call_order_dependent(), dequant_roundings=1,
                                   deterministic=False), ASYM[1])
    assert report.passed, report


# ------------------------------------------------------------------------------------------------
# Batch invariance (opt-in): row i of an M-row call against row i called alone.

def m_dependent_split(x, weight, scales, zeros, group_size, bias):
    """Bug for batch invariance: K split into min(M, 4) slices whose fp16 partial sums depend on M."""
    w = canonical(weight, scales, zeros, group_size).dequantize(torch.float32).to(x.dtype).float()
    parts = [(xs.float() @ ws.t()).to(x.dtype).float() for xs, ws in zip(x.chunk(min(x.shape[0], 4), 1),
                                                                        w.chunk(min(x.shape[0], 4), 1))]
    total = sum(parts)
    return (total if bias is None else total + bias.float()).to(x.dtype)


def test_batch_invariance_is_opt_in_and_catches_m_dependent_sums():
    assert check_case(KernelSpec("m-split", m_dependent_split, dequant_roundings=1), ASYM[1]).passed
    report = check_case(KernelSpec("m-split", m_dependent_split, dequant_roundings=1, batch_invariant=True), ASYM[1])
    assert not report.passed and report.error.startswith("not batch invariant"), report.error


def test_batch_invariant_kernel_passes_the_check():
    spec = KernelSpec("torch", torch_dequant.fn, batch_invariant=True)
    assert check_case(spec, ASYM[1]).passed


# ------------------------------------------------------------------------------------------------
# Fine-scale probes: scales rounded through bf16, which the 4-bit probe scales cannot show.

def scales_through_bf16(x, weight, scales, zeros, group_size, bias):
    return torch_dequant.fn(x, weight, scales.to(torch.bfloat16).to(scales.dtype), zeros, group_size, bias)


def test_scales_rounded_through_bf16_are_caught_and_named_at_k16384():
    c = case(k=16384, n=8, m=3, dtype=torch.float16, group_size=128)
    report = check_case(KernelSpec("bf16-scales", scales_through_bf16, dequant_roundings=1), c)
    assert not report.passed and not report.probe.passed
    assert report.diagnosis.startswith("probes located: scales act as their bfloat16 rounding"), report.diagnosis


def test_correct_kernels_pass_the_fine_scale_probes_in_every_dequant_form():
    c = case(k=512, n=64, m=2, dtype=torch.float16, group_size=64)
    for spec in (fixture_specs.blas_fp32, fixture_specs.two_rounding_dequant):
        report = check_case(spec, c)
        assert report.passed and "fine-scale" not in report.probe.summary(), report


# ------------------------------------------------------------------------------------------------
# Failures explained: located from random data, or from the probes where only they fail.

@pytest.mark.parametrize("bug, located", [
    ("zero_point_off_by_one", "row 0, group 0: the zero point acts as z+1"),
    ("swapped_nibble_pair", "swapped in row 0"),
])
def test_single_value_bugs_are_located_from_random_data(bug, located):
    c = case(k=128, n=64, m=8, dtype=torch.bfloat16, group_size=32)
    report = check_case(fixture_specs.as_spec(BUGS[bug]), c, probes=False)
    assert not report.passed and located in report.diagnosis, report.diagnosis


@pytest.mark.parametrize("bug, located", [
    ("zero_point_off_by_one", "row 0, group 0: the zero point acts as z+1"),
    ("swapped_nibble_pair", "swapped in row 0 (two nibbles of one packed word)"),
])
def test_probe_only_failures_are_located_by_the_probes(bug, located):
    """At K = 16384 these bugs hide under the random-data bound; the probes pin row, group, channel."""
    c = case(k=16384, n=64, m=2, dtype=torch.bfloat16, group_size=128)
    report = check_case(fixture_specs.as_spec(BUGS[bug]), c)
    assert not report.probe.passed and report.diagnosis and located in report.diagnosis, report.diagnosis


def test_16bit_accumulation_is_named():
    c = case(k=4096, n=64, m=8, dtype=torch.float16, group_size=128)
    report = check_case(fixture_specs.as_spec(BUGS["accumulate_16bit"]), c, probes=False)
    assert not report.passed and report.diagnosis.startswith("explained by accumulate_16bit"), report.diagnosis


def test_dropped_k_tail_is_named_with_its_length():
    def drops_tail(x, weight, scales, zeros, group_size, bias):
        x = x.clone()
        x[:, 1024:] = 0  # a kernel stepping K by 1024 and skipping the remainder
        return torch_dequant.fn(x, weight, scales, zeros, group_size, bias)

    report = check_case(KernelSpec("tail", drops_tail, dequant_roundings=1), case(k=1056, n=64, m=4, group_size=32),
                        probes=False)
    assert report.diagnosis.startswith("explained by k_tail_dropped_32"), report.diagnosis


# ------------------------------------------------------------------------------------------------
# Custom cases and act-order.

def test_custom_cases_are_validated():
    with pytest.raises(LayoutError, match="group_size: expected a divisor of K=96"):
        case(k=96, n=8, m=1, group_size=64)
    with pytest.raises(LayoutError, match="N: expected a multiple of 8 with zero points"):
        case(k=128, n=12, m=1)
    bad = Case(case(k=128, n=16, m=1).shape, 0, torch.float16, False, 128, False)
    with pytest.raises(LayoutError, match=r"cases: expected cases some layout can express.*M >= 1"):
        check_kernel(torch_dequant, [bad])


def test_act_order_cases_reach_only_kernels_that_declare_them():
    act = [c for c in parity_cases("cpu") if c.act_order]
    assert any(c.k % c.group_size for c in act), "no partial last group under act-order"
    assert not check_kernel(torch_dequant, act)

    def act_order_kernel(x, weight, scales, zeros, group_size, bias, g_idx):
        return blas_fp32(x, canonical(weight, scales, zeros, group_size, g_idx.long()), bias)

    def ignores_g_idx(x, weight, scales, zeros, group_size, bias, g_idx):
        w = canonical(weight, scales, zeros, group_size, g_idx.long())
        g = torch.arange(w.k) // group_size
        return blas_fp32(x, QuantizedWeight(w.q, w.scales, w.zeros, group_size, g.clamp_max(w.num_groups - 1)), bias)

    good = check_kernel(KernelSpec("act-order", act_order_kernel, act_order=True, dequant_roundings=1), act)
    assert len(good) == len(act) and all(r.passed for r in good)
    bad = check_kernel(KernelSpec("no-g_idx", ignores_g_idx, act_order=True, dequant_roundings=1), act)
    assert all(not r.passed for r in bad)
