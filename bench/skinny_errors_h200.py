"""The raw op's contract checks on a real device: every TORCH_CHECK of csrc/skinny_binding.cpp.

The Python wrapper (optimized.skinny.skinny_matmul) rejects most bad input before the op, so on a
GPU the binding's own checks run only for callers that reach torch.ops.w4a16.skinny_matmul directly
(bench scripts, other projects). This calls the op with a few valid arguments, then with one
violation per case, expecting a RuntimeError whose message names what was expected; then runs
every forced stream split of one decode shape that fits shared memory and compares it with the
planned split. With --isolate a crashed case is rerun under a debugger for its native stack
(bench/isolate.py).

    python3 bench/skinny_errors_h200.py --out DIR              # one process
    python3 bench/skinny_errors_h200.py --out DIR --isolate    # one child process a case, so a crash
                                                               # (signal) is recorded, not fatal

Writes DIR/skinny_errors.{json,md}. Exit status 1 when any case crashed, raised the wrong error or
none, or a split differed from the plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.isolate import child, stack_sections  # noqa: E402
from bench.skinny_h200 import random_packs  # noqa: E402
from optimized import skinny  # noqa: E402

STREAM = skinny.VARIANTS.index("stream")
SPLIT_SHAPE = (16, 14336, 4096)  # M, K, N: llama3.1-8b.down at M = 16, where forced split 1 does not fit
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def valid(m: int = 2, k: int = 256, n: int = 64, g: int = 128, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Arguments of a valid call, by schema name; cases replace one."""
    torch.manual_seed(0)
    (qweight, scales, zeros), = random_packs(k, n, g, False, dtype, "cuda", 1)
    return {"x": torch.randn(m, k, device="cuda").to(dtype), "qweight": qweight, "scales": scales, "zeros": zeros,
            "group_size": g, "bias": None, "engine": "auto", "variant": -1, "overlap": "none", "split": 0}


def call(a: dict) -> torch.Tensor:
    return torch.ops.w4a16.skinny_matmul(a["x"], a["qweight"], a["scales"], a["zeros"], a["group_size"], a["bias"],
                                         a["engine"], a["variant"], a["overlap"], a["split"])


def with_(**changes) -> Callable[[], dict]:
    return lambda: {**valid(), **{k: v() if callable(v) else v for k, v in changes.items()}}


def misaligned_x() -> torch.Tensor:
    return torch.randn(2, 260, device="cuda").to(torch.bfloat16)[:, 4:]  # starts 8 bytes in, rows 520 apart


# (case id, arguments, a fragment the error message must hold, or None: the call must succeed with
# a finite output). The valid cases first: on the H100 in session 24 a valid stream call at M = 16
# as a process's first call crashed, and so did 20 of the violations (a number streamed into an
# error message, bench/torch_check_probe.py).
CASES: list[tuple[str, Callable[[], dict], str | None]] = [
    ("valid-m1-default", lambda: valid(1, *SPLIT_SHAPE[1:]), None),
    ("valid-m16-default", lambda: {**valid(*SPLIT_SHAPE), "overlap": "weights"}, None),
    ("valid-m16-stream-plan", lambda: {**valid(*SPLIT_SHAPE), "variant": STREAM}, None),
    ("x-float32", with_(x=lambda: torch.randn(2, 256, device="cuda")), "x must be float16 or bfloat16"),
    ("m-17", lambda: valid(m=17), "M must be in [1, 16]"),
    ("group-96", with_(group_size=96), "group_size must be 32, 64 or 128"),
    ("k-not-multiple-of-group", lambda: {**valid(k=192, g=64), "group_size": 128},
     "K must be a multiple of group_size"),
    ("x-strided-k", with_(x=lambda: torch.randn(2, 512, device="cuda").to(torch.bfloat16)[:, ::2]),
     "x must be contiguous along K"),
    ("x-rows-misaligned", with_(x=misaligned_x), "x rows must start on 16-byte boundaries"),
    ("qweight-3d", with_(qweight=lambda: torch.zeros(64, 32, 1, dtype=torch.int32, device="cuda")),
     "qweight must be 2-D"),
    ("qweight-too-few-bytes", with_(qweight=lambda: torch.zeros(64, 16, dtype=torch.int32, device="cuda")),
     "bytes but N*K/2"),
    ("qweight-float", with_(qweight=lambda: torch.zeros(64, 32, dtype=torch.float32, device="cuda")),
     "qweight must be int32/uint32"),
    ("qweight-wrong-width", with_(qweight=lambda: torch.zeros(64, 40, dtype=torch.int32, device="cuda")),
     "qweight must be [N, K/8]"),
    ("qweight-transposed", with_(qweight=lambda: torch.zeros(32, 64, dtype=torch.int32, device="cuda").t()),
     "qweight must be contiguous"),
    ("scales-fp16", with_(scales=lambda: torch.ones(64, 2, dtype=torch.float16, device="cuda")), "scales must be"),
    ("scales-wrong-shape", with_(scales=lambda: torch.ones(64, 3, dtype=torch.bfloat16, device="cuda")),
     "scales must be"),
    ("zeros-unpacked", with_(zeros=lambda: torch.full((64, 2), 8.0, dtype=torch.bfloat16, device="cuda")),
     "Zero points must be int32 or uint32 (packed 8x uint4 along dim 0)"),
    ("zeros-wrong-shape", with_(zeros=lambda: torch.zeros(64, 2, dtype=torch.int32, device="cuda")),
     "packed zero points must be [N/8, K/G]"),
    ("bias-wrong-shape", with_(bias=lambda: torch.zeros(63, dtype=torch.bfloat16, device="cuda")), "bias must be"),
    ("scales-on-cpu", with_(scales=lambda: torch.ones(64, 2, dtype=torch.bfloat16)), "all tensors must be on"),
    ("variant-9", with_(variant=9), "variant must be -1"),
    ("overlap-bogus", with_(overlap="bogus"), "overlap must be 'none' or 'weights'"),
    ("engine-bogus", with_(engine="bogus"), "engine must be 'auto', 'mma' or 'simt'"),
    ("split-negative", with_(variant=STREAM, split=-1), "split must be 0"),
    ("split-with-default", with_(split=2), "unless variant names a kernel other than"),
    ("split-with-seg-p", with_(variant=5, split=2), "unless variant names a kernel other than"),
    ("split-regs-beyond-warps", with_(variant=1, split=16), "must be a power of two up to the"),
    ("split-beyond-pieces", with_(variant=STREAM, split=3), "split must be in [1, K/128]"),
    ("split-too-small-for-shared", lambda: {**valid(*SPLIT_SHAPE), "variant": STREAM, "split": 1},
     "bytes of shared memory a block"),
]


def run_case(name: str) -> dict:
    _, make, fragment = next(c for c in CASES if c[0] == name)
    try:
        y = call(make())
        torch.cuda.synchronize()
    except RuntimeError as e:
        first = str(e).splitlines()[0][:300]
        return {"case": name, "ok": fragment is not None and fragment in str(e), "error": first, "expected": fragment}
    return {"case": name, "ok": fragment is None and bool(torch.isfinite(y).all()), "error": None,
            "expected": fragment}


def run_splits() -> list[dict]:
    """Every forced split that fits, against the plan's output (sums in another order: a close match)."""
    a = {**valid(*SPLIT_SHAPE), "variant": STREAM, "overlap": "weights"}
    planned = call(a).float()
    rows = []
    for split in SPLITS:
        try:
            y = call({**a, "split": split}).float()
            torch.cuda.synchronize()
        except RuntimeError as e:
            rows.append({"split": split, "refused": str(e).splitlines()[0][:200]})
            continue
        diff = ((y - planned).abs().max() / planned.abs().max().clamp_min(1e-6)).item()
        rows.append({"split": split, "max_rel_diff": diff, "ok": diff < 1e-2})
    return rows


def markdown(result: dict) -> str:
    lines = ["# Raw op contract checks and forced stream splits on a device", "",
             f"GPU {result['gpu']}; {sum(r['ok'] for r in result['cases'])} of {len(result['cases'])} cases "
             "as expected (a valid call returns a finite output, a violation raises its error).", "",
             "| case | ok | error (first line) |", "|---|---|---|"]
    for r in result["cases"]:
        said = r.get("error") or (f"crashed, exit status {r['returncode']}" if "returncode" in r else
                                  "returned" if r.get("expected") is None else "no error")
        lines.append(f"| {r['case']} | {'yes' if r['ok'] else 'NO'} | {said} |")
    if result["splits"]:
        lines += ["", f"Forced splits of M, K, N = {SPLIT_SHAPE} (bf16 asym, G 128) against the plan:", "",
                  "| split | result |", "|---|---|"]
    for r in result["splits"]:
        lines.append(f"| {r.get('split', '-')} | " + (f"refused: {r['refused']}" if "refused" in r else
                     f"crashed, exit status {r['returncode']}" if "returncode" in r else
                     f"max relative difference {r['max_rel_diff']:.2e}") + " |")
    lines += stack_sections([*result["cases"], *result["splits"]], lambda r: r.get("case", "the split sweep"))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--isolate", action="store_true", help="one child process a case")
    parser.add_argument("--cases", help="comma-separated case ids to run (default: all)")
    parser.add_argument("--no-splits", action="store_true", help="skip the forced-split sweep")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child: one case, JSON on the last line
    parser.add_argument("--splits", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    skinny.build()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return 0
    if args.splits:
        print(json.dumps(run_splits()))
        return 0
    start = time.perf_counter()
    cases = []
    names = [c[0] for c in CASES]
    chosen = args.cases.split(",") if args.cases else names
    if unknown := set(chosen) - set(names):
        parser.error(f"unknown case ids {sorted(unknown)}; known: {', '.join(names)}")
    for name in chosen:
        print(f"[case] {name}", flush=True)
        cases.append({"case": name, **child(__file__, ["--case", name])} if args.isolate else run_case(name))
    splits = [] if args.no_splits else child(__file__, ["--splits"]) if args.isolate else run_splits()
    splits = splits if isinstance(splits, list) else [splits]
    result = {"gpu": torch.cuda.get_device_name(), "cases": cases, "splits": splits,
              "seconds": time.perf_counter() - start}
    bad = [c["case"] for c in cases if not c["ok"]]
    bad += [f"split {s.get('split')}" for s in splits if not s.get("ok", True)]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "skinny_errors.json").write_text(json.dumps(result, indent=1))
        (args.out / "skinny_errors.md").write_text(markdown(result))
    print(markdown(result) + ("\nall as expected" if not bad else f"\nunexpected: {', '.join(bad)}"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
