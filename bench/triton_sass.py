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
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The kernels must be compiled ones: under the interpreter @triton.jit builds functions that cannot be.
os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from optimized import triton_w4a16  # noqa: E402
from optimized.tile_configs import HOPPER, TileConfig, fit_config  # noqa: E402

FIT_K = FIT_N = 8192
SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|(0x[0-9a-f]+))")


def parse_config(text: str) -> TileConfig:
    """block_m,block_n,block_k,split_k,num_warps,num_stages[,path[,dequant]]"""
    parts = text.split(",")
    if not 6 <= len(parts) <= 8:
        raise argparse.ArgumentTypeError(f"expected block_m,block_n,block_k,split_k,num_warps,num_stages"
                                         f"[,path[,dequant]], got {text!r}")
    return TileConfig(*map(int, parts[:6]), *parts[6:])


def tool(name: str) -> Path:
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        sys.exit(f"this Triton ships no {name} ({path}): it is needed to read the cubin")
    return path


def cuobjdump(cubin: bytes, flag: str) -> str:
    """The output of Triton's cuobjdump `flag` (-sass, -res-usage) on a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool("cuobjdump")), flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def cubin_resources(cubin: bytes) -> dict:
    """Registers and stack (spill) bytes per thread."""
    found = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(cubin, "-res-usage"))
    return {"regs": int(found.group(1)), "stack": int(found.group(2))}


def loop_opcodes(sass: str) -> collections.Counter:
    """Opcode counts of the instructions inside the longest backward branch."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(SASS_LINE.match, sass.splitlines()) if m]
    loops = [(target, addr) for addr, text in lines
             if (b := BRANCH.search(text)) and b.group(1) and (target := int(b.group(1), 16)) < addr]
    if not loops:
        return collections.Counter()
    start, end = max(loops, key=lambda span: span[1] - span[0])
    ops = collections.Counter()
    for addr, text in lines:
        if start <= addr <= end:
            ops[re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]] += 1
    return ops


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
