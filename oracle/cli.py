"""`w4a16-oracle`: judge kernels over the parity matrix from the command line, and turn benchmark
results into a report."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .cases import TIERS, parity_cases
from .check import CaseReport, check_kernel
from .kernel_spec import KernelSpec
from .report import write_report


def load_spec(target: str) -> KernelSpec:
    """'package.module:name' -> the KernelSpec object it names."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"kernel: expected 'package.module:spec', got {target!r}")
    spec = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(spec, KernelSpec):
        raise SystemExit(f"kernel: expected {target} to be an oracle.kernel_spec.KernelSpec, got {type(spec).__name__}")
    return spec


def summary_table(results: dict[str, list[CaseReport]], tier: str, device: str) -> Table:
    table = Table(title=f"W4A16 parity, tier {tier}, on {device}")
    table.add_column("kernel", no_wrap=True)
    for col in ("cases", "pass", "fail", "worst err/bound", "torch err/bound", "probe rows", "probe bad", "s"):
        table.add_column(col, justify="right")
    for name, reports in results.items():
        verdicts = [r.verdict for r in reports if r.verdict is not None]
        probes = [r.probe for r in reports if r.probe is not None]
        failed = sum(not r.passed for r in reports)
        worst = max((v.worst_ratio for v in verdicts), default=float("nan"))
        base = max((v.baseline_worst_ratio or 0.0 for v in verdicts), default=float("nan"))
        table.add_row(name, str(len(reports)), str(len(reports) - failed),
                      f"[red]{failed}[/red]" if failed else "0", f"{worst:.3g}", f"{base:.3g}",
                      str(sum(p.rows for p in probes)), str(sum(p.mismatches for p in probes)),
                      f"{sum(r.seconds for r in reports):.1f}")
    return table


def report_json(results: dict[str, list[CaseReport]]) -> dict:
    return {name: [{
        "case": r.case_id, "passed": r.passed, "seconds": r.seconds, "error": r.error,
        "worst_ratio": None if r.verdict is None else r.verdict.worst_ratio,
        "violations": None if r.verdict is None else r.verdict.violations,
        "baseline_worst_ratio": None if r.verdict is None else r.verdict.baseline_worst_ratio,
        "probe_rows": None if r.probe is None else r.probe.rows,
        "probe_mismatches": None if r.probe is None else r.probe.mismatches,
        "diagnosis": r.diagnosis,
    } for r in reports] for name, reports in results.items()}


def cmd_check(args: argparse.Namespace) -> int:
    console = Console()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        # Triton kernels can only run on the CPU through the interpreter, and it must be chosen
        # before their modules are imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    specs = [load_spec(t) for t in args.kernels]
    cases = parity_cases(args.tier)
    results: dict[str, list[CaseReport]] = {}
    with Progress(console=console, transient=True) as progress:
        for spec in specs:
            todo = [c for c in cases if spec.supports(c)[0]]
            task = progress.add_task(spec.name, total=len(todo))
            results[spec.name] = check_kernel(spec, todo, args.seed, device,
                                              on_result=lambda r, t=task: progress.advance(t))
    for name, reports in results.items():
        for r in [r for r in reports if not r.passed][: args.show_failures]:
            console.print(f"[red]FAIL[/red] {name} {r.case_id}")
            for part in (r.error, r.verdict and not r.verdict.passed and r.verdict.summary(),
                         r.diagnosis and f"diagnosis: {r.diagnosis}", r.probe and not r.probe.passed and r.probe.summary()):
                if part:
                    console.print("  " + str(part).replace("\n", "\n  "), markup=False, highlight=False)
    console.print(summary_table(results, args.tier, device))
    if args.json:
        Path(args.json).write_text(json.dumps(report_json(results), indent=1))
    return 1 if any(not r.passed for reports in results.values() for r in reports) else 0


def cmd_report(args: argparse.Namespace) -> int:
    # Quoted in the report as the command that regenerates it: input names, not their folders.
    command = shlex.join(["python3", "-m", "oracle", "report", *(p.name for p in args.inputs), "--out", str(args.out),
                          *(["--no-plots"] if args.no_plots else [])])
    try:
        path = write_report(args.inputs, args.out, plots=not args.no_plots, command=command)
    except ModuleNotFoundError as e:
        raise SystemExit(f"report: plots need matplotlib ({e}); pip install 'w4a16-oracle[bench]' or pass --no-plots")
    except ValueError as e:
        raise SystemExit(f"report: {e}")
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="w4a16-oracle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the parity matrix against one or more kernels")
    check.add_argument("kernels", nargs="+", metavar="package.module:spec")
    check.add_argument("--tier", choices=TIERS, default="cpu")
    check.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--json", default=None, help="write per-case results here")
    check.add_argument("--show-failures", type=int, default=10)
    check.set_defaults(func=cmd_check)
    report = sub.add_parser("report", help="pytest-benchmark JSON from tests/benchmarks -> markdown table and plots")
    report.add_argument("inputs", nargs="+", type=Path, metavar="BENCH.json",
                        help="pytest --benchmark-json output (several: merged, later files win per cell)")
    report.add_argument("--out", type=Path, required=True, help="directory for report.md and the PNGs")
    report.add_argument("--no-plots", action="store_true", help="the markdown only (no matplotlib needed)")
    report.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
