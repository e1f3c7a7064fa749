"""Instructions per weight in the main loop of each kernel the skinny default plan runs, from sm_90
SASS compiled on this machine (nvcc with an extension build's flags; no GPU needed).

    python3 tools/skinny_sass.py                                  # bf16 with zero points, G = 128
    python3 tools/skinny_sass.py --dtype fp16 --symmetric --group 32

"Per weight" divides the loop's instructions by the weight elements one lane handles per trip, so
at M = 16 it is the cost of a weight for all 16 rows of x. The objects are built once and cached
(tests/support/compilers.py), so a second run only disassembles.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import skinny_sass  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--group", type=int, choices=(32, 64, 128), default=128)
    parser.add_argument("--symmetric", action="store_true", help="no zero points")
    args = parser.parse_args()
    folder = skinny_sass.build_sm90()
    print(f"sm_90, G = {args.group}, {args.dtype}, {'sym' if args.symmetric else 'asym'}, mma engine\n")
    print("| kernel | loop instructions | weights / lane / trip | per weight | top opcodes per weight |")
    print("|---|---|---|---|---|")
    for kernel in skinny_sass.kernels():
        r = skinny_sass.loop_cost(kernel, folder / f"{kernel.unit}.o", args.dtype, args.group, args.symmetric)
        top = ", ".join(f"{op} {n:.2f}" for op, n in list(r["opcodes_per_weight"].items())[:7])
        print(f"| {r['kernel']} | {r['loop_instructions']} | {r['trip_weights']} | {r['per_weight']:.2f} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
