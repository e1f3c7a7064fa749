"""The parity matrix generator, the harness and the CLI, end to end on CPU."""

import pytest
import torch

from fixtures import specs
from oracle import LayoutError
from oracle.baselines import torch_dequant
from oracle import cases as cases_module
from oracle.cases import Case, TIERS, make_inputs, parity_cases
from oracle.check import check_case, check_kernel
from oracle.cli import main
from oracle.shapes import BOUNDARY_SHAPES, LinearShape, DECODE_BATCHES, MODEL_SHAPES, PREFILL_BATCHES, unique_shapes


def test_fixture_models_and_boundaries_are_present():
    models = {s.model for s in MODEL_SHAPES}
    for m in ("llama3.1-8b", "llama3.3-70b", "mistral-7b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b", "smollm2-1.7b",
              "gemma-2b"):
        assert m in models
    ks = {s.k for s in BOUNDARY_SHAPES}
    assert {8192, 9728, 9856, 38912, 49152} <= ks
    assert any(s.n == 8 for s in BOUNDARY_SHAPES) and any(s.k == s.group_size for s in BOUNDARY_SHAPES)
    # K * M crosses 32768 at M = 4 on both sides for the three K * M shapes.
    assert all(s.k * 3 < 32768 <= s.k * 4 for s in BOUNDARY_SHAPES if s.layer.startswith("km_"))
    assert DECODE_BATCHES == (1, 2, 3, 4, 5, 6, 8, 16)
    assert PREFILL_BATCHES == (17, 32, 33, 64, 128, 129, 256, 1024, 2048, 4096)


def test_llama_shapes_are_right():
    llama = {s.layer: (s.k, s.n) for s in MODEL_SHAPES if s.model == "llama3.1-8b"}
    assert llama == {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


@pytest.mark.parametrize("tier", TIERS)
def test_case_ids_are_unique_and_cases_valid(tier):
    cases = parity_cases(tier)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert all(c.valid() for c in cases)
    assert {c.dtype for c in cases} == {torch.float16, torch.bfloat16}
    assert {c.symmetric for c in cases} == {False, True}
    assert any(c.bias for c in cases) and not all(c.bias for c in cases)


def test_full_tier_crosses_every_shape_and_batch():
    cases = parity_cases("full")
    seen = {(c.k, c.n, c.m) for c in cases if c.group_size == 128}
    for s in unique_shapes():
        for m in DECODE_BATCHES + PREFILL_BATCHES:
            assert (s.k, s.n, m) in seen


def test_invalid_combinations_are_dropped_not_skipped():
    assert not Case(LinearShape("t", "g_not_dividing_k", 96, 16), 1, torch.float16, True, 64, False).valid()
    assert not Case(LinearShape("t", "asym_n12", 128, 12), 1, torch.float16, False, 32, False).valid()
    assert Case(LinearShape("t", "sym_n12", 128, 12), 1, torch.float16, True, 32, False).valid()


def test_case_ids_read_well():
    case = parity_cases("cpu")[0]
    assert case.id == "small.n8-K256xN8-G32-M1-fp16-asym-bias"


def test_keep_filters_cases():
    assert all(c.m <= 16 for c in parity_cases("cpu", keep=lambda c: c.m <= 16))


def test_bad_tier_is_named():
    with pytest.raises(LayoutError, match="tier: expected one of"):
        parity_cases("huge")


def test_inputs_are_deterministic_per_seed():
    case = parity_cases("cpu")[5]
    a, b = make_inputs(case, 3), make_inputs(case, 3)
    assert torch.equal(a.x, b.x) and a.weight.equal(b.weight)
    assert not torch.equal(a.x, make_inputs(case, 4).x)


def test_reused_weight_gives_the_inputs_a_fresh_one_would():
    """make_inputs keeps the last weight: its x and bias must not depend on what ran before."""
    first, second = parity_cases("cpu")[:2]
    assert (first.n, first.k, first.group_size, first.dtype) == (second.n, second.k, second.group_size, second.dtype)
    make_inputs(first, 2)
    reused = make_inputs(second, 2)
    cases_module._last_weight.clear()
    fresh = make_inputs(second, 2)
    assert torch.equal(reused.x, fresh.x) and torch.equal(reused.bias, fresh.bias) and reused.weight.equal(fresh.weight)


def test_harness_passes_a_correct_kernel_and_fails_a_buggy_one():
    cases = parity_cases("cpu", keep=lambda c: c.m in (1, 17))
    good = check_kernel(specs.two_rounding_dequant, cases)
    assert good and all(r.passed for r in good)
    bad = check_kernel(specs.zero_point_off_by_one, [c for c in cases if not c.symmetric])
    assert any(not r.passed for r in bad)
    assert all(r.probe is None or not r.probe.passed for r in bad)


def test_kernel_that_corrupts_its_inputs_cannot_corrupt_the_oracle():
    def vandal(x, weight, scales, zeros, group_size, bias):
        out = torch_dequant.fn(x, weight, scales, zeros, group_size, bias)
        x.zero_(), scales.zero_()
        return out

    spec = type(torch_dequant)(name="vandal", fn=vandal)
    report = check_case(spec, parity_cases("cpu")[0])
    assert report.passed, report


def test_crashing_kernel_is_a_failed_case_with_its_error():
    def crash(*args):
        raise RuntimeError("boom")

    report = check_case(type(torch_dequant)(name="crash", fn=crash), parity_cases("cpu")[0])
    assert not report.passed and "boom" in report.error


def test_cli_exit_codes(tmp_path, capsys):
    one_worker = ["--tier", "cpu", "--shard", "3/16", "--workers", "1"]
    assert main(["check", "oracle.baselines:torch_dequant", *one_worker, "--json", str(tmp_path / "r.json")]) == 0
    assert "torch-dequant" in capsys.readouterr().out and (tmp_path / "r.json").exists()
    assert main(["check", "fixtures.specs:zero_point_off_by_one", *one_worker, "--show-failures", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "one-hot" in out


def test_cli_rejects_a_non_spec():
    with pytest.raises(SystemExit, match="expected oracle.cases:Case to be an oracle.kernel_spec.KernelSpec"):
        main(["check", "oracle.cases:Case"])


def test_unwritten_element_of_an_out_buffer_cannot_pass():
    def lazy(x, weight, scales, zeros, group_size, bias, out):
        out[:, :-1] = torch_dequant.fn(x, weight, scales, zeros, group_size, bias)[:, :-1]

    def diligent(x, weight, scales, zeros, group_size, bias, out):
        out.copy_(torch_dequant.fn(x, weight, scales, zeros, group_size, bias))

    case = parity_cases("cpu")[0]
    assert not check_case(type(torch_dequant)(name="lazy", fn=lazy, writes_out=True), case).passed
    assert check_case(type(torch_dequant)(name="diligent", fn=diligent, writes_out=True), case).passed


@pytest.mark.parametrize("layout", ["awq", "gptq", "exllama", "canonical"])
def test_kernels_taking_other_layouts_are_fed_them(layout):
    from oracle import QuantizedWeight
    from oracle.layouts import from_awq, from_gptq, nibbles
    from oracle.reference import plain_torch_matmul

    def unpack(weight, scales, zeros, group_size):
        if layout == "awq":
            t = {"qweight": weight, "scales": scales} | ({} if zeros is None else {"qzeros": zeros})
            return from_awq(t, group_size, symmetric=zeros is None)
        if layout == "gptq":
            k = weight.shape[0] * 8
            g = torch.arange(k, dtype=torch.int32) // (k if group_size == -1 else group_size)
            qz = zeros if zeros is not None else nibbles.pack(torch.full((scales.shape[0], scales.shape[1]), 8,
                                                                         dtype=torch.uint8), 1)
            return from_gptq({"qweight": weight, "scales": scales, "qzeros": qz, "g_idx": g}, group_size, 2,
                             symmetric=zeros is None)
        q = weight if layout == "canonical" else nibbles.unpack(weight, 1, nibbles.AWQ_ORDER)
        return QuantizedWeight(q, scales, None if zeros is None else nibbles.unpack(zeros, 0), group_size)

    def fn(x, weight, scales, zeros, group_size, bias):
        return plain_torch_matmul(x, unpack(weight, scales, zeros, group_size), bias)

    spec = type(torch_dequant)(name=layout, fn=fn, weight_layout=layout)
    for case in parity_cases("cpu", keep=lambda c: c.m == 3 and c.k == 512):
        assert check_case(spec, case, probes=False).passed, case.id


def test_our_kernels_go_through_the_same_path():
    from optimized import specs

    case = parity_cases("cpu", keep=lambda c: c.m == 1 and c.k == 256 and not c.symmetric)[0]
    assert check_case(specs.triton, case).passed
    ok, reason = specs.skinny.supports(case)
    assert ok == torch.cuda.is_available() and (ok or reason)
