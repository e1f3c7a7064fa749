"""Reading sm_90 cubins with the cuobjdump Triton ships (no GPU, no CUDA toolkit needed): resources
and the opcodes of a kernel's main loop, for the instruction-budget tests and tools/triton_sass.py.
Importing this changes nothing in the process, so tests may import it in-process.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|(0x[0-9a-f]+))")
# A warp-divergence check before a shuffle (BRA.DIV) jumps to a fallback that ptxas places after
# the function's body and that branches back into it: never a loop of the kernel's.
DIV_BRANCH = re.compile(r"\bBRA\.DIV\s+\S+,\s*(0x[0-9a-f]+)")


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
    fallback = min((int(d.group(1), 16) for _, text in lines if (d := DIV_BRANCH.search(text))), default=None)
    loops = [(target, addr) for addr, text in lines
             if (b := BRANCH.search(text)) and b.group(1) and (target := int(b.group(1), 16)) < addr
             and (fallback is None or addr < fallback)]
    if not loops:
        return collections.Counter()
    start, end = max(loops, key=lambda span: span[1] - span[0])
    ops = collections.Counter()
    for addr, text in lines:
        if start <= addr <= end:
            ops[re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]] += 1
    return ops
