"""Run kernels over the parity matrix: random data judged by the error model, plus exact probes.

Each case's inputs, reference and probe weight are built once and judged against every kernel
checked in the same run (`check_kernels`), so checking two kernels costs little more than one.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from .canonical import bit_equal
from .cases import Case, make_inputs
from .diagnose import diagnose
from .error_model import Verdict, judge
from .errors import expect
from .kernel_spec import KernelSpec
from .poison import poisoned
from .probes import ProbeResult, fine_scale_probe_weight, probe_weight, run_probes
from .reference import Reference, plain_torch_matmul, reference_matmul

# The phases a case's time is split into, in the order they run.
PHASES = ("inputs", "reference", "kernel", "verdict", "probes")


@dataclass(frozen=True)
class CaseReport:
    """One case's outcome for one kernel. probe is None when this case's configuration was probed
    elsewhere (probes run once per shape, group size, dtype and symmetry); error holds a raised
    exception; diagnosis names the wrong convention that explains a failed verdict, if one does;
    phases: seconds spent per phase (PHASES), shared phases (inputs, reference) counted for every
    kernel that used them."""

    kernel: str
    case_id: str
    verdict: Verdict | None
    probe: ProbeResult | None
    error: str | None
    seconds: float
    diagnosis: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error is None and self.verdict is not None and self.verdict.passed and (
            self.probe is None or self.probe.passed)


def call_kernel(spec: KernelSpec, prepared: tuple, x: torch.Tensor, n: int, group_size: int,
                bias: torch.Tensor | None) -> torch.Tensor:
    """Hand the kernel copies, so it cannot corrupt the oracle's tensors, a NaN-poisoned output
    buffer when it writes into one, and poisoned memory for whatever it allocates (oracle.poison).
    prepared: (weight, scales, zeros) from spec.prepare, and g_idx when the weight is act-order."""
    weight, scales, zeros, *g_idx = (None if t is None else t.clone() for t in prepared)
    args = (x.clone(), weight, scales, zeros, group_size, None if bias is None else bias.clone())
    kwargs = {"g_idx": g_idx[0]} if g_idx and g_idx[0] is not None else {}
    with poisoned(x.device):
        if not spec.writes_out:
            return spec.fn(*args, **kwargs)
        out = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype, device=x.device)
        spec.fn(*args, out=out, **kwargs)
        return out


def prepare_for(spec: KernelSpec, weight, dtype: torch.dtype) -> tuple:
    """The spec's layouts of `weight`, plus its g_idx (int32 [K]) when it is act-order."""
    prepared = spec.prepare(weight, dtype)
    return (*prepared, weight.g_idx.to(torch.int32)) if weight.has_act_order else prepared


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    differ = (a.double() != b.double()) & ~(a.double().isnan() & b.double().isnan())
    where = [list(map(int, rc)) for rc in differ.nonzero()[:3].tolist()]
    r, c = where[0] if where else (0, 0)
    return f"{int(differ.sum())} element(s) differ, first at {where}: {float(a[r, c])!r} against {float(b[r, c])!r}"


def repeat_problem(spec: KernelSpec, prepared: tuple, x: torch.Tensor, n: int, group_size: int,
                   bias: torch.Tensor | None, first: torch.Tensor) -> str | None:
    """A second call on the same inputs must give the same bits; None when it does."""
    again = call_kernel(spec, prepared, x, n, group_size, bias)
    if bit_equal(again, first):
        return None
    return (f"nondeterministic: a second call on the same inputs differs ({first_difference(again, first)}): a race "
            "or unordered atomic adds; declare KernelSpec(deterministic=False) if the kernel adds with atomics "
            "by design")


def batch_problem(spec: KernelSpec, prepared: tuple, x: torch.Tensor, n: int, group_size: int,
                  bias: torch.Tensor | None, full: torch.Tensor) -> str | None:
    """Rows 0, M // 2 and M - 1, each called alone, must equal their rows of the M-row call."""
    for r in sorted({0, x.shape[0] // 2, x.shape[0] - 1}):
        alone = call_kernel(spec, prepared, x[r:r + 1], n, group_size, bias)
        if not bit_equal(alone, full[r:r + 1]):
            return (f"not batch invariant: row {r} called alone differs from row {r} of the {x.shape[0]}-row "
                    f"call ({first_difference(alone, full[r:r + 1])})")
    return None


def describe_exception(exc: BaseException) -> str:
    """A crashing kernel is a failed case: its error, with the traceback's last frames unless it
    is a plain argument error."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if not isinstance(exc, (ValueError, TypeError)):
        text += "\n" + traceback.format_exc(limit=-3)
    return text


class _Timer:
    def __init__(self) -> None:
        self.phases = {p: 0.0 for p in PHASES}

    def run(self, phase: str, fn: Callable, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.phases[phase] += time.perf_counter() - start


TWO_ROUNDINGS_NOTE = ("passes as a two-rounding dequant (q * s + (-z * s), or a float zero point), not as one "
                      "rounding of (q - z) * s: declare KernelSpec(dequant_roundings=2) to be judged by that bound "
                      "alone, or dequant_roundings=1 to require one rounding")


def _numerics(spec: KernelSpec, case: Case, out: torch.Tensor, ref: Reference,
              baseline: torch.Tensor) -> tuple[Verdict, list[str]]:
    """The verdict under the spec's declared numerics. Undeclared roundings: one rounding first,
    then two (a note says so when only two pass). A declared form that fails while another form
    would pass gets a note naming that declaration."""
    dequant = spec.dequant(case.dtype)
    declared = spec.dequant_roundings
    verdict = judge(out, ref, dequant_dtype=dequant, dequant_roundings=declared or 1, baseline=baseline)
    if verdict.passed:
        return verdict, []
    if declared is None:
        two = judge(out, ref, dequant_dtype=dequant, dequant_roundings=2, baseline=baseline)
        return (two, [TWO_ROUNDINGS_NOTE]) if two.passed else (verdict, [])
    for dtype, roundings in ((case.dtype, 2), (case.dtype, 1), (None, 1)):
        if (dtype, roundings) != (dequant, declared) and judge(out, ref, dequant_dtype=dtype,
                                                                  dequant_roundings=roundings).passed:
            form = "dequant_dtype=None (W kept exact)" if dtype is None else \
                f"dequant_dtype='activation', dequant_roundings={roundings}"
            return verdict, [f"fails as declared, but would pass declared {form}"]
    return verdict, []


def _judge_one(spec: KernelSpec, case: Case, inputs, ref: Reference, baseline: torch.Tensor, seed: int,
               device: torch.device, probes: bool, shared: dict[str, float]) -> CaseReport:
    timer = _Timer()
    timer.phases.update(shared)
    verdict = probe = diagnosis = error = None
    notes: list[str] = []
    try:
        prepared = prepare_for(spec, inputs.weight, case.dtype)
        args = (spec, prepared, inputs.x, case.n, case.group_size, inputs.bias)
        out = timer.run("kernel", call_kernel, *args)
        verdict, notes = timer.run("verdict", _numerics, spec, case, out, ref, baseline)
        found = None
        if not verdict.passed:
            found = timer.run("verdict", lambda: diagnose(
                out, inputs.x, inputs.weight, inputs.bias, dequant_dtype=spec.dequant(case.dtype),
                dequant_roundings=spec.dequant_roundings or 1, ref=ref))
            diagnosis = found.summary()
        if spec.deterministic:
            error = timer.run("kernel", repeat_problem, *args, out)
        if error is None and spec.batch_invariant and case.m > 1:
            error = timer.run("kernel", batch_problem, *args, out)
        if probes:
            probe = timer.run("probes", _probe, spec, case, inputs.bias, seed, device)
            if not probe.passed and probe.located and (found is None or not found.global_mistake):
                # The probes pin row, group and channel exactly, where random data named no mistake
                # of the whole weight (a convention) and could at best fit a single-value guess.
                diagnosis = "probes located: " + "; ".join(probe.located)
    except Exception as exc:  # a crashing kernel is a failed case, reported with its traceback
        error = describe_exception(exc)
    return CaseReport(spec.name, case.id, verdict, probe, error, sum(timer.phases.values()), diagnosis,
                      timer.phases, notes)


def _probe(spec: KernelSpec, case: Case, bias: torch.Tensor | None, seed: int, device: torch.device) -> ProbeResult:
    """The exact probes, and for fp16 the fine-scale probes on a sample of the channels, with
    weights drawn on the case's device."""
    g = torch.Generator(device=device).manual_seed(seed + 1)
    weight = probe_weight(case.n, case.k, case.group_size, case.symmetric, case.dtype, g, case.act_order)
    result = _probe_with(spec, case, weight, bias, device, g)
    if case.dtype == torch.float16:
        fine = fine_scale_probe_weight(case.n, case.k, case.group_size, case.symmetric, g, case.act_order)
        result = result.merged(_probe_with(spec, case, fine, bias, device, g, sample=True, label="fine-scale "))
    return result


def _probe_with(spec: KernelSpec, case: Case, weight, bias: torch.Tensor | None, device: torch.device,
                g: torch.Generator, sample: bool = False, label: str = "") -> ProbeResult:
    pw = weight.to(device)
    prepared = prepare_for(spec, pw, case.dtype)
    return run_probes(lambda x, b: call_kernel(spec, prepared, x, case.n, case.group_size, b), pw, case.dtype,
                      bias, max_m=spec.max_m or 4096, generator=g, sample=sample, label=label)


def check_case_all(specs: list[KernelSpec], case: Case, seed: int = 0, device: str | torch.device = "cpu",
                   probes: dict[str, bool] | bool = True) -> list[CaseReport]:
    """One case judged against every spec in `specs` (each must support it): the inputs, the
    reference and the plain-torch baseline are built once. probes: per spec name, or for all."""
    device = torch.device(device)
    timer = _Timer()
    try:
        inputs = timer.run("inputs", make_inputs, case, seed, device)
        ref = timer.run("reference", reference_matmul, inputs.x, inputs.weight, inputs.bias)
        baseline = timer.run("reference", plain_torch_matmul, inputs.x, inputs.weight, inputs.bias)
    except Exception as exc:  # the oracle cannot build this case here (a bad device, say)
        error = describe_exception(exc)
        return [CaseReport(s.name, case.id, None, None, error, sum(timer.phases.values()), None, dict(timer.phases))
                for s in specs]
    shared = {p: t for p, t in timer.phases.items() if t}
    return [_judge_one(s, case, inputs, ref, baseline, seed, device,
                       probes if isinstance(probes, bool) else probes.get(s.name, True), shared) for s in specs]


def check_case(spec: KernelSpec, case: Case, seed: int = 0, device: str | torch.device = "cpu",
               probes: bool = True) -> CaseReport:
    return check_case_all([spec], case, seed, device, probes)[0]


def probe_key(case: Case) -> tuple:
    return (case.k, case.n, case.group_size, case.dtype, case.symmetric, case.act_order)


def check_kernels(specs: Iterable[KernelSpec], cases: Iterable[Case], seed: int = 0,
                  device: str | torch.device = "cpu",
                  on_result: Callable[[CaseReport], None] | None = None) -> dict[str, list[CaseReport]]:
    """Every case each spec supports, judged; exact probes once per configuration and kernel.
    Returns kernel name -> its reports, in case order."""
    specs = list(specs)
    for spec in specs:
        expect(isinstance(spec, KernelSpec), "spec", "a KernelSpec describing the kernel", type(spec).__name__)
    names = [s.name for s in specs]
    expect(len(set(names)) == len(names), "specs", "kernels with distinct names", str(names))
    probed: dict[str, set[tuple]] = {s.name: set() for s in specs}
    reports: dict[str, list[CaseReport]] = {s.name: [] for s in specs}
    for case in cases:
        expect(isinstance(case, Case), "cases", "oracle.cases.Case items (see parity_cases)", type(case).__name__)
        problem = case.problem()
        expect(problem is None, "cases", "cases some layout can express (see oracle.case)", str(problem))
        todo = [s for s in specs if s.supports(case)[0]]
        if not todo:
            continue
        key = probe_key(case)
        for report in check_case_all(todo, case, seed, device, {s.name: key not in probed[s.name] for s in todo}):
            probed[report.kernel].add(key)
            reports[report.kernel].append(report)
            if on_result is not None:
                on_result(report)
    return reports


def check_kernel(spec: KernelSpec, cases: Iterable[Case], seed: int = 0, device: str | torch.device = "cpu",
                 on_result: Callable[[CaseReport], None] | None = None) -> list[CaseReport]:
    """Every case the spec supports, each judged; exact probes once per configuration."""
    expect(isinstance(spec, KernelSpec), "spec", "a KernelSpec describing the kernel", type(spec).__name__)
    return check_kernels([spec], cases, seed, device, on_result)[spec.name]
