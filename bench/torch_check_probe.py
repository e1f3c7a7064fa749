"""Does a failed TORCH_CHECK raise, or crash, in an extension built on this machine?

On the H100 in session 24, 20 of 24 contract violations of the raw skinny op ended in SIGSEGV
(bench/results/h100/skinny_errors_s24.md): exactly those whose message formats a number or a size
list; the binding was then a .cu unit, built by nvcc (it is now skinny_binding.cpp). This builds
the same few checks twice, once compiled by nvcc (a .cu unit) and once by the host C++ compiler
(a .cpp unit), and calls each in a fresh process (a crash is rerun under a debugger,
bench/isolate.py):

  format-int   c10::str of an int64, no throw (formatting alone)
  fail-str     TORCH_CHECK whose message is text and a std::string
  fail-int     TORCH_CHECK whose message formats an int64
  fail-sizes   TORCH_CHECK whose message formats a tensor's sizes()
  fail-to-str  TORCH_CHECK whose message is one std::string built with std::to_string
  torch-error  PyTorch's own error with numbers in its message (a matmul of mismatched shapes)

    python3 bench/torch_check_probe.py --out DIR

Writes DIR/torch_check_probe.{json,md}. Exit status 1 when any case crashed or raised the wrong
message. Needs nvcc and a C++ compiler; no GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.isolate import child, debugger, stack_sections  # noqa: E402

CHECKS = r"""
#include <ATen/ATen.h>
#include <torch/library.h>
#include <string>

namespace {
int64_t format_int(int64_t n) { return static_cast<int64_t>(c10::str("n=", n).size()); }
void fail_str(int64_t n) { TORCH_CHECK(n < 0, "probe: text and ", std::string("a string")); }
void fail_int(int64_t n) { TORCH_CHECK(n < 0, "probe: n=", n); }
void fail_sizes(const at::Tensor& t) { TORCH_CHECK(t.dim() < 0, "probe: sizes ", t.sizes()); }
void fail_to_str(int64_t n) { TORCH_CHECK(n < 0, std::string("probe: n=") + std::to_string(n)); }
}  // namespace

TORCH_LIBRARY(LIBNAME, m) {
  m.def("format_int(int n) -> int", &format_int);
  m.def("fail_str(int n) -> ()", &fail_str);
  m.def("fail_int(int n) -> ()", &fail_int);
  m.def("fail_sizes(Tensor t) -> ()", &fail_sizes);
  m.def("fail_to_str(int n) -> ()", &fail_to_str);
}
"""

# (case, the op's name, its argument, the message fragment a raise must hold, or None: returns)
CASES = [
    ("format-int", "format_int", 12345, None),
    ("fail-str", "fail_str", 7, "probe: text and a string"),
    ("fail-int", "fail_int", 12345, "probe: n=12345"),
    ("fail-sizes", "fail_sizes", "tensor", "probe: sizes [2, 3]"),
    ("fail-to-str", "fail_to_str", 12345, "probe: n=12345"),
    ("torch-error", None, None, "(2x3 and 4x5)"),
]
UNITS = ("cu", "cpp")


def build(unit: str) -> object:
    from torch.utils.cpp_extension import load_inline

    name = f"w4probe_{unit}"
    source = CHECKS.replace("LIBNAME", name)
    if unit == "cu":
        return load_inline(name, cpp_sources="", cuda_sources=source, is_python_module=False)
    return load_inline(name, cpp_sources=source, is_python_module=False)


def run_case(unit: str, case: str) -> dict:
    build(unit)
    _, op, arg, fragment = next(c for c in CASES if c[0] == case)
    try:
        if op is None:
            got = torch.zeros(2, 3) @ torch.zeros(4, 5)
        else:
            got = getattr(getattr(torch.ops, f"w4probe_{unit}"), op)(torch.zeros(2, 3) if arg == "tensor" else arg)
    except RuntimeError as e:
        return {"ok": fragment is not None and fragment in str(e), "said": str(e).splitlines()[0][:200]}
    return {"ok": fragment is None and got == len("n=12345"), "said": f"returned {got}"}


def toolchain() -> dict:
    def first_line(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
        except OSError as e:
            return f"unavailable: {e}"
        return out[-1] if cmd[0] == "nvcc" else out[0] if out else ""

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cxx11_abi": torch._C._GLIBCXX_USE_CXX11_ABI,
            "python": platform.python_version(), "nvcc": first_line(["nvcc", "--version"]),
            "c++": first_line(["c++", "--version"]), "debugger": debugger()}


def markdown(result: dict) -> str:
    lines = ["# Failed TORCH_CHECKs in an extension: nvcc (.cu) against the host compiler (.cpp)", "",
             "Toolchain: " + ", ".join(f"{k} {v}" for k, v in result["toolchain"].items()), "",
             "| case | unit | ok | result |", "|---|---|---|---|"]
    for r in result["cases"]:
        said = r.get("said") or f"crashed, exit status {r.get('returncode')}"
        lines.append(f"| {r['case']} | {r['unit']} | {'yes' if r['ok'] else 'NO'} | {said} |")
    lines += stack_sections(result["cases"], lambda r: f"{r['case']} ({r['unit']})")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", nargs=2, metavar=("UNIT", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(*args.case)))
        return 0
    for unit in UNITS:  # build once here, so that the children load the cached library
        build(unit)
    # torch-error does not depend on the unit: run once, under the first.
    plan = [(unit, case) for unit in UNITS for case, op, *_ in CASES if op is not None or unit == UNITS[0]]
    rows = [{"case": case, "unit": unit, **child(__file__, ["--case", unit, case])} for unit, case in plan]
    result = {"toolchain": toolchain(), "cases": rows}
    text = markdown(result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "torch_check_probe.json").write_text(json.dumps(result, indent=1))
        (args.out / "torch_check_probe.md").write_text(text)
    print(text, flush=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
