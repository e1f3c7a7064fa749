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


def loop_instructions(sass: str) -> list[str]:
    """The instructions inside the longest backward branch, in order, without their predicates."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in map(SASS_LINE.match, sass.splitlines()) if m]
    fallback = min((int(d.group(1), 16) for _, text in lines if (d := DIV_BRANCH.search(text))), default=None)
    # ptxas places the retries of an mbarrier wait after the function's last EXIT, branching back.
    last_exit = max((addr for addr, text in lines if text == "EXIT"), default=None)
    if last_exit is not None:
        fallback = last_exit if fallback is None else min(fallback, last_exit)
    loops = [(target, addr) for addr, text in lines
             if (b := BRANCH.search(text)) and b.group(1) and (target := int(b.group(1), 16)) < addr
             and (fallback is None or addr < fallback)]
    if not loops:
        return []
    start, end = max(loops, key=lambda span: span[1] - span[0])
    return [re.sub(r"^@!?U?P\w+\s+", "", text) for addr, text in lines if start <= addr <= end]


def loop_opcodes(sass: str) -> collections.Counter:
    """Opcode counts of the instructions inside the longest backward branch."""
    return collections.Counter(text.split()[0] for text in loop_instructions(sass))


# HGMMA with its A operand in registers (RS form): the first register of A's four.
HGMMA_RS = re.compile(r"^HGMMA\.\S+\s+R\d+,\s+R(\d+),")
WGMMA_WAIT = re.compile(r"^WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*(0x[0-9a-f]+)")


def written_registers(text: str) -> set[int]:
    """The general registers an instruction writes: its first operand when that is a register
    (stores, barriers and branches name none), as wide as a .64/.WIDE or .128 result."""
    opcode, _, operands = text.partition(" ")
    first = re.match(r"\s*R(\d+)\b", operands)
    if first is None or opcode.startswith(("ST", "RED", "HGMMA", "WARPGROUP")):
        return set()
    width = 4 if ".128" in opcode else 2 if (".64" in opcode or ".WIDE" in opcode) else 1
    return set(range(int(first.group(1)), int(first.group(1)) + width))


def wgmma_register_hazards(sass: str) -> list[str]:
    """Instructions of the main loop that write a register an HGMMA reads as its A operand while
    that HGMMA may still run: from its issue until a WARPGROUP.DEPBAR leaves fewer groups pending
    than there were after it (groups close at the HGMMA marked gsb0). The loop is followed twice,
    so that its back edge is checked too."""
    body = loop_instructions(sass)
    pending: list[set[int]] = []  # closed groups, oldest first
    open_group: set[int] = set()
    hazards = []
    for text in body + body:
        if (rs := HGMMA_RS.match(text)) is not None:
            open_group |= set(range(int(rs.group(1)), int(rs.group(1)) + 4))
            if "gsb0" in text:
                pending.append(open_group)
                open_group = set()
        elif (wait := WGMMA_WAIT.match(text)) is not None:
            del pending[:max(0, len(pending) - int(wait.group(1), 16))]
        elif busy := written_registers(text) & set().union(open_group, *pending):
            hazards.append(f"{text} (writes R{min(busy)} of a running HGMMA)")
    return hazards
