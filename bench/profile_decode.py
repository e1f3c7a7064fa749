"""One call of each decode kernel, for Nsight Compute (written for the H200).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section SchedulerStats python3 bench/profile_decode.py [--shape 8192,57344] [--ms 1,16]

Random weights (bf16, zero points, G = 128) on one shape; every kernel runs once to compile and
warm up, then once more between cudaProfilerStart and cudaProfilerStop, so ncu sees only those
calls: the skinny default policy and the Triton kernel at each M. `--clock-control none` keeps the
GPU's own clocks (ncu pins 1.35 GHz otherwise, so its durations are not the benchmark's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.skinny_h200 import random_packs  # noqa: E402
from optimized import skinny  # noqa: E402
from optimized.triton_w4a16 import w4a16_matmul  # noqa: E402

GROUP = 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8192,57344", help="K,N")
    parser.add_argument("--ms", default="1,16", help="comma-separated M")
    args = parser.parse_args()
    k, n = (int(v) for v in args.shape.split(","))
    ms = [int(v) for v in args.ms.split(",")]
    q, s, z = random_packs(k, n, GROUP, False, torch.bfloat16, "cuda", 1)[0]
    calls = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        calls.append((f"skinny M={m}", lambda x=x: skinny.skinny_matmul(x, q, s, z, GROUP)))
        calls.append((f"triton M={m}", lambda x=x: w4a16_matmul(x, q, s, z, GROUP)))
    for _, fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in calls:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(name for name, _ in calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
