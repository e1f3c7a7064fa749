"""Measured decisions for a device's policy file, from pytest-benchmark JSON of tests/benchmarks.

    python3 -m tools.fit_policy out/bench.json out/sweep.json              # propose (prints markdown)
    python3 -m tools.fit_policy out/*.json --write                         # write optimized/policies/<device>.json
    python3 -m tools.fit_policy out/*.json --policy-out out/h200.json      # write the updated file elsewhere

Run from the repository root. What it reads from the benchmark cells (matmul cells; a later file's
cell replaces an earlier one's) and proposes, with the rules of optimized/policy.py:

* hybrid: transient_min_m from the transient and triton cells, skinny_max_m from the skinny cells
  against the path that runs without it (Triton, or the transient path from transient_min_m on),
  dense_min_m from the dense and triton cells (per M the geometric mean over the shapes of the time
  ratio; `policy.dense_min_m`, `policy.against_fallback`, `policy.skinny_max_m`);
* triton: per bucket of the device's tile table, the `triton@<tile>` candidate with the highest
  geometric mean of % of the floor over the cells of that bucket's M (`policy.best_tile`);
* skinny: a score of the thresholds as they are: per cell, the time of the skinny kernel's own
  choice ("skinny") over the fastest `skinny@<kernel>` there (`policy.choice_score`); recorded as
  the skinny section's "score" with --write, not a change of any threshold.

Each written decision gets evidence {command, commit, summary}: the benchmark commands the files
record and this command, the commit of `git rev-parse --short HEAD`, the numbers in one line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from optimized import policy
from oracle.report import load

ROOT = Path(__file__).resolve().parents[1]


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def by_provider(rows) -> tuple[dict[str, dict[tuple, object]], list[str]]:
    """(provider -> (shape, dtype, sym, M) -> row, matmul cells only; the cells left out). A cell
    its run found slower than its golden band is left out: a disturbed measurement must not move a
    threshold, and a real slowdown is for tests.benchmarks.control to confirm before the goldens and
    the policy follow it."""
    out: dict[str, dict[tuple, object]] = defaultdict(dict)
    left_out = []
    for r in rows:
        if r.kind != "matmul":
            continue
        if r.golden == "slower":
            left_out.append(f"{r.subject} M={r.m} {r.provider}")
            continue
        out[r.provider][(r.subject, r.dtype, r.sym, r.m)] = r
    return out, left_out


def ratio_by_m(cells: dict, a: str, b: str) -> dict[int, float]:
    """M -> geometric mean over the cells measured for both of a's time / b's time."""
    ratios: dict[int, list[float]] = defaultdict(list)
    for key, row in cells.get(a, {}).items():
        if key in cells.get(b, {}):
            ratios[key[3]].append(row.median_us / cells[b][key].median_us)
    return {m: policy.geometric_mean(v) for m, v in sorted(ratios.items())}


def span(values) -> str:
    lo, hi = f"{min(values := list(values)):.2f}", f"{max(values):.2f}"
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def fit_from_m(ratios: dict[int, float], what: str, field: str, current: int) -> tuple[int, str]:
    """(the smallest M from which `what` beats Triton at every measured M, or `current` where it
    does not, and the sentence saying so); ratios: M -> its time / Triton's."""
    fitted = policy.dense_min_m(ratios) if ratios else None
    if fitted is not None:
        return fitted, (f"{what} took {span(r for m, r in ratios.items() if m >= fitted)} Triton's time from "
                        f"M {fitted} on (measured to M {max(ratios)})")
    return current, f"{field} kept (" + (f"{what} not measured" if not ratios else
                                         f"{what} slower than Triton at M {max(ratios)}") + ")"


def fit_hybrid(cells: dict, current: policy.HybridThresholds, device: str) -> dict | None:
    skinny, dense = ratio_by_m(cells, "skinny", "triton"), ratio_by_m(cells, "dense", "triton")
    transient = ratio_by_m(cells, "transient", "triton")
    if not skinny and not dense and not transient:
        return None
    shapes = len({key[0] for c in ("skinny", "dense", "transient") for key in cells.get(c, {})})
    out = {"skinny_max_m": current.skinny_max_m}
    out["transient_min_m"], said = fit_from_m(transient, "the transient path", "transient_min_m",
                                              current.transient_min_m)
    parts = [said]
    times = {name: {key: r.median_us for key, r in cells.get(name, {}).items()}
             for name in ("skinny", "triton", "transient")}
    rival = policy.against_fallback(times["skinny"], times["triton"], times["transient"], out["transient_min_m"])
    if rival:
        out["skinny_max_m"] = policy.skinny_max_m(rival)
        what = f"the time of Triton below M {out['transient_min_m']} and the transient path from it"
        won = [r for m, r in rival.items() if m <= out["skinny_max_m"]]
        lost = [m for m in rival if m > out["skinny_max_m"]]
        if not won:
            parts.append(f"skinny slower than {what} from M {min(rival)} ({rival[min(rival)]:.2f}x)")
        else:
            parts.append(f"skinny took {span(won)} {what} at every M up to {out['skinny_max_m']}"
                         + (f" ({rival[min(lost)]:.2f}x at M {min(lost)})" if lost else ""))
    else:
        parts.append("skinny_max_m kept (skinny not measured)")
    out["dense_min_m"], said = fit_from_m(dense, "the dense GEMM", "dense_min_m", current.dense_min_m)
    parts.append(said)
    return out | {"summary": f"{device}, {shapes} shapes, per-M geometric means: " + "; ".join(parts)}


def fit_triton(cells: dict, table, device: str) -> list[dict]:
    """Per bucket with triton@ cells: the winner, its score and the runner-up and table's scores."""
    out = []
    forced = {name.removeprefix("triton@"): c for name, c in cells.items() if name.startswith("triton@")}
    for index, (lo, hi) in enumerate(policy.bucket_ranges(table)):
        def inside(key) -> bool:
            return lo <= key[3] and (hi is None or key[3] <= hi)
        pcts = {tile: {key: r.pct_of_floor for key, r in c.items() if inside(key) and r.pct_of_floor}
                for tile, c in forced.items()}
        pcts = {tile: p for tile, p in pcts.items() if p}
        best = policy.best_tile(pcts)
        if best is None:
            continue
        tile, score = best
        keys = set(pcts[tile])
        others = sorted(((policy.geometric_mean(p[k] for k in keys), t) for t, p in pcts.items()
                         if t != tile and keys <= set(p)), reverse=True)
        table_pct = [cells.get("triton", {}).get(k) for k in keys]
        table_score = policy.geometric_mean(r.pct_of_floor for r in table_pct) if all(
            r is not None and r.pct_of_floor for r in table_pct) else None
        ms = sorted({k[3] for k in keys})
        summary = (f"{device}, {len({k[0] for k in keys})} shapes x M {','.join(map(str, ms))}: {score:.1f}% of the "
                   f"floor (geometric mean)" + (f" against {others[0][0]:.1f}% for {others[0][1]}" if others else "")
                   + (f" and {table_score:.1f}% for the table before" if table_score else ""))
        every = set().union(*(set(p) for p in pcts.values()))
        left_out = sorted(t for t, p in pcts.items() if not every <= set(p))
        out.append({"bucket": index, "max_m": hi, "tile": tile, "score": score, "summary": summary,
                    "candidates": len(pcts), "left_out": left_out})
    return out


def score_skinny(cells: dict, device: str) -> dict | None:
    kernels: dict[tuple, dict[str, float]] = defaultdict(dict)
    for name, c in cells.items():
        if name.startswith("skinny@"):
            for key, r in c.items():
                kernels[key][name.removeprefix("skinny@")] = r.median_us
    choice = {key: r.median_us for key, r in cells.get("skinny", {}).items()}
    s = policy.choice_score(choice, kernels)
    if s is None:
        return None
    shape, dtype, sym, m = s["worst_cell"]
    by_m = {m_: policy.choice_score({k: v for k, v in choice.items() if k[3] == m_}, kernels)
            for m_ in sorted({k[3] for k in choice})}
    s["by_m"] = {m_: v for m_, v in by_m.items() if v}
    s["summary"] = (f"{device}, {s['cells']} cells: the default took {s['geomean']:.3f}x the fastest kernel's time "
                    f"(geometric mean), {s['worst']:.3f}x at worst ({shape} M={m} {dtype} {sym}, where "
                    f"{s['fastest_there']} was fastest)")
    return s


def evidence(command: str, commit: str, summary: str) -> dict:
    return {"command": command, "commit": commit, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.fit_policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, metavar="BENCH.json")
    parser.add_argument("--device", default=None, help="the device name (default: the one the files record)")
    parser.add_argument("--write", action="store_true", help="write the decisions into optimized/policies/<device>.json")
    parser.add_argument("--policy-out", type=Path, default=None, help="write the updated policy file here instead")
    parser.add_argument("--out", type=Path, default=None, help="also write the proposal as DIR/fit.json and DIR/fit.md")
    args = parser.parse_args(argv)
    rows, machines = load(args.inputs)
    devices = {m.get("w4a16", {}).get("gpu") for m in machines} - {None}
    if args.device is None and len(devices) != 1:
        parser.error(f"the files record {sorted(devices) or 'no'} devices: name one with --device")
    device = args.device or devices.pop()
    current = policy.policy_for(device)
    path = policy.POLICY_DIR / f"{current.name}.json"
    commands = list(dict.fromkeys(m.get("w4a16", {}).get("command") for m in machines if m.get("w4a16", {}).get("command")))
    command = "; ".join(commands + [shlex.join(["python3", "-m", "tools.fit_policy", *(p.name for p in args.inputs)])])
    commit = head_commit()
    cells, left_out = by_provider(rows)

    hybrid = fit_hybrid(cells, current.hybrid, device)
    if hybrid and left_out:
        hybrid["summary"] += f" (left out, slower than their golden band in their run: {'; '.join(left_out)})"
    triton = fit_triton(cells, current.triton, device)
    skinny = score_skinny(cells, device)
    lines = [f"# Policy fit for {device} ({path.relative_to(ROOT)})", ""]
    if hybrid:
        lines.append(f"- hybrid: skinny_max_m {current.hybrid.skinny_max_m} -> {hybrid['skinny_max_m']}, transient_min_m "
                     f"{current.hybrid.transient_min_m} -> {hybrid['transient_min_m']}, dense_min_m "
                     f"{current.hybrid.dense_min_m} -> {hybrid['dense_min_m']}: {hybrid['summary']}")
    for t in triton:
        before = current.triton.buckets[t["bucket"]][1].id
        lines.append(f"- triton M<={t['max_m'] if t['max_m'] is not None else 'any'}: {before} -> {t['tile']} "
                     f"(of {t['candidates']} candidates; left out, missing cells that others have: "
                     f"{', '.join(t['left_out']) or 'none'}): {t['summary']}")
    if skinny:
        lines.append(f"- skinny thresholds, scored: {skinny['summary']}")
        lines += [f"  - M={m}: {v['geomean']:.3f}x, worst {v['worst']:.3f}x ({v['cells']} cells)" for m, v in skinny["by_m"].items()]
    if len(lines) == 2:
        lines.append("- nothing to fit: the files hold no skinny, dense, triton@<tile> or skinny@<kernel> cells "
                     "beside triton")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fit.md").write_text(text)
        (args.out / "fit.json").write_text(json.dumps({"device": device, "policy": current.name, "hybrid": hybrid,
                                                       "triton": triton, "skinny": skinny}, indent=1, default=str))
    if not (args.write or args.policy_out):
        return 0
    data = json.loads(path.read_text())
    if hybrid:
        data["hybrid"].update(skinny_max_m=hybrid["skinny_max_m"], dense_min_m=hybrid["dense_min_m"],
                              transient_min_m=hybrid["transient_min_m"],
                              evidence=evidence(command, commit, hybrid["summary"]),
                              transient_evidence=evidence(command, commit, hybrid["summary"]))
    for t in triton:
        entry = data["triton"]["buckets"][t["bucket"]]
        tile = policy.tile_from_id(t["tile"])
        entry.update({f: getattr(tile, f) for f in policy.TILE_FIELDS}, evidence=evidence(command, commit, t["summary"]))
    if skinny:
        data["skinny"]["score"] = evidence(command, commit, skinny["summary"])
    policy.parse(current.name, data)  # raises PolicyError before anything is written
    target = args.policy_out or path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
