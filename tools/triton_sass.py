"""Instructions per weight in the Triton kernel's K loop, from sm_90 SASS built here (no GPU needed).

    python3 -m tools.triton_sass                                   # every bucket of the H200 policy
    python3 -m tools.triton_sass --tile m1n128k128s8w4p1 --dtype fp16 --symmetric
    python3 -m tools.triton_sass --device "NVIDIA H100 80GB HBM3"  # that device's table
    PYTHONPATH=/folder/with/triton-3.6.0 python3 -m tools.triton_sass   # the GPU image's compiler

Run from the repository root (it imports `optimized` and `tests.support`).

See tests/support/triton_sass.py for what is counted. Timing needs the GPU (tests/benchmarks);
this shows where the instructions go, e.g. one LOP3 per weight in the GEMV.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # before the kernels are defined: they must be compilable

import triton  # noqa: E402

from optimized.policy import policy_for, tile_from_id  # noqa: E402
from tests.support.triton_sass import DEVICE, FIT_K, FIT_N, analyse  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tile", action="append", type=tile_from_id, metavar="TILE_ID",
                        help="a tile id such as m16n64k128s32w4p4-swap-h (repeatable; default: every bucket of "
                             "the device's table)")
    parser.add_argument("--device", default=DEVICE, help=f"whose policy fits the tiles (default {DEVICE!r})")
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--symmetric", action="store_true", help="no zero points")
    args = parser.parse_args()
    tiles = args.tile or [cfg for _, cfg in policy_for(args.device).triton.buckets]
    print(f"triton {triton.__version__}, sm_90, G = {args.group}, {args.dtype}, "
          f"{'sym' if args.symmetric else 'asym'}, fitted to K = {FIT_K}, N = {FIT_N} by the {args.device} policy\n")
    print("| config | regs | stack | loop instr | weights / thread / iter | per weight | top opcodes per weight |")
    print("|---|---|---|---|---|---|---|")
    for tile in tiles:
        r = analyse(tile, args.group, args.dtype, args.symmetric, args.device)
        top = ", ".join(f"{op} {n:.2f}" for op, n in list(r["opcodes_per_weight"].items())[:6])
        print(f"| {r['config']} | {r['registers']} | {r['stack']} | {r['loop_instructions']} | "
              f"{r['weights_per_thread']:g} | {r['per_weight']:.2f} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
