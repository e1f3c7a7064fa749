"""`w4a16-oracle report`: pytest-benchmark JSON from tests/benchmarks -> a markdown table and plots.

Reads the `extra_info` each benchmark records (kind "matmul", "block" or "model", provider, shape
or model, M, dtype, symmetry, median_us, pct_of_floor, hybrid_impl, tokens_per_s, golden), never the
parametrize objects, and each file's provenance: the card, versions and roofline
(`machine_info.w4a16`), the command that ran it (`machine_info.w4a16.command`) and its commit
(`machine_info.w4a16.commit`, else pytest-benchmark's `commit_info`). Writes DIR/report.md (with,
per shape, the fastest of our providers against GOALS: t(16) and t(32) over t(1), dense cuBLAS over
ours at M = 16, 64, 128, 256 and 1024 up, and the peer cells ours win) and, unless told not to,
one PNG per (shape, dtype, symmetry): speed-up over dense cuBLAS and % of the W4 roofline floor
against M. matplotlib is imported only to draw (`pip install
w4a16-oracle[bench]`), so the oracle works without it.

"model" rows come from the end-to-end command (`python3 -m tests.benchmarks.model_e2e`, same JSON
shape): one per (model, workload "decode" at batch M or "prefill" of M tokens, provider), with the
file's correctness verdicts ("checks") and skipped providers ("skipped") beside them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

DENSE = "dense"
BF16 = "bf16"  # the model rows' unquantized baseline
KINDS = ("matmul", "block", "model")
# Matmul providers that are not a W4A16 kernel of ours: dense baselines and third-party peers.
BASELINES = (DENSE, "dequant_dense", "oracle")
PEERS = ("tinygemm", "gemlite")


@dataclass(frozen=True)
class Row:
    kind: str            # "matmul", "block" or "model"
    subject: str         # shape id (matmul), model (block), "<model> <decode|prefill>" (model)
    m: int
    dtype: str
    sym: str
    provider: str
    median_us: float
    pct_of_floor: float | None
    floor_us: float | None
    tokens_per_s: float | None
    hybrid_impl: str | None
    golden: str | None
    golden_detail: str | None
    source: str | None = None  # the name of the file the row came from


@dataclass(frozen=True)
class Source:
    """One input file: its name, the cells of the report it supplies, the commit and command that
    produced it (None where it does not record them)."""

    name: str
    cells: int
    commit: str | None
    command: str | None


def load(paths: Iterable[Path]) -> tuple[list[Row], list[dict]]:
    """Timed rows of every file (a later file's row replaces an earlier one for the same cell)
    and each file's machine_info."""
    rows: dict[tuple, Row] = {}
    machines = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        machines.append(data.get("machine_info", {}))
        for bench in data.get("benchmarks", []):
            e = bench.get("extra_info", {})
            if e.get("kind") not in KINDS or "median_us" not in e:
                continue
            impl = e.get("hybrid_impl")
            if isinstance(impl, dict):  # per layer, in the block proxy and the model rows
                impl = ", ".join(f"{layer}: {name}" for layer, name in impl.items())
            subject = {"matmul": e.get("shape"), "block": e.get("model"),
                       "model": f"{e.get('model')} {e.get('workload')}"}[e["kind"]]
            row = Row(e["kind"], subject, int(e["m"]), e["dtype"],
                      e["sym"], e["provider"], float(e["median_us"]), e.get("pct_of_floor"), e.get("floor_us"),
                      e.get("tokens_per_s"), impl, e.get("golden"), e.get("golden_detail"), Path(path).name)
            rows[(row.kind, row.subject, row.m, row.dtype, row.sym, row.provider)] = row
    return list(rows.values()), machines


def sources(paths: Iterable[Path], rows: list[Row]) -> list[Source]:
    """Each input's provenance, and how many of `rows` (load's merged rows) it supplies."""
    out = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        w = data.get("machine_info", {}).get("w4a16", {})
        commit = w.get("commit")
        info = data.get("commit_info") or {}
        if commit is None and info.get("id"):
            commit = info["id"][:7] + ("+" if info.get("dirty") else "")
        out.append(Source(Path(path).name, sum(r.source == Path(path).name for r in rows), commit, w.get("command")))
    return out


def _range(values: list[float], spec: str) -> str:
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def provenance_lines(paths: list[Path], rows: list[Row], machines: list[dict], command: str | None) -> list[str]:
    """The card and versions (each distinct line once), the rooflines measured, and a table of the
    inputs with the commit and command behind each: no file system paths, no dates."""
    infos = [m.get("w4a16", {}) for m in machines]
    lines = [f"- {text}" for text in dict.fromkeys(
        ", ".join(f"{k} {w[k]}" for k in ("gpu", "torch", "triton", "cuda", "gemlite") if w.get(k)) for w in infos) if text]
    roofs = [w["roofline"] for w in infos if w.get("roofline")]
    if roofs:
        lines.append(f"- roofline measured in the run{'s' if len(roofs) > 1 else ''}: HBM "
                     f"{_range([r['bytes_per_s'] / 1e12 for r in roofs], '.2f')} TB/s, dense bf16 "
                     f"{_range([r['dense_flops'] / 1e12 for r in roofs], '.0f')} TFLOP/s")
    srcs = sources(paths, rows)
    lines += ["", "Data (a later file's cell replaces an earlier one's; commit + : with uncommitted changes):", ""]
    lines += _table(["file", "cells used", "commit", "command"],
                    [[s.name, str(s.cells), s.commit or "-", f"`{s.command}`" if s.command else "-"] for s in srcs])
    if command:
        lines += ["", f"Report: `{command}`"]
    return lines


def _providers(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.provider for r in rows))


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def _cells(rows: list[Row]) -> dict[tuple, dict[str, Row]]:
    """(subject, M) -> provider -> row: subjects in the order they first appear, each one's M
    ascending, so that merged files read as one table."""
    out: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        out.setdefault((r.subject, r.m), {})[r.provider] = r
    first = {subject: i for i, (subject, _) in reversed(list(enumerate(out)))}
    return dict(sorted(out.items(), key=lambda item: (first[item[0][0]], item[0][1])))


def speedup(cell: dict[str, Row], provider: str) -> float | None:
    """Dense cuBLAS time / the provider's time on the same cell (> 1: faster than dense)."""
    if DENSE not in cell or provider not in cell:
        return None
    return cell[DENSE].median_us / cell[provider].median_us


def matmul_section(rows: list[Row], dtype: str, sym: str) -> list[str]:
    providers = _providers(rows)
    cells = _cells(rows)
    hybrid = any(r.hybrid_impl for r in rows)
    times, ratios = [], []
    for (shape, m), by in cells.items():
        floor = next((r.floor_us for r in by.values() if r.floor_us is not None), None)
        line = [shape, str(m), _fmt(floor, ".2f")]
        line += [f"{by[p].median_us:.2f} ({_fmt(by[p].pct_of_floor, '.0f')}%)" if p in by else "-" for p in providers]
        if hybrid:
            line.append(next((r.hybrid_impl for r in by.values() if r.hybrid_impl), "-"))
        times.append(line)
        ratios.append([shape, str(m)] + [_fmt(speedup(by, p), ".2f") for p in providers if p != DENSE])
    return ([f"## Matmul, {dtype} {sym}: us per call (% of the W4 roofline floor)", ""]
            + _table(["shape", "M", "floor us"] + providers + (["hybrid chose"] if hybrid else []), times)
            + ["", f"## Matmul, {dtype} {sym}: speed-up over dense cuBLAS (dense us / provider us)", ""]
            + _table(["shape", "M"] + [p for p in providers if p != DENSE], ratios) + [""])


@dataclass(frozen=True)
class Goal:
    """A target for the best of our providers on one shape: `value` of its cells by M (None where
    not measured) against `bound`, met at or below it (`at_most`) or at or above it."""

    label: str
    value: Callable[[dict[int, dict[str, Row]]], float | None]
    bound: float
    at_most: bool

    def met(self, v: float) -> bool:
        return v <= self.bound if self.at_most else v >= self.bound


def ours(cell: dict[str, Row]) -> float | None:
    """The fastest time of our providers (not a baseline, not a peer) in a cell."""
    times = [r.median_us for p, r in cell.items() if p not in BASELINES + PEERS]
    return min(times) if times else None


def _over_m1(m: int, min_floor_us: float) -> Callable[[dict[int, dict[str, Row]]], float | None]:
    """Our time at M over our time at M = 1, where the M = 1 floor is at least min_floor_us (below
    it launch overhead sets both)."""
    def value(by_m: dict[int, dict[str, Row]]) -> float | None:
        one, at = by_m.get(1, {}), by_m.get(m, {})
        floor = next((r.floor_us for r in one.values() if r.floor_us is not None), None)
        if floor is None or floor < min_floor_us or ours(one) is None or ours(at) is None:
            return None
        return ours(at) / ours(one)
    return value


def _over_dense(at: Callable[[int], bool]) -> Callable[[dict[int, dict[str, Row]]], float | None]:
    """Dense time over ours, the worst over the measured M that `at` selects."""
    def value(by_m: dict[int, dict[str, Row]]) -> float | None:
        ratios = [cell[DENSE].median_us / t for m, cell in by_m.items()
                  if at(m) and DENSE in cell and (t := ours(cell)) is not None]
        return min(ratios) if ratios else None
    return value


GOALS = (
    Goal("t(16) / t(1) <= 1.2", _over_m1(16, 7.0), 1.2, True),
    Goal("t(32) / t(1) <= 1.5", _over_m1(32, 7.0), 1.5, True),
    Goal("M 16: dense / ours >= 2.5", _over_dense(lambda m: m == 16), 2.5, False),
    Goal("M 64: >= 1.3", _over_dense(lambda m: m == 64), 1.3, False),
    Goal("M 128: >= 1.3", _over_dense(lambda m: m == 128), 1.3, False),
    Goal("M 256: >= 1.0", _over_dense(lambda m: m == 256), 1.0, False),
    Goal("M >= 1024 (worst): >= 0.9", _over_dense(lambda m: m >= 1024), 0.9, False),
)


def goals_section(rows: list[Row], dtype: str, sym: str) -> list[str]:
    """Per shape, the best of our providers against GOALS, and the cells where a peer was measured
    that we win. Empty where no shape has a goal's cells."""
    by_shape: dict[str, dict[int, dict[str, Row]]] = {}
    for (shape, m), cell in _cells(rows).items():
        by_shape.setdefault(shape, {})[m] = cell
    body = []
    for shape, by_m in by_shape.items():
        values = [g.value(by_m) for g in GOALS]
        peer_cells = [cell for cell in by_m.values() if any(p in cell for p in PEERS) and ours(cell) is not None]
        won = sum(all(ours(cell) < cell[p].median_us for p in PEERS if p in cell) for cell in peer_cells)
        if all(v is None for v in values) and not peer_cells:
            continue
        line = [shape] + ["-" if v is None else f"{v:.2f} {'met' if g.met(v) else 'missed'}"
                          for g, v in zip(GOALS, values)]
        line.append(f"{won} of {len(peer_cells)}" if peer_cells else "-")
        body.append(line)
    if not body:
        return []
    return ([f"## Matmul, {dtype} {sym}: the best of our providers against the goals", "",
             ("Ratios of times; t(M) / t(1) only where the M = 1 floor is 7 us or more; peers: the cells where "
              "ours beat every peer measured."), ""]
            + _table(["shape"] + [g.label for g in GOALS] + ["faster than the peers"], body) + [""])


def block_section(rows: list[Row]) -> list[str]:
    providers = _providers(rows)
    body = []
    for (model, m), by in _cells(rows).items():
        body.append([model, str(m)] + [f"{by[p].tokens_per_s:,.0f} ({_fmt(by[p].pct_of_floor, '.0f')}%)"
                                       if p in by and by[p].tokens_per_s else "-" for p in providers])
    return (["## Decode proxy: tokens/s per transformer block, linear layers only (% of the W4 floor)", ""]
            + _table(["model", "M"] + providers, body) + [""])


def model_section(rows: list[Row], notes: dict[str, dict[str, str]]) -> list[str]:
    """Whole-model rows: tokens/s and ms per provider for each workload, the speed-up over bf16,
    then each provider's correctness verdict and the providers skipped. notes: the files'
    "checks" and "skipped" ({provider: text}), later files first."""
    providers = _providers(rows)
    body, ratios = [], []
    for (subject, m), by in _cells(rows).items():
        model, _, workload = subject.rpartition(" ")
        label = f"decode, batch {m}" if workload == "decode" else f"{workload}, {m} tokens"
        line = [model, label]
        for p in providers:
            r = by.get(p)
            if r is None or r.tokens_per_s is None:
                line.append("-")
                continue
            cell = f"{r.tokens_per_s:,.1f} tok/s, {r.median_us / 1e3:.2f} ms"
            if r.pct_of_floor is not None:
                cell += f" ({r.pct_of_floor:.0f}% of {r.floor_us / 1e3:.2f} ms)"
            line.append(cell)
        body.append(line)
        base = by.get(BF16)
        ratios.append([model, label] + [_fmt(base.median_us / by[p].median_us if base and p in by else None, ".2f")
                                        for p in providers if p != BF16])
    impls: dict[str, list[str]] = {}
    for r in rows:
        if r.hybrid_impl:
            names = {part.rpartition(": ")[2] for part in r.hybrid_impl.split(", ")}
            what = names.pop() if len(names) == 1 else r.hybrid_impl
            impls.setdefault(r.provider, []).append(f"{r.subject.rpartition(' ')[2]} {r.m}: {what}")
    out = ["## Model end to end: tokens/s and ms (decode: per step in a CUDA graph; prefill: latency)", "",
           "Decode cells give % of the step's own floor: the weight bytes the step reads (each provider's own "
           "form; the embedding's rows left out) / the HBM bandwidth measured in the run.", ""]
    out += _table(["model", "workload"] + providers, body) + [""]
    if any(p != BF16 for p in providers) and BF16 in providers:
        out += ["### Speed-up over bf16 (bf16 ms / provider ms)", ""]
        out += _table(["model", "workload"] + [p for p in providers if p != BF16], ratios) + [""]
    if impls:
        out += ["Implementations the hybrid op took (the first block's layers):", ""]
        out += [f"- {p}: {', '.join(parts)}" for p, parts in impls.items()] + [""]
    checks, skipped = notes.get("checks", {}), notes.get("skipped", {})
    if checks:
        out += ["### Correctness before timing (tests/support/model_check.py)", ""]
        out += [f"- {p}: " + "; ".join(line.strip() for line in text.strip().splitlines()) for p, text in checks.items()]
        out.append("")
    if skipped:
        out += [f"- skipped {p}: {why}" for p, why in skipped.items()] + [""]
    return out


def model_notes(paths: Iterable[Path]) -> dict[str, dict[str, str]]:
    """{"checks": {provider: verdict}, "skipped": {provider: why}} merged over the files (a later
    file's entry replaces an earlier one's)."""
    notes: dict[str, dict[str, str]] = {"checks": {}, "skipped": {}}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for key in notes:
            notes[key].update(data.get(key) or {})
    return notes


def golden_section(rows: list[Row]) -> list[str]:
    out = [r for r in rows if r.golden in ("slower", "faster")]
    if not out:
        return []
    return (["## Out of golden band", ""]
            + [f"- {'REGRESSION' if r.golden == 'slower' else 'IMPROVED'} {r.kind} {r.subject} M={r.m} {r.dtype} "
               f"{r.sym} {r.provider}: {r.golden_detail}" for r in out] + [""])


def plot_name(shape: str, dtype: str, sym: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{shape}-{dtype}-{sym}") + ".png"


def plot(rows: list[Row], path: Path, title: str) -> None:
    """Two panels against M (log 2 axis): speed-up over dense, % of the W4 floor; a line per provider."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    cells = _cells(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p in _providers(rows):
        ms = sorted(m for (_, m), by in cells.items() if p in by)
        ups = [speedup(cells[(rows[0].subject, m)], p) for m in ms]
        pcts = [cells[(rows[0].subject, m)][p].pct_of_floor for m in ms]
        if any(u is not None for u in ups):
            left.plot(ms, [float("nan") if u is None else u for u in ups], marker="o", label=p)
        if any(v is not None for v in pcts):
            right.plot(ms, [float("nan") if v is None else v for v in pcts], marker="o", label=p)
    for ax, label in ((left, "speed-up over dense cuBLAS"), (right, "% of W4 roofline floor")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    left.axhline(1.0, color="grey", linewidth=0.8)
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(paths: list[Path], out: Path, plots: bool = True, command: str | None = None) -> Path:
    """Writes out/report.md (and the PNGs it links); returns the markdown's path. command: the
    command that regenerates the report, quoted in it."""
    rows, machines = load(paths)
    if not rows:
        raise ValueError(f"no timed tests/benchmarks results in {[str(p) for p in paths]}")
    out.mkdir(parents=True, exist_ok=True)
    gpus = list(dict.fromkeys(m.get("w4a16", {}).get("gpu") for m in machines if m.get("w4a16", {}).get("gpu")))
    lines = [f"# W4A16 benchmarks{' on ' + ', '.join(gpus) if gpus else ''}", "",
             *provenance_lines(paths, rows, machines, command), ""]
    if any(r.kind != "model" for r in rows):
        lines += ["Times are medians of CUDA-graph replays over cold weight copies (per call); the floor is the W4 "
                  "problem's: max(bytes / HBM bandwidth, 2MNK / dense bf16 rate).", ""]
    matmul = [r for r in rows if r.kind == "matmul"]
    for dtype, sym in dict.fromkeys((r.dtype, r.sym) for r in matmul):
        group = [r for r in matmul if (r.dtype, r.sym) == (dtype, sym)]
        lines += matmul_section(group, dtype, sym)
        lines += goals_section(group, dtype, sym)
        if plots:
            lines += ["### Plots", ""]
            for shape in dict.fromkeys(r.subject for r in group):
                name = plot_name(shape, dtype, sym)
                plot([r for r in group if r.subject == shape], out / name, f"{shape} {dtype} {sym}")
                lines.append(f"![{shape}]({name})")
            lines.append("")
    blocks = [r for r in rows if r.kind == "block"]
    if blocks:
        lines += block_section(blocks)
    models = [r for r in rows if r.kind == "model"]
    if models:
        lines += model_section(models, model_notes(paths))
    lines += golden_section(rows)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
