"""Run one case of a device script in a fresh process, so that a crash is recorded, not fatal.

A case that dies on a signal is rerun under a debugger for its native stack: gdb where installed,
else cuda-gdb (the device image has no gdb; cuda-gdb debugs host code too). A debugger run loads
PyTorch's symbols, which is slow, so only the first few crashes of a script get one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

STACKS_PER_SCRIPT = 2
_stacks_taken = 0


def debugger() -> str | None:
    return shutil.which("gdb") or shutil.which("cuda-gdb")


def native_stack(command: list[str], frames: int = 40, timeout_s: int = 100) -> str:
    """The debugger's backtrace of `command` at its crash ("" without a debugger or a stack)."""
    tool = debugger()
    if tool is None:
        return ""
    try:
        proc = subprocess.run([tool, "-q", "-batch", "-ex", "run", "-ex", f"bt {frames}", "--args", *command],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{tool} timed out after {timeout_s} s"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("#") or "signal" in line.lower()]
    return "\n".join(line[:400] for line in lines)[:8000]  # the innermost frames say where


def child(script: str, args: list[str]) -> dict | list:
    """Runs `python3 -X faulthandler script *args`, whose last stdout line is JSON, and returns that
    JSON; a failed child gives {"ok": False, "returncode", "tail"} plus "backtrace" after a signal."""
    command = [sys.executable, "-X", "faulthandler", script, *args]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    row = {"ok": False, "returncode": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}
    global _stacks_taken
    if proc.returncode < 0 and _stacks_taken < STACKS_PER_SCRIPT:
        _stacks_taken += 1
        row["backtrace"] = native_stack(command)
        print(f"  native stack of the crash ({debugger()}):\n{row['backtrace']}", flush=True)
    return row


def stack_sections(rows: list[dict], name) -> list[str]:
    """Markdown sections, one a row of `child` that holds a native stack, titled name(row)."""
    lines: list[str] = []
    for r in rows:
        if r.get("backtrace"):
            lines += ["", f"Native stack of {name(r)}:", "", "```", r["backtrace"], "```"]
    return lines
