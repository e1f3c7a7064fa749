"""Instructions per weight in the Triton kernel's K loop, from sm_90 SASS built on this machine (no GPU).

    python bench/triton_sass.py                                    # the Hopper table's buckets
    python bench/triton_sass.py --config 1,128,128,8,4,1,gemv,f32 --dtype fp16 --symmetric
    PYTHONPATH=/folder/with/triton-3.6.0 python bench/triton_sass.py   # the H200 image's compiler

Each config is compiled for sm_90 at K = N = 8192 (as `select_config` fits it) with the
specialization a real launch gets, disassembled with the cuobjdump Triton ships, and its main loop
(the longest backward branch) counted by opcode. "Per weight" divides by the weight elements one
thread handles per loop iteration (block_n * block_k / threads), so it is the cost of a weight,
not of a multiply-add: a multi-row GEMV spends its count on block_m rows. Timing needs the GPU
(bench/triton_h200.py); this shows where instructions go, e.g. one LOP3 per weight in the GEMV.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The kernels must be compiled ones: under the interpreter @triton.jit builds functions that cannot be.
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench.sass_tools import cubin_resources, cuobjdump, loop_opcodes  # noqa: E402
from optimized import triton_w4a16  # noqa: E402
from optimized.tile_configs import HOPPER, TileConfig, fit_config  # noqa: E402

FIT_K = FIT_N = 8192


def parse_config(text: str) -> TileConfig:
    """block_m,block_n,block_k,split_k,num_warps,num_stages[,path[,dequant]]"""
    parts = text.split(",")
    if not 6 <= len(parts) <= 8:
        raise argparse.ArgumentTypeError(f"expected block_m,block_n,block_k,split_k,num_warps,num_stages"
                                         f"[,path[,dequant]], got {text!r}")
    return TileConfig(*map(int, parts[:6]), *parts[6:])


def analyse(cfg: TileConfig, group: int, dtype: str, symmetric: bool) -> dict:
    fitted = fit_config(cfg, FIT_N, FIT_K, group, HOPPER.target_programs, HOPPER.split_below)
    partials = fitted.split_k > 1
    fn = triton_w4a16._w4a16_kernel
    constexprs = triton_w4a16.kernel_constexprs(fitted, group, partials, not symmetric, False, False)
    sig, attrs = triton_w4a16.compile_signature(fn, constexprs, dtype, partials)
    compiled = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": fitted.num_warps, "num_stages": fitted.num_stages})
    ops = loop_opcodes(cuobjdump(compiled.asm["cubin"], "-sass"))
    weights = fitted.block_n * fitted.block_k / (32 * fitted.num_warps)
    res = cubin_resources(compiled.asm["cubin"])
    return {"config": fitted.id, "group": group, "dtype": dtype, "symmetric": symmetric,
            "registers": res["regs"], "stack": res["stack"], "weights_per_thread": weights,
            "loop_instructions": sum(ops.values()), "per_weight": sum(ops.values()) / weights,
            "opcodes_per_weight": {op: n / weights for op, n in ops.most_common()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=parse_config, action="append",
                        help="block_m,block_n,block_k,split_k,num_warps,num_stages[,path[,dequant]] (repeatable; "
                             "default: every bucket of tile_configs.HOPPER)")
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--symmetric", action="store_true", help="no zero points")
    args = parser.parse_args()
    configs = args.config or [cfg for _, cfg in HOPPER.buckets]
    print(f"triton {triton.__version__}, sm_90, G = {args.group}, {args.dtype}, "
          f"{'sym' if args.symmetric else 'asym'}, fitted to K = {FIT_K}, N = {FIT_N}\n")
    print("| config | regs | loop instr | weights / thread / iter | per weight | top opcodes per weight |")
    print("|---|---|---|---|---|---|")
    for cfg in configs:
        r = analyse(cfg, args.group, args.dtype, args.symmetric)
        top = ", ".join(f"{op} {n:.2f}" for op, n in list(r["opcodes_per_weight"].items())[:6])
        print(f"| {r['config']} | {r['registers']} | {r['loop_instructions']} | {r['weights_per_thread']:g} | "
              f"{r['per_weight']:.2f} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
