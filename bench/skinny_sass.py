"""Instructions per weight in the skinny kernels' main loops, from sm_90 SASS built on this machine (no GPU).

    python bench/skinny_sass.py                        # the default policy's kernels, bf16 asym, G = 128
    python bench/skinny_sass.py --dtype fp16 --symmetric --group 32

Each variant's translation unit (csrc/skinny_inst_v*.cu) is compiled for sm_90 with nvcc and the
flags an extension build adds, disassembled with the cuobjdump Triton ships, and the main loop of
each kernel the default policy runs (the longest backward branch, bench/sass_tools.loop_opcodes)
is counted by opcode. "Per weight" divides by the weight elements one lane handles per trip of
that loop, so at M = 16 it is the cost of a weight for all 16 rows of x.

Why it matters: ncu on the H200 (bench/results/h200/ncu_decode_k8192_n57344.txt) has the M = 1
kernel issuing an instruction in 70% of its scheduler cycles at 57% of the DRAM bandwidth, so
its instruction count, not its loads, bounds it now.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sass_tools import cuobjdump, loop_opcodes  # noqa: E402
from optimized import skinny  # noqa: E402

HOST = skinny.CSRC / "skinny_host.h"  # the kernels' constants
# The flags torch.utils.cpp_extension adds, so the SASS is what an extension build runs.
TORCH_HALF_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


def kernel_constant(name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", HOST.read_text()).group(1))


@dataclass(frozen=True)
class Kernel:
    label: str          # the M it runs for under the default policy
    variant: str        # its translation unit: skinny_inst_v{VARIANTS.index(variant)}.cu
    name: str           # the kernel template
    args: str           # mangled template arguments after T, with {g} and {sym} to fill in
    trip_weights: int   # weight elements per lane per trip of the main loop

    def mangled(self, dtype: str, group: int, symmetric: bool) -> str:
        t = "13__nv_bfloat16" if dtype == "bf16" else "6__half"
        args = self.args.format(g=group, sym=int(symmetric))
        return f"_ZN2w4{len(self.name)}{self.name}I{t}{args}EEvNS_12SkinnyParamsE"


def kernels() -> list[Kernel]:
    """The mma-engine kernels of the default policy, then the streaming kernel's two tiles, with
    their loops' trip sizes: the segmented kernel's ring of 3 iterations x kSegRowSets rows, the
    pipelined kernel's kPipeStages x kLaneRows, the base kernel's 4 unrolled iterations x
    kLaneRows, the streaming kernel's one piece of 4 rows, each row a 32-k chunk."""
    lane_k, rows = kernel_constant("kLaneK"), kernel_constant("kLaneRows")
    seg = 3 * kernel_constant("kSegRowSets") * lane_k
    return [
        Kernel("M = 1 (seg_xs, x copied)", "seg_xs", "skinny_seg_kernel", "Li1ELi{g}ELb{sym}ELb1ELb0E", seg),
        Kernel("M = 2 (seg_xs, x copied)", "seg_xs", "skinny_seg_kernel", "Li2ELi{g}ELb{sym}ELb1ELb0E", seg),
        Kernel("M = 3..4 (seg_xs, x copied)", "seg_xs", "skinny_seg_kernel", "Li4ELi{g}ELb{sym}ELb1ELb0E", seg),
        Kernel("M = 1 (seg_p; the loop holds 3 row-group ends)", "seg_p", "skinny_seg_kernel",
               "Li1ELi{g}ELb{sym}ELb1ELb1E", seg),
        Kernel("M 5..8 (regs_s4)", "regs_s4", "skinny_pipe_kernel", "Li8ELi{g}ELb{sym}ELNS_6EngineE1E",
               kernel_constant("kPipeStages") * rows * lane_k),
        Kernel("M 9..16 (regs_s4)", "regs_s4", "skinny_pipe_kernel", "Li16ELi{g}ELb{sym}ELNS_6EngineE1E",
               kernel_constant("kPipeStages") * rows * lane_k),
        Kernel("M 9..16 (base)", "base", "skinny_kernel", "Li16ELi{g}ELb{sym}ELNS_6EngineE1E", 4 * rows * lane_k),
        Kernel("M 5..8 (stream)", "stream", "skinny_stream_kernel", "Li8ELi{g}ELb{sym}ELi4E", 4 * lane_k),
        Kernel("M 9..16 (stream)", "stream", "skinny_stream_kernel", "Li16ELi{g}ELb{sym}ELi4E", 4 * lane_k),
        Kernel("M 9..16 (stream, 2-slot ring)", "stream", "skinny_stream_kernel", "Li16ELi{g}ELb{sym}ELi2E",
               4 * lane_k),
    ]


def unit(variant: str) -> Path:
    return skinny.CSRC / f"skinny_inst_v{skinny.VARIANTS.index(variant)}.cu"


def nvcc_command(nvcc: str, source: Path, obj: Path) -> list[str]:
    """The sm_90 object build of one translation unit, as an extension build compiles it, with
    ptxas's register and spill report."""
    return [nvcc, "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", "-Xptxas", "-v",
            "-Xcompiler", "-fPIC", *TORCH_HALF_FLAGS, "-c", str(source), "-o", str(obj)]


def object_sass(obj: Path) -> str:
    return cuobjdump(obj.read_bytes(), "-sass")


def compile_sass(variant: str, work: Path) -> str:
    """sm_90 SASS of one variant's translation unit."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("nvcc is not on PATH: it is needed to compile the kernels")
    obj = work / f"{unit(variant).stem}.o"
    subprocess.run(nvcc_command(nvcc, unit(variant), obj), check=True, capture_output=True, text=True)
    return object_sass(obj)


def function_sass(sass: str, mangled: str) -> str:
    """The SASS of one function of a cuobjdump listing."""
    parts = re.split(r"^\s+Function : (\S+)\s*$", sass, flags=re.M)
    found = dict(zip(parts[1::2], parts[2::2]))
    if mangled not in found:
        raise KeyError(f"{mangled} is not in the cubin (functions: {sorted(found)})")
    return found[mangled]


def loop_cost(k: Kernel, sass: str, dtype: str, group: int, symmetric: bool) -> dict:
    """The main loop of kernel k, found in `sass` (its variant's listing): instructions per weight."""
    ops = loop_opcodes(function_sass(sass, k.mangled(dtype, group, symmetric)))
    total = sum(ops.values())
    return {"kernel": k.label, "loop_instructions": total, "trip_weights": k.trip_weights,
            "per_weight": total / k.trip_weights,
            "opcodes_per_weight": {op: n / k.trip_weights for op, n in ops.most_common()}}


def analyse(dtype: str, group: int, symmetric: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        listings = {v: compile_sass(v, Path(tmp)) for v in dict.fromkeys(k.variant for k in kernels())}
        return [loop_cost(k, listings[k.variant], dtype, group, symmetric) for k in kernels()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--group", type=int, choices=skinny.GROUP_SIZES, default=128)
    parser.add_argument("--symmetric", action="store_true", help="no zero points")
    args = parser.parse_args()
    print(f"sm_90, G = {args.group}, {args.dtype}, {'sym' if args.symmetric else 'asym'}, mma engine\n")
    print("| kernel | loop instr | weights / lane / trip | per weight | top opcodes per weight |")
    print("|---|---|---|---|---|")
    for r in analyse(args.dtype, args.group, args.symmetric):
        top = ", ".join(f"{op} {n:.2f}" for op, n in list(r["opcodes_per_weight"].items())[:7])
        print(f"| {r['kernel']} | {r['loop_instructions']} | {r['trip_weights']} | {r['per_weight']:.2f} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
