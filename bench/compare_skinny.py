"""Two skinny_h200.json timing tables side by side: the after / before time of each cell.

    python bench/compare_skinny.py BEFORE.json AFTER.json [--engine mma] [--noise 0.05] [--out FILE.md]

Prints (and with --out writes) a markdown report: the geometric mean of after / before by M, how
many cells moved beyond the noise band each way, the cells that moved most, and issue 4's targets
for both tables. Only cells timed in both tables are compared. Timings taken on different cards
(the environments' "gpu") are compared anyway, with a warning at the top: rerun the baseline on the
same machine before believing a difference (DESIGN.md section 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.skinny_h200 import target_lines, target_summary  # noqa: E402


def timed_cells(table: dict, engine: str) -> dict[tuple[str, int], float]:
    """(case, M) -> microseconds of `engine` for every cell of a skinny_h200.json that has a time."""
    return {(r["case"], r["m"]): r[f"{engine}_us"] for r in table.get("timing", [])
            if "error" not in r and f"{engine}_us" in r}


def compare(before: dict, after: dict, engine: str = "mma", noise: float = 0.05) -> dict:
    """The after / before ratios of the cells both tables timed: by M (geometric mean, cells faster and
    slower than 1 -+ noise) and every cell, sorted from the largest gain to the largest loss."""
    old, new = timed_cells(before, engine), timed_cells(after, engine)
    cells = sorted(((new[key] / old[key], key) for key in old.keys() & new.keys()))
    if not cells:
        raise ValueError(f"the two tables share no timed {engine} cell (before: {len(old)} cells, after: {len(new)})")
    by_m: dict[int, list[float]] = {}
    for ratio, (_, m) in cells:
        by_m.setdefault(m, []).append(ratio)
    return {"engine": engine, "noise": noise,
            "by_m": {m: {"geomean": statistics.geometric_mean(rs), "cells": len(rs),
                         "faster": sum(r < 1 - noise for r in rs), "slower": sum(r > 1 + noise for r in rs)}
                     for m, rs in sorted(by_m.items())},
            "cells": [{"case": c, "m": m, "before_us": old[(c, m)], "after_us": new[(c, m)], "ratio": r}
                      for r, (c, m) in cells]}


def report(before: dict, after: dict, result: dict, names: tuple[str, str], top: int = 8) -> str:
    gpus = [t.get("environment", {}).get("gpu") for t in (before, after)]
    lines = [f"# {names[1]} against {names[0]} ({result['engine']} engine; ratio = after / before time)", ""]
    if gpus[0] != gpus[1]:
        lines += [f"**Different cards**: before on {gpus[0]}, after on {gpus[1]}; differences include the card's.", ""]
    ratios = [c["ratio"] for c in result["cells"]]
    lines += [f"{len(ratios)} cells, geometric mean {statistics.geometric_mean(ratios):.3f}; "
              f"noise band +-{100 * result['noise']:.0f}%.", "",
              "| M | cells | geomean | faster | slower |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {s['cells']} | {s['geomean']:.3f} | {s['faster']} | {s['slower']} |"
              for m, s in result["by_m"].items()]
    for title, chosen in (("Largest gains", result["cells"][:top]), ("Largest losses", result["cells"][::-1][:top])):
        lines += ["", f"## {title}", "", "| case | M | before us | after us | ratio |", "|---|---|---|---|---|"]
        lines += [f"| {c['case']} | {c['m']} | {c['before_us']:.1f} | {c['after_us']:.1f} | {c['ratio']:.3f} |"
                  for c in chosen]
    for name, table in zip(names, (before, after)):
        lines += ["", f"### {name}", ""] + target_lines(target_summary(table.get("timing", []), result["engine"]))[2:]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--engine", choices=("mma", "simt"), default="mma")
    parser.add_argument("--noise", type=float, default=0.05, help="relative change counted as noise")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    text = report(before, after, compare(before, after, args.engine, args.noise), (args.before.name, args.after.name))
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
