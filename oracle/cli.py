"""`w4a16-oracle`: judge kernels over the parity matrix from the command line, and turn benchmark
results into a report."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .tiers import TIERS

# Columns a table keeps when output goes to a log instead of a terminal, so no column is cut.
LOG_WIDTH = 160
# A progress line in a log at most this often (seconds), and at every 10% of the cases.
LOG_EVERY_S = 15.0


def load_spec(target: str):
    """'package.module:name' -> the oracle.KernelSpec object it names; SystemExit with what was
    expected and what was found otherwise."""
    from .kernel_spec import KernelSpec

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"kernel: expected 'package.module:spec', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        where = "" if e.name == module_name else f" (it imports {e.name!r}, which is not installed)"
        raise SystemExit(f"kernel: expected an importable module {module_name!r} in {target!r}, "
                         f"but it could not be imported{where}; is it on PYTHONPATH?") from None
    if not hasattr(module, attr):
        specs = sorted(name for name, value in vars(module).items() if isinstance(value, KernelSpec))
        raise SystemExit(f"kernel: expected {module_name!r} to define {attr!r}, but it does not "
                         f"(KernelSpec objects there: {specs or 'none'})")
    spec = getattr(module, attr)
    if not isinstance(spec, KernelSpec):
        raise SystemExit(f"kernel: expected {target} to be an oracle.kernel_spec.KernelSpec, "
                         f"got {type(spec).__name__}")
    return spec


def summary_table(kernels: dict[str, list[dict]], title: str, seconds: bool = True) -> Table:
    """One row per kernel from per-case result dicts (`report_json`'s "kernels"); seconds: show the
    time column (left out where runs on other machines are merged)."""
    table = Table(title=title)
    table.add_column("kernel", no_wrap=True)
    columns = ("cases", "pass", "fail", "worst err/bound", "torch err/bound", "probe rows", "probe bad")
    for col in columns + (("s",) if seconds else ()):
        table.add_column(col, justify="right", no_wrap=True)
    for name, rows in kernels.items():
        failed = sum(not r["passed"] for r in rows)
        ratios = [r["worst_ratio"] for r in rows if r["worst_ratio"] is not None]
        base = [r["baseline_worst_ratio"] or 0.0 for r in rows if r["worst_ratio"] is not None]
        cells = [name, str(len(rows)), str(len(rows) - failed), f"[red]{failed}[/red]" if failed else "0",
                 f"{max(ratios, default=float('nan')):.3g}", f"{max(base, default=float('nan')):.3g}",
                 str(sum(r["probe_rows"] or 0 for r in rows)), str(sum(r["probe_mismatches"] or 0 for r in rows))]
        table.add_row(*cells, *([f"{sum(r['seconds'] for r in rows):.1f}"] if seconds else []))
    return table


def report_json(results: dict, meta: dict) -> dict:
    return {"kind": "parity", **meta, "kernels": {name: [{
        "case": r.case_id, "passed": r.passed, "seconds": r.seconds, "phases": r.phases, "error": r.error,
        "worst_ratio": None if r.verdict is None else r.verdict.worst_ratio,
        "violations": None if r.verdict is None else r.verdict.violations,
        "baseline_worst_ratio": None if r.verdict is None else r.verdict.baseline_worst_ratio,
        "probe_rows": None if r.probe is None else r.probe.rows,
        "probe_mismatches": None if r.probe is None else r.probe.mismatches,
        "diagnosis": r.diagnosis, "notes": r.notes,
    } for r in reports] for name, reports in results.items()}}


class LogProgress:
    """Progress as plain lines, for output that is not a terminal: a line at every 10% of the
    work and at least every LOG_EVERY_S seconds, with the count and the time left."""

    def __init__(self, console: Console, total: int, clock) -> None:
        self.console, self.total, self.clock = console, total, clock
        self.done = self.failed = 0
        self.last_line, self.last_tenth = time.perf_counter(), 0

    def advance(self, passed: bool) -> None:
        from .runner import format_seconds

        self.done += 1
        self.failed += not passed
        tenth = 10 * self.done // max(1, self.total)
        if tenth > self.last_tenth or time.perf_counter() - self.last_line >= LOG_EVERY_S or self.done == self.total:
            self.last_tenth, self.last_line = tenth, time.perf_counter()
            self.console.print(f"progress: {self.done}/{self.total} ({100 * self.done // max(1, self.total)}%), "
                               f"{self.failed} failed, {format_seconds(self.clock.elapsed)} elapsed, "
                               f"about {format_seconds(self.clock.remaining)} left", highlight=False)


def devices_for(args: argparse.Namespace) -> list[str]:
    """The device of each worker process."""
    import torch

    if args.gpus:
        count = torch.cuda.device_count()
        if count == 0:
            raise SystemExit("--gpus: expected a machine with CUDA or ROCm devices, found none")
        if args.gpus == "all":
            ids = list(range(count))
        else:
            try:
                ids = [int(v) for v in args.gpus.split(",")] if "," in args.gpus else list(range(int(args.gpus)))
            except ValueError:
                raise SystemExit(f"--gpus: expected 'all', a count or a comma-separated list of ids, "
                                 f"got {args.gpus!r}") from None
            bad = [i for i in ids if not 0 <= i < count]
            if bad or not ids:
                raise SystemExit(f"--gpus: expected ids in 0..{count - 1}, got {args.gpus!r}")
        return [f"cuda:{i}" for i in ids]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers = args.workers or ((os.cpu_count() or 1) if device == "cpu" else 1)
    return [device] * workers


def cmd_check(args: argparse.Namespace) -> int:
    from .runner import Clock, case_cost, estimate_seconds, format_seconds, parse_shard, run_workers, shard

    terminal = sys.stdout.isatty()
    console = Console() if terminal else Console(width=LOG_WIDTH)
    devices = devices_for(args)
    if devices[0] == "cpu":
        # Triton kernels can only run on the CPU through the interpreter, and it must be chosen
        # before their modules are imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    specs = [load_spec(t) for t in args.kernels]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SystemExit(f"kernels: expected distinct KernelSpec names, got {names}")
    from .cases import parity_cases
    from .check import CaseReport, check_kernels, probe_key

    cases = parity_cases(args.tier)
    if args.shard:
        try:
            index, count = parse_shard(args.shard)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        cases = shard(cases, index, count)
    todo = {s.name: [c for c in cases if s.supports(c)[0]] for s in specs}
    costs: dict[tuple[str, str], float] = {}
    for name, own in todo.items():
        seen: set[tuple] = set()
        for c in own:
            key = probe_key(c)
            costs[(name, c.id)] = case_cost(c, key not in seen)
            seen.add(key)
    total = sum(len(v) for v in todo.values())
    where = devices[0] if len(set(devices)) == 1 else ", ".join(devices)
    line = f"tier {args.tier}: {total} checks ({len(cases)} cases x {len(specs)} kernels) on {where}, " \
           f"{len(devices)} worker{'s' if len(devices) > 1 else ''}"
    if devices[0] == "cpu":
        line += f"; estimated {format_seconds(estimate_seconds(cases, len(specs), len(devices)))} on a 2-core machine"
    console.print(line, highlight=False)
    work = {s.name: sum(v for (k, _), v in costs.items() if k == s.name) for s in specs}
    clock = Clock(work, len(devices))
    results: dict[str, list[CaseReport]] = {s.name: [] for s in specs}
    start = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, transient=True) if terminal else None
    log = None if terminal else LogProgress(console, total, clock)
    task = progress.add_task("checking", total=total, failed=0) if progress else None
    failed = 0

    def on_result(r: CaseReport) -> None:
        nonlocal failed
        results[r.kernel].append(r)
        clock.advance(r.kernel, costs.get((r.kernel, r.case_id), 0.0), r.seconds)
        failed += not r.passed
        if progress is not None:
            progress.update(task, advance=1, failed=failed)
        else:
            log.advance(r.passed)

    errors: list[str] = []
    if progress is not None:
        progress.start()
    try:
        if len(devices) == 1:
            check_kernels(specs, cases, args.seed, devices[0], on_result=on_result)
        else:
            env = {k: v for k, v in os.environ.items() if k in ("TRITON_INTERPRET", "PYTHONPATH")}
            errors = run_workers(list(args.kernels), cases, devices, args.seed, on_result, env)
    finally:
        if progress is not None:
            progress.stop()
    order = {c.id: i for i, c in enumerate(cases)}
    for reports in results.values():
        reports.sort(key=lambda r: order[r.case_id])
    for name, reports in results.items():
        for r in [r for r in reports if not r.passed][: args.show_failures]:
            console.print(f"[red]FAIL[/red] {name} {r.case_id}")
            for part in (r.error, r.verdict and not r.verdict.passed and r.verdict.summary(),
                         r.diagnosis and f"diagnosis: {r.diagnosis}",
                         r.probe and not r.probe.passed and r.probe.summary()):
                if part:
                    console.print("  " + str(part).replace("\n", "\n  "), markup=False, highlight=False)
    for name, reports in results.items():
        notes: dict[str, int] = {}
        for r in reports:
            for note in r.notes:
                notes[note] = notes.get(note, 0) + 1
        for note, count in notes.items():
            console.print(f"[yellow]NOTE[/yellow] {name}, {count} case(s): {note}", highlight=False)
    for e in errors:
        console.print(f"[red]ERROR[/red] {e}", highlight=False)
    wall = time.perf_counter() - start
    meta = {"tier": args.tier, "shard": args.shard, "devices": devices, "seed": args.seed, "wall_seconds": wall}
    data = report_json(results, meta)
    console.print(summary_table(data["kernels"], f"W4A16 parity, tier {args.tier}, on {where}"))
    console.print(f"{sum(len(r) for r in results.values())} checks in {format_seconds(wall)}, seed {args.seed}",
                  highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    missing = total - sum(len(r) for r in results.values())
    return 1 if errors or missing or any(not r.passed for reports in results.values() for r in reports) else 0


def merge_parity(inputs: list[Path]) -> dict:
    """Parity JSON files (`check --json`, e.g. one per shard) as one: every kernel's cases from all
    of them, in case order, with each file's shard, devices and seed. A case present twice is an
    error: shards are disjoint."""
    merged: dict[str, dict[str, dict]] = {}
    runs = []
    for path in inputs:
        data = json.loads(Path(path).read_text())
        runs.append({k: data.get(k) for k in ("tier", "shard", "devices", "seed", "wall_seconds")}
                    | {"file": path.name})
        for name, rows in data["kernels"].items():
            own = merged.setdefault(name, {})
            for row in rows:
                if row["case"] in own:
                    raise SystemExit(f"report: expected disjoint shards, but {name} {row['case']} is in two files")
                own[row["case"]] = row
    tiers = {r["tier"] for r in runs}
    if len(tiers) != 1:
        raise SystemExit(f"report: expected files of one tier, got {sorted(map(str, tiers))}")
    from .cases import parity_cases

    order = {c.id: i for i, c in enumerate(parity_cases(tiers.pop()))}
    kernels = {name: sorted(rows.values(), key=lambda r: order.get(r["case"], len(order)))
               for name, rows in merged.items()}
    return {"kind": "parity", "runs": runs, "kernels": kernels}


def cmd_report(args: argparse.Namespace) -> int:
    kinds = {json.loads(Path(p).read_text()).get("kind") for p in args.inputs}
    if kinds == {"parity"}:
        merged = merge_parity(args.inputs)
        console = Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)
        shards = ", ".join(str(r["shard"] or "all") for r in merged["runs"])
        title = f"W4A16 parity, tier {merged['runs'][0]['tier']}, shards {shards}"
        console.print(summary_table(merged["kernels"], title, seconds=False))
        if args.json:
            Path(args.json).write_text(json.dumps(merged, indent=1))
        return 1 if any(not r["passed"] for rows in merged["kernels"].values() for r in rows) else 0
    if "parity" in kinds:
        raise SystemExit("report: expected all parity JSON (check --json) or all benchmark JSON, got a mix")
    if args.out is None:
        raise SystemExit("report: benchmark JSON needs --out DIR for report.md and its plots")
    from .report import write_report

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
    check.add_argument("--workers", type=int, default=None,
                       help="processes sharing the cases (default: every CPU core on cpu, 1 on a GPU)")
    check.add_argument("--gpus", default=None,
                       help="'all', a count or comma-separated ids: one worker process per GPU")
    check.add_argument("--shard", default=None, metavar="i/n",
                       help="run only share i of n (whole weight groups, disjoint, together complete)")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--json", default=None, help="write per-case results here")
    check.add_argument("--show-failures", type=int, default=10)
    check.set_defaults(func=cmd_check)
    report = sub.add_parser("report", help="merge parity shards into one table, or turn pytest-benchmark JSON from "
                                           "tests/benchmarks into a markdown report with plots")
    report.add_argument("inputs", nargs="+", type=Path, metavar="FILE.json",
                        help="`check --json` files (e.g. one per shard), or pytest --benchmark-json output "
                             "(several: merged, later files win per cell)")
    report.add_argument("--out", type=Path, default=None, help="benchmark JSON: directory for report.md and the PNGs")
    report.add_argument("--json", default=None, help="parity JSON: write the merged per-case results here")
    report.add_argument("--no-plots", action="store_true", help="the markdown only (no matplotlib needed)")
    report.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    if args.command == "check" and args.workers is not None and args.workers < 1:
        parser.error(f"--workers: expected at least 1, got {args.workers}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
