"""A skinny variant's K split on the H200 (the "stream" variant by default): its plan against every forced split.

For each Llama-3.1-8B / 3.3-70B decode shape (bf16, zero points, G = 128) and M, times the default
policy, the variant at its planned split (split=0) and at each forced split that fits
(optimized.skinny.skinny_matmul's `split`: blocks along K for stream, warps of a block sharing a
row, REGISTER_SPLITS, for base, regs_s4, seg_r4 and seg_xs), all on the same cold weights in CUDA
graphs as bench/skinny_h200.py times variants. Shows whether csrc/skinny_host.h's split planners
(choose_stream_split, choose_split) pick well, and what the best split reaches.

    python3 bench/stream_split_h200.py --out DIR [--variant stream] [--ms 1,4,16] [--shapes NAME,..] [--budget-s 150]

Writes DIR/{variant}_split.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.cuda_timing import graph_seconds  # noqa: E402
from bench.skinny_h200 import (  # noqa: E402
    VARIANT_COLD_BYTES, VARIANT_MIN_COPIES, copy_bandwidth, floor_bytes, log, named_shapes, random_packs)
from optimized import skinny  # noqa: E402

GROUP = 128
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the stream variant's; the others take skinny.REGISTER_SPLITS
REPLAYS = 10


def time_cell(x: torch.Tensor, packs: list, variant: int, split: int) -> float | str:
    try:
        return graph_seconds([lambda p=p: torch.ops.w4a16.skinny_matmul(
            x, p[0], p[1], p[2], GROUP, None, "auto", variant, "weights", split) for p in packs], replays=REPLAYS)
    except RuntimeError as e:  # a split whose shared memory does not fit: recorded, not timed
        return str(e).splitlines()[0][:160]


def markdown(result: dict) -> str:
    name = result["variant"]
    lines = [f"# Variant {name}: planned split against forced splits ({result['gpu']}, bf16 asym, G = 128)", "",
             f"Copy bandwidth {result['bandwidth'] / 1e12:.2f} TB/s; times in us per call (CUDA graph, cold weights).",
             "", f"| shape | M | floor | default | {name} plan (% floor) | best forced split | plan / best |",
             "|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        timed = {s: t for s, t in c["splits"].items() if isinstance(t, float)}
        best = min(timed, key=timed.get) if timed else None
        plan = c["plan_us"]
        lines.append(f"| {c['shape']} | {c['m']} | {c['floor_us']:.1f} | {c['default_us']:.1f} | "
                     f"{plan:.1f} ({100 * c['floor_us'] / plan:.0f}%) | "
                     + (f"{best}: {timed[best]:.1f} | {plan / timed[best]:.3f} |" if best else "- | - |"))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ms", default="1,4,16")
    parser.add_argument("--shapes", default="",
                        help="comma-separated model.layer names of fixture shapes, or 'all' (default: every 8B and 70B "
                             "shape)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="skip shapes started after this many seconds")
    parser.add_argument("--variant", choices=[v for v in skinny.VARIANTS if v != "seg_p"], default="stream")
    args = parser.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    variant = skinny.VARIANTS.index(args.variant)
    splits = SPLITS if args.variant == "stream" else skinny.REGISTER_SPLITS
    start = time.perf_counter()
    skinny.build()
    bandwidth = copy_bandwidth("cuda")["bytes_per_s"]
    result = {"gpu": torch.cuda.get_device_name(), "variant": args.variant, "bandwidth": bandwidth, "cells": [],
              "skipped": []}
    for name, k, n in named_shapes(set(filter(None, args.shapes.split(",")))):
        if time.perf_counter() - start > args.budget_s:
            result["skipped"].append(name)
            continue
        copies = max(VARIANT_MIN_COPIES, math.ceil(VARIANT_COLD_BYTES / floor_bytes(0, k, n, GROUP, False)))
        packs = random_packs(k, n, GROUP, False, torch.bfloat16, "cuda", copies)
        torch.cuda.synchronize()  # read-only from here on: the calls overlap with "weights"
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            cell = {"shape": name, "k": k, "n": n, "m": m, "copies": copies,
                    "floor_us": floor_bytes(m, k, n, GROUP, False) / bandwidth * 1e6,
                    "default_us": time_cell(x, packs, skinny.DEFAULT_VARIANT, 0) * 1e6,
                    "plan_us": time_cell(x, packs, variant, 0) * 1e6, "splits": {}}
            for split in (s for s in splits if args.variant != "stream" or s <= k // 128):
                t = time_cell(x, packs, variant, split)
                cell["splits"][split] = t * 1e6 if isinstance(t, float) else t
            result["cells"].append(cell)
            timed = {s: t for s, t in cell["splits"].items() if isinstance(t, float)}
            log(f"[split] {name} M={m}: floor {cell['floor_us']:.1f} default {cell['default_us']:.1f} "
                f"plan {cell['plan_us']:.1f} | " + " ".join(f"{s}:{t:.1f}" for s, t in timed.items()))
        del packs
        torch.cuda.empty_cache()
    result["seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.variant}_split.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{args.variant}_split.md").write_text(markdown(result))
    log(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
