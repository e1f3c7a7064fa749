"""The skinny kernels' device builds without a GPU, each built once per run (tests/support/
compilers.py): the extension's translation units compiled by nvcc for sm_90 with the flags an
extension build adds, and by hipcc for AMD wave32 and wave64 targets; and what the sm_90 SASS says:
the kernels the default plan runs, and the instructions per weight of each one's main loop (the
generic cubin readers are tests/support/sass.py).

Why instructions per weight: a decode kernel that issues an instruction in most of its scheduler
cycles is bound by its instruction count, not by its loads, so the main loop's count per weight is
what the segmented kernels' budget test and tools/skinny_sass.py watch.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from optimized import skinny
from tests.support.compilers import built_once, compile_or_fail, find_compiler
from tests.support.sass import loop_opcodes, tool

CSRC = skinny.CSRC
UNITS = (CSRC / "skinny_launch.cu", *(CSRC / unit for unit in skinny.FAMILY_UNITS))
# The flags torch.utils.cpp_extension adds, so that the SASS is what an extension build runs.
TORCH_HALF_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
LIBRARY = "libskinny.so"


def nvcc_command(nvcc: str, source: Path, obj: Path) -> list[str]:
    """The sm_90 object build of one translation unit, as an extension build compiles it, with
    ptxas's register and spill report."""
    return [nvcc, "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
            "-Xcompiler", "-fPIC", *TORCH_HALF_FLAGS, "-c", str(source), "-o", str(obj)]


def build_sm90() -> Path:
    """The folder holding every unit's object (<unit stem>.o) and ptxas log (<unit stem>.log),
    compiled side by side, and LIBRARY, their link with nothing left undefined."""
    nvcc = find_compiler("nvcc")

    def build(folder: Path) -> None:
        def compile_unit(unit: Path) -> None:
            log = compile_or_fail(nvcc_command(nvcc, unit, folder / f"{unit.stem}.o"))
            (folder / f"{unit.stem}.log").write_text(log)

        # The longest units first, so that the last one to finish is a short one.
        longest_first = sorted(UNITS, key=lambda unit: unit.name not in ("skinny_segment.cu", "skinny_batch.cu"))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(compile_unit, longest_first))
        compile_or_fail([nvcc, "-shared", "-Xlinker", "--no-undefined", "-o", str(folder / LIBRARY),
                         *(str(folder / f"{unit.stem}.o") for unit in UNITS)])

    sources = [*CSRC.glob("*.h"), *CSRC.glob("*.cuh"), *CSRC.glob("*.cu")]
    recipe = " ".join(nvcc_command(nvcc, Path("UNIT"), Path("OBJ")))
    return built_once("skinny_sm90", sources, recipe, build)


# One HIP unit of the launch and every family's unit, whose warp size must be each target's.
HIP_UNIT = """\
#include "skinny_launch.cu"
#include "skinny_batch.cu"
#include "skinny_ring.cu"
#include "skinny_segment.cu"
#include "skinny_stream.cu"
#include "skinny_tile.cu"
#include "skinny_wgmma.cu"
#if defined(__HIP_DEVICE_COMPILE__)
#if defined(__gfx1030__)
static_assert(W4_WARP_SIZE == 32, "compat.h warp size on gfx1030 (wave32)");
#elif defined(__gfx90a__)
static_assert(W4_WARP_SIZE == 64, "compat.h warp size on gfx90a (wave64)");
#else
#error "an unexpected offload target"
#endif
#endif
"""


def build_hip() -> Path:
    """The folder holding skinny.o: HIP_UNIT compiled by hipcc for gfx1030 (wave32 RDNA) and gfx90a
    (wave64 CDNA) in one compile."""
    hipcc = find_compiler("hipcc")
    command = [hipcc, "-std=c++17", "-O3", "--offload-arch=gfx1030", "--offload-arch=gfx90a", f"-I{CSRC}", "-c"]

    def build(folder: Path) -> None:
        (folder / "skinny_all.hip").write_text(HIP_UNIT)
        compile_or_fail([*command, str(folder / "skinny_all.hip"), "-o", str(folder / "skinny.o")],
                        env={**os.environ, "HIP_PLATFORM": "amd"})

    sources = [*CSRC.glob("*.h"), *CSRC.glob("*.cuh"), *CSRC.glob("*.cu")]
    return built_once("skinny_hipcc", sources, " ".join(command) + HIP_UNIT, build)


def ptxas_report(log: str) -> dict[str, tuple[int, int, int, int]]:
    """{mangled kernel: (registers, stack frame, spill store, spill load bytes)} from -Xptxas -v."""
    out = {}
    for block in re.split(r"Compiling entry function", log)[1:]:
        name = re.match(r"\s*'(\S+)'", block).group(1)
        regs = int(re.search(r"Used (\d+) registers", block).group(1))
        stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        out[name] = (regs, *(int(v) for v in stack.groups()))
    return out


def function_sass(obj: Path, mangled: str) -> str:
    """The SASS of one function of an object (cuobjdump disassembles that function alone)."""
    out = subprocess.run([str(tool("cuobjdump")), "-sass", "-fun", mangled, str(obj)], capture_output=True, text=True,
                         check=True).stdout
    if "Function :" not in out:
        raise KeyError(f"{mangled} is not in {obj.name}")
    return out


# An instruction: its address, an optional predicate, the opcode.
OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def kernel_memory_ops(obj: Path) -> dict[str, list[str]]:
    """{mangled kernel: its global loads and stores and programmatic-dependent-launch instructions
    (LDG*, STG*, PREEXIT, ACQBULK) in program order}, from the whole object's SASS filtered by grep
    (a disassembly of every kernel is tens of MB)."""
    dump = subprocess.Popen([str(tool("cuobjdump")), "-sass", str(obj)], stdout=subprocess.PIPE)
    grep = subprocess.run(["grep", "-E", "Function :|PREEXIT|ACQBULK|STG|LDG"], stdin=dump.stdout,
                          capture_output=True, text=True)
    dump.stdout.close()
    if dump.wait() != 0 or grep.returncode not in (0, 1):
        raise RuntimeError(f"cuobjdump -sass {obj} failed")
    out: dict[str, list[str]] = {}
    ops: list[str] = []
    for line in grep.stdout.splitlines():
        if (name := re.match(r"^\s+Function : (\S+)\s*$", line)) is not None:
            ops = out.setdefault(name.group(1), [])
        elif (op := OPCODE.match(line)) is not None:
            ops.append(op.group(1))
    return out


def plan_constant(name: str) -> int:
    """A structural constant of csrc/skinny_plan.h, read from the header."""
    return int(re.search(rf"constexpr int {name} = (\d+);", (CSRC / "skinny_plan.h").read_text()).group(1))


@dataclass(frozen=True)
class Kernel:
    label: str         # the kernel and the M it runs for under the default plan
    unit: str          # its translation unit's stem
    name: str          # the kernel template
    args: str          # mangled template arguments after T, with {g} and {sym} to fill in
    trip_weights: int  # weight elements per lane per trip of the main loop
    params: str = "NS_12SkinnyParamsE"  # the mangled parameter types

    def mangled(self, dtype: str, group: int, symmetric: bool) -> str:
        t = "13__nv_bfloat16" if dtype == "bf16" else "6__half"
        return f"_ZN2w4{len(self.name)}{self.name}I{t}{self.args.format(g=group, sym=int(symmetric))}EEv{self.params}"


def kernels() -> list[Kernel]:
    """The mma-engine kernels the default plan runs, with their loops' trip sizes: the segmented
    kernels' ring of 3 iterations x kSegRowSets rows, the ring's kRingStages x kLaneRows, the batch
    kernel's 4 unrolled iterations x kLaneRows, the stream and tile kernels' one piece of 4 rows, the
    wgmma kernel's two pieces (one a register set) of 2 rows; each 32 k a row and piece."""
    lane_k, lane_rows, seg_rows, ring_stages = map(plan_constant, ("kLaneK", "kLaneRows", "kSegRowSets", "kRingStages"))
    seg = 3 * seg_rows * lane_k
    ring = ring_stages * lane_rows * lane_k

    def segment(label: str, m_pad: int, xs: int, persist: int) -> Kernel:
        return Kernel(label, "skinny_segment", "segment_kernel", f"Li{m_pad}ELi{{g}}ELb{{sym}}ELb{xs}ELb{persist}E", seg)

    def register(label: str, unit: str, name: str, m_tile: int, trip: int) -> Kernel:
        return Kernel(label, unit, name, f"Li{m_tile}ELi{{g}}ELb{{sym}}ELNS_6EngineE1E", trip)

    def stream(label: str, m_tile: int, stages: int) -> Kernel:
        return Kernel(label, "skinny_stream", "stream_kernel", f"Li{m_tile}ELi{{g}}ELb{{sym}}ELi{stages}E", 4 * lane_k)

    def tile(label: str, m_tile: int) -> Kernel:
        return Kernel(label, "skinny_tile", "tile_kernel", f"Li{m_tile}ELi{{g}}ELb{{sym}}E", 4 * lane_k)

    def wgmma(label: str, m_tile: int) -> Kernel:
        return Kernel(label, "skinny_wgmma", "wgmma_kernel", f"Li{m_tile}ELi{{g}}ELb{{sym}}E", 4 * lane_k,
                      "NS_12SkinnyParamsENS_6detail9WgmmaMapsE")

    return [
        segment("segment_smem, M = 1", 1, 1, 0),
        segment("segment_smem, M = 2", 2, 1, 0),
        segment("segment_smem, M = 3..4", 4, 1, 0),
        segment("segment, M = 1 (x from global memory)", 1, 0, 0),
        segment("segment_persistent, M = 1 (its loop holds 3 row-group ends)", 1, 1, 1),
        register("ring, M = 5..8", "skinny_ring", "ring_kernel", 8, ring),
        register("batch, M = 9..16", "skinny_batch", "batch_kernel", 16, 4 * lane_rows * lane_k),
        stream("stream, M = 5..8", 8, 4),
        stream("stream, M = 9..16", 16, 4),
        stream("stream, M = 9..16, 2-slot ring", 16, 2),
        tile("tile, M = 17..32", 32),
        tile("tile, M = 33..64 off compute capability 9.0", 64),
        tile("tile, M = 65 on (M tiles of 128) off compute capability 9.0", 128),
        wgmma("wgmma, M = 17..32 on compute capability 9.0 where its grid takes the tile kernel's waves", 32),
        wgmma("wgmma, M = 33..64 on compute capability 9.0", 64),
        wgmma("wgmma, M = 65 on (M tiles of 128) on compute capability 9.0", 128),
    ]


def loop_cost(kernel: Kernel, obj: Path, dtype: str, group: int, symmetric: bool) -> dict:
    """The main loop of `kernel` in its unit's object: instructions per weight."""
    ops = loop_opcodes(function_sass(obj, kernel.mangled(dtype, group, symmetric)))
    total = sum(ops.values())
    return {"kernel": kernel.label, "loop_instructions": total, "trip_weights": kernel.trip_weights,
            "per_weight": total / kernel.trip_weights,
            "opcodes_per_weight": {op: n / kernel.trip_weights for op, n in ops.most_common()}}
