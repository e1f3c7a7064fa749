"""Run a kernel over the parity matrix: random data judged by the error model, plus exact probes."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .cases import Case, make_inputs
from .diagnose import diagnose
from .error_model import Verdict, judge
from .errors import expect
from .kernel_spec import KernelSpec
from .probes import ProbeResult, probe_weight, run_probes
from .reference import plain_torch_matmul, reference_matmul


@dataclass(frozen=True)
class CaseReport:
    """One case's outcome. probe is None when this case's configuration was probed elsewhere
    (probes run once per shape, group size, dtype and symmetry); error holds a raised exception;
    diagnosis names the wrong convention that explains a failed verdict, if one does."""

    kernel: str
    case_id: str
    verdict: Verdict | None
    probe: ProbeResult | None
    error: str | None
    seconds: float
    diagnosis: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.verdict is not None and self.verdict.passed and (
            self.probe is None or self.probe.passed)


def call_kernel(spec: KernelSpec, prepared: tuple, x: torch.Tensor, n: int, group_size: int,
                bias: torch.Tensor | None) -> torch.Tensor:
    """Hand the kernel copies, so it cannot corrupt the oracle's tensors, and a NaN-poisoned
    output buffer when it writes into one."""
    weight, scales, zeros = (None if t is None else t.clone() for t in prepared)
    args = (x.clone(), weight, scales, zeros, group_size, None if bias is None else bias.clone())
    if not spec.writes_out:
        return spec.fn(*args)
    out = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype, device=x.device)
    spec.fn(*args, out=out)
    return out


def check_case(spec: KernelSpec, case: Case, seed: int = 0, device: str | torch.device = "cpu",
               probes: bool = True) -> CaseReport:
    start = time.perf_counter()
    verdict = probe = diagnosis = None
    try:
        inp = make_inputs(case, seed, device)
        prepared = spec.prepare(inp.weight, case.dtype)
        out = call_kernel(spec, prepared, inp.x, case.n, case.group_size, inp.bias)
        ref = reference_matmul(inp.x, inp.weight, inp.bias)
        verdict = judge(out, ref, dequant_dtype=spec.dequant(case.dtype), dequant_roundings=spec.dequant_roundings,
                        baseline=plain_torch_matmul(inp.x, inp.weight, inp.bias))
        if not verdict.passed:
            diagnosis = diagnose(out, inp.x, inp.weight, inp.bias, dequant_dtype=spec.dequant(case.dtype),
                                 dequant_roundings=spec.dequant_roundings, ref=ref).summary()
        if probes:
            g = torch.Generator().manual_seed(seed + 1)
            pw = probe_weight(case.n, case.k, case.group_size, case.symmetric, case.dtype, g).to(device)
            p_prepared = spec.prepare(pw, case.dtype)
            bias = inp.bias
            probe = run_probes(lambda x, b: call_kernel(spec, p_prepared, x, case.n, case.group_size, b), pw, case.dtype,
                               bias, max_m=spec.max_m or 4096, generator=g)
        error = None
    except Exception as exc:  # a crashing kernel is a failed case, reported with its traceback
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if not isinstance(exc, (ValueError, TypeError)):
            error += "\n" + traceback.format_exc(limit=-3)
    return CaseReport(spec.name, case.id, verdict, probe, error, time.perf_counter() - start, diagnosis)


def probe_key(case: Case) -> tuple:
    return (case.k, case.n, case.group_size, case.dtype, case.symmetric)


def check_kernel(spec: KernelSpec, cases: Iterable[Case], seed: int = 0, device: str | torch.device = "cpu",
                 on_result: Callable[[CaseReport], None] | None = None) -> list[CaseReport]:
    """Every case the spec supports, each judged; exact probes once per configuration."""
    expect(isinstance(spec, KernelSpec), "spec", "a KernelSpec describing the kernel", type(spec).__name__)
    probed: set[tuple] = set()
    reports = []
    for case in cases:
        expect(isinstance(case, Case), "cases", "oracle.cases.Case items (see parity_cases)", type(case).__name__)
        if not spec.supports(case)[0]:
            continue
        key = probe_key(case)
        report = check_case(spec, case, seed, device, probes=key not in probed)
        probed.add(key)
        reports.append(report)
        if on_result is not None:
            on_result(report)
    return reports
