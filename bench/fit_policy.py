"""Which skinny kernel should the default run at each M? Candidate policies scored on a variant sweep.

    python bench/fit_policy.py SWEEP.json [SWEEP2.json ...] [--kernels regs_s4,stream,base] [--out FILE.md]

SWEEP.json: what `bench/skinny_h200.py --variants [--shapes all --ms ...]` writes. For every
(case, M) it timed, each policy's kernel is compared with the fastest of --kernels there (ratio =
policy's time / fastest time, 1 is best). Policies:

* today's default (skinny.default_variant), and each kernel of --kernels at every M;
* per M bucket (STREAM_BUCKETS: 1..2, 3..4, 5..8, 9..16), a size threshold between two kernels:
  one below T bytes of weights (N K / 2), the other at T and above. Why a size: the kernels differ
  in fixed cost (the streaming kernel stages x and, split over K, runs a second kernel) and in
  steady-state bandwidth, so time = fixed + bytes / rate crosses over once. Every threshold between
  two observed sizes is tried; the best (least geometric mean) is reported with its worst cell;
* the same with a second way in: the second kernel also wherever K >= a K threshold (the
  streaming kernel splits long K over blocks, which the register-ring kernels cannot).

Cells where a kernel was not timed (budget, failed parity) drop out of the policies that need them.
Several sweeps (one card) are pooled; a (case, M) timed twice keeps the later file's times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimized import skinny  # noqa: E402


def cell_times(sweeps: list[dict]) -> dict[tuple[str, int], dict]:
    """(case, M) -> {"bytes": N K / 2, "us": {kernel name: microseconds}} of the mma engine."""
    cells: dict[tuple[str, int], dict] = {}
    for sweep in sweeps:
        for r in sweep.get("timing", []):
            if "us" not in r or r.get("engine") != "mma" or r.get("repeat"):
                continue
            cell = cells.setdefault((r["case"], r["m"]), {"bytes": r["k"] * r["n"] // 2, "n": r["n"], "k": r["k"],
                                                          "us": {}})
            cell["us"][r["variant_name"]] = r["us"]
    return cells


def score(cells: dict[tuple[str, int], dict], pick, kernels: tuple[str, ...]) -> dict | None:
    """Geometric mean and worst of pick(m, cell)'s time over the fastest of `kernels`, over
    the cells where both are timed."""
    ratios = []
    for (case, m), cell in cells.items():
        timed = {k: cell["us"][k] for k in kernels if k in cell["us"]}
        choice = pick(m, cell)
        if choice in cell["us"] and timed:
            ratios.append((cell["us"][choice] / min(timed.values()), case, m))
    if not ratios:
        return None
    worst = max(ratios)
    return {"cells": len(ratios), "geomean": statistics.geometric_mean(r for r, _, _ in ratios),
            "worst": worst[0], "worst_cell": f"{worst[1]} M={worst[2]}"}


def bucket_of(m: int) -> tuple[int, int]:
    return next(b for b in skinny.STREAM_BUCKETS if b[0] <= m <= b[1])


def best_rule(cells: dict[tuple[str, int], dict], kernels: tuple[str, ...], small: str, large: str,
              k_mins: list[int | None]) -> dict | None:
    """The best rule "large from K k_min or from a size, small elsewhere" over k_mins (None: by the
    size alone) and every size between two observed ones: its score, threshold and k_threshold."""
    sizes = sorted({c["bytes"] for c in cells.values()})
    best = None
    for k_min in k_mins:
        for lo, hi in zip(sizes, sizes[1:]):
            size_min = (lo + hi) // 2
            s = score(cells, lambda m, cell, kt=k_min, st=size_min:
                      large if kt is not None and cell["k"] >= kt or cell["bytes"] >= st else small, kernels)
            if s and (best is None or s["geomean"] < best["geomean"]):
                best = s | {"threshold": size_min, "k_threshold": k_min}
    return best


def fit(cells: dict[tuple[str, int], dict], kernels: tuple[str, ...]) -> dict:
    """Every fixed policy over all cells, and per M bucket the fixed ones and, for each ordered pair
    of kernels, the best size threshold and the best K-or-size rule."""
    result = {"kernels": list(kernels), "overall": {}, "buckets": {}}
    fixed = {"default": lambda m, cell: skinny.VARIANTS[skinny.default_variant(m, cell["n"], cell["k"])]}
    fixed |= {k: (lambda m, cell, k=k: k) for k in kernels}
    for name, pick in fixed.items():
        result["overall"][name] = score(cells, pick, kernels)
    for bucket in sorted({bucket_of(m) for _, m in cells}):
        sub = {key: c for key, c in cells.items() if bucket_of(key[1]) == bucket}
        rows = {name: score(sub, pick, kernels) for name, pick in fixed.items()}
        ks = sorted({c["k"] for c in sub.values()})
        for small in kernels:
            for large in kernels:
                if small == large:
                    continue
                by_size = best_rule(sub, kernels, small, large, [None])
                if by_size:
                    rows[f"{small} below {by_size['threshold'] / 2**20:.1f} MiB, {large} above"] = by_size
                by_k = best_rule(sub, kernels, small, large, [(lo + hi) // 2 for lo, hi in zip(ks, ks[1:])])
                if by_k:
                    rows[f"{large} from K {by_k['k_threshold']} or {by_k['threshold'] / 2**20:.1f} MiB, "
                         f"{small} below"] = by_k
        result["buckets"][f"{bucket[0]}..{bucket[1]}"] = rows
    return result


def report(result: dict, sources: list[str], top: int = 4) -> str:
    lines = [f"# Kernel policy per M bucket, scored against the fastest of {', '.join(result['kernels'])}", "",
             "Sweeps: " + ", ".join(f"`{s}`" for s in sources) + ". Ratio = the policy's time / the fastest "
             "kernel's, per (case, M); geometric mean and worst cell.", ""]

    def table(rows: dict) -> list[str]:
        """Every fixed policy, and the `top` best thresholds."""
        out = ["| policy | cells | geomean | worst | worst cell |", "|---|---|---|---|---|"]
        ranked = sorted(((name, s) for name, s in rows.items() if s), key=lambda item: item[1]["geomean"])
        thresholds = [name for name, s in ranked if "threshold" in s][:top]
        for name, s in ranked:
            if "threshold" not in s or name in thresholds:
                out.append(f"| {name} | {s['cells']} | {s['geomean']:.3f} | {s['worst']:.3f} | {s['worst_cell']} |")
        return out

    lines += ["## All M", "", *table(result["overall"]), ""]
    for bucket, rows in result["buckets"].items():
        lines += [f"## M {bucket}", "", *table(rows), ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--kernels", default="regs_s4,stream,base",
                        help="comma-separated kernels of optimized.skinny.VARIANTS to choose among")
    parser.add_argument("--top", type=int, default=4, help="size thresholds listed per bucket")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kernels = tuple(args.kernels.split(","))
    unknown = set(kernels) - set(skinny.VARIANTS)
    if unknown:
        raise SystemExit(f"unknown kernels {sorted(unknown)}; expected names of {skinny.VARIANTS}")
    cells = cell_times([json.loads(p.read_text()) for p in args.sweeps])
    if not cells:
        raise SystemExit("no timed mma cell in the sweeps given")
    text = report(fit(cells, kernels), [str(p) for p in args.sweeps], args.top)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
