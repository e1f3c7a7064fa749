"""`w4a16-oracle report`: pytest-benchmark JSON from tests/benchmarks -> a markdown table and plots.

Reads the `extra_info` each benchmark records (kind "matmul" or "block", provider, shape, M,
dtype, symmetry, median_us, pct_of_floor, hybrid_impl, tokens_per_s, golden), never the
parametrize objects. Writes DIR/report.md and, unless told not to, one PNG per (shape, dtype,
symmetry): speed-up over dense cuBLAS and % of the W4 roofline floor against M. matplotlib is
imported only to draw (`pip install w4a16-oracle[bench]`), so the oracle works without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DENSE = "dense"


@dataclass(frozen=True)
class Row:
    kind: str            # "matmul" or "block"
    subject: str         # shape id (matmul) or model (block)
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
            if e.get("kind") not in ("matmul", "block") or "median_us" not in e:
                continue
            impl = e.get("hybrid_impl")
            if isinstance(impl, dict):  # per layer, in the block proxy
                impl = ", ".join(f"{layer}: {name}" for layer, name in impl.items())
            row = Row(e["kind"], e["shape"] if e["kind"] == "matmul" else e["model"], int(e["m"]), e["dtype"],
                      e["sym"], e["provider"], float(e["median_us"]), e.get("pct_of_floor"), e.get("floor_us"),
                      e.get("tokens_per_s"), impl, e.get("golden"), e.get("golden_detail"))
            rows[(row.kind, row.subject, row.m, row.dtype, row.sym, row.provider)] = row
    return list(rows.values()), machines


def _providers(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.provider for r in rows))


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def _cells(rows: list[Row]) -> dict[tuple, dict[str, Row]]:
    """(subject, M) -> provider -> row, in the rows' order."""
    out: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        out.setdefault((r.subject, r.m), {})[r.provider] = r
    return out


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


def block_section(rows: list[Row]) -> list[str]:
    providers = _providers(rows)
    body = []
    for (model, m), by in _cells(rows).items():
        body.append([model, str(m)] + [f"{by[p].tokens_per_s:,.0f} ({_fmt(by[p].pct_of_floor, '.0f')}%)"
                                       if p in by and by[p].tokens_per_s else "-" for p in providers])
    return (["## Decode proxy: tokens/s per transformer block, linear layers only (% of the W4 floor)", ""]
            + _table(["model", "M"] + providers, body) + [""])


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


def machine_lines(machines: list[dict]) -> list[str]:
    lines = []
    for info in machines:
        w = info.get("w4a16", {})
        roof = w.get("roofline")
        text = ", ".join(f"{k} {w[k]}" for k in ("gpu", "torch", "triton", "cuda") if w.get(k))
        if roof:
            text += (f"; roofline measured in the run: HBM {roof['bytes_per_s'] / 1e12:.2f} TB/s, "
                     f"dense bf16 {roof['dense_flops'] / 1e12:.0f} TFLOP/s")
        if text:
            lines.append(f"- {text}")
    return lines


def write_report(paths: list[Path], out: Path, plots: bool = True) -> Path:
    """Writes out/report.md (and the PNGs it links); returns the markdown's path."""
    rows, machines = load(paths)
    if not rows:
        raise ValueError(f"no timed tests/benchmarks results in {[str(p) for p in paths]}")
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# W4A16 benchmarks", "", "Inputs: " + ", ".join(f"`{p}`" for p in paths), *machine_lines(machines), "",
             "Times are medians of CUDA-graph replays over cold weight copies (per call); the floor is the W4 "
             "problem's: max(bytes / HBM bandwidth, 2MNK / dense bf16 rate).", ""]
    matmul = [r for r in rows if r.kind == "matmul"]
    for dtype, sym in dict.fromkeys((r.dtype, r.sym) for r in matmul):
        group = [r for r in matmul if (r.dtype, r.sym) == (dtype, sym)]
        lines += matmul_section(group, dtype, sym)
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
    lines += golden_section(rows)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
