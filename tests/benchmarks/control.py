"""Control mode: two implementations timed interleaved in one process, on the same inputs and
the same cold weights, so a verdict rests on a same-run comparison and not on stale goldens.

    python3 -m tests.benchmarks.control baseline:triton triton --baseline-tree /tmp/base --out out/control
    python3 -m tests.benchmarks.control baseline:skinny skinny --baseline-tree /tmp/base --m 1,4,16
    python3 -m tests.benchmarks.control baseline:hybrid hybrid --baseline-tree /tmp/base --m 1,16,4096
    python3 -m tests.benchmarks.control tinygemm triton --m 1,2,4,8,16       # two providers of this tree
    python3 -m tests.benchmarks.control skinny@ring skinny@stream --m 5,8     # two forced kernels

    git worktree add /tmp/base <commit>     # one way to get a baseline tree

An implementation is a provider of tests/benchmarks/providers.py (this tree, forced choices such
as triton@<tile> included), or `baseline:triton`, `baseline:skinny`, `baseline:hybrid`: the same
provider built from the baseline tree's own `optimized` package. That package is copied (once per
content, into the build cache) with its ops renamed, w4a16:: -> w4a16_baseline::, in its Python
(strings and torch.ops calls) and its C++ (the TORCH_LIBRARY macros and op-name strings), and its
skinny extension is built under another name, so both trees' ops and kernels live side by side in
one process. The copy is imported as `w4a16_baseline.optimized` (its __init__ is not run;
absolute imports such as `oracle` resolve to this tree). The baseline is driven only through its
own `triton_w4a16.w4a16_matmul`, `skinny.skinny_matmul` and `hybrid.prepare` / `hybrid.matmul`
with their defaults (skinny with overlap="weights", as this tree's provider), so a baseline from
before or after a change of those modules' other arguments works alike.

Per cell (shape, M, dtype, symmetry) both get cold copies of one weight and the same x, are
checked by the oracle, and get one CUDA graph each (as in tests/benchmarks). Then they alternate,
A B, B A, A B, ... for --repeats pairs, each turn the median of --replays replays. The ratio
B / A per pair (< 1: B is faster) gives the cell's median ratio and its spread (min, max over
pairs, and the largest deviation from the median in %: the noise estimate). Verdict: "faster" or
"slower" only when every pair agrees and the median is more than NOISE_FLOOR from 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import re
import shlex
import shutil
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

from tests.support.compilers import built_once

from .matrix import SYMMETRY, SelectionError, parse_m, parse_names, parse_shapes
from .measure import MAX_GRAPH_CALLS, TARGET_REPLAY_S, Workspace, check, copies_for, group_of
from .providers import DTYPES, PROVIDERS, Provider, expand, resolve
from .timing import capture_graph, event_seconds, replay_seconds

ALIAS = "w4a16_baseline"
BASELINE_PROVIDERS = ("triton", "skinny", "hybrid")
# The baseline's own Python: the op namespace in schema strings and torch.ops calls, and the
# skinny extension's name, renamed so that both trees' ops and builds live side by side.
PY_RENAMES = (('"w4a16::', f'"{ALIAS}::'), ("'w4a16::", f"'{ALIAS}::"), ("torch.ops.w4a16.", f"torch.ops.{ALIAS}."),
              ('"w4a16_skinny"', f'"{ALIAS}_skinny"'))
# The baseline's C++: TORCH_LIBRARY(w4a16, ...), TORCH_LIBRARY_IMPL(w4a16, ...), ..._FRAGMENT, and
# op names in strings.
CPP_LIBRARY = re.compile(r"\b(TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(\s*)w4a16(\s*,)")
CPP_SUFFIXES = (".cpp", ".cu", ".cuh", ".h", ".hpp")
NOISE_FLOOR = 0.01
Timer = Callable[[list[Callable[[], object]]], Callable[[], float]]


def rename_python(text: str) -> str:
    for old, new in PY_RENAMES:
        text = text.replace(old, new)
    return text


def rename_cpp(text: str) -> str:
    return CPP_LIBRARY.sub(rf"\g<1>{ALIAS}\g<2>", text).replace('"w4a16::', f'"{ALIAS}::')


def package_files(tree: Path) -> list[Path]:
    """The files of tree/optimized a baseline copy holds (no bytecode, no hipify output)."""
    root = tree / "optimized"
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and not re.search(r"_hip\.|\.hip$", p.name))


def baseline_copy(tree: Path) -> Path:
    """tree/optimized copied with the renames applied (Python and C++), in the build cache
    (tests/support/compilers.py: one copy per content, so the skinny extension's build directory
    is reused by later runs against the same baseline). Returns the copied `optimized` folder."""
    tree = tree.resolve()
    files = package_files(tree)

    def build(folder: Path) -> None:
        for src in files:
            dst = folder / "optimized" / src.relative_to(tree / "optimized")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.suffix == ".py":
                dst.write_text(rename_python(src.read_text()))
            elif src.suffix in CPP_SUFFIXES:
                dst.write_text(rename_cpp(src.read_text()))
            else:
                shutil.copyfile(src, dst)

    recipe = repr((PY_RENAMES, CPP_LIBRARY.pattern, [str(f.relative_to(tree)) for f in files]))
    return built_once("w4a16-baseline", files, recipe, build) / "optimized"


class _BaselineFinder(importlib.abc.MetaPathFinder):
    """Imports `w4a16_baseline.optimized.X` from the renamed copy; writes no bytecode there."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, name, path, target=None):
        prefix = f"{ALIAS}.optimized."
        if not name.startswith(prefix):
            return None
        file = self.folder / (name[len(prefix):].replace(".", "/") + ".py")
        if not file.exists():
            return None
        return importlib.util.spec_from_file_location(name, file, loader=_SourceLoader(name, str(file)))


class _SourceLoader(importlib.machinery.SourceFileLoader):
    def set_data(self, path, data, *, _mode=0o666):  # no .pyc beside the copy
        return None


def load_baseline(tree: Path) -> str:
    """Make the baseline tree's `optimized` importable as `w4a16_baseline.optimized` (once per
    process); returns that package name."""
    tree = tree.resolve()
    package = f"{ALIAS}.optimized"
    if not (tree / "optimized" / "triton_w4a16.py").exists():
        raise ValueError(f"{tree} has no optimized/triton_w4a16.py: not a w4a16-oracle tree")
    loaded = sys.modules.get(package)
    if loaded is not None:
        if getattr(loaded, "__baseline_tree__", None) != tree:
            raise ValueError(f"a baseline from {loaded.__baseline_tree__} is already loaded in this process")
        return package
    folder = baseline_copy(tree)
    root, pkg = types.ModuleType(ALIAS), types.ModuleType(package)
    root.__path__, pkg.__path__ = [], [str(folder)]
    pkg.__baseline_tree__ = tree
    sys.modules[ALIAS], sys.modules[package] = root, pkg
    sys.meta_path.insert(0, _BaselineFinder(folder))
    return package


def implementation(spec: str, baseline_tree: Path | None) -> Provider:
    """'triton', 'skinny@ring' (this tree's providers) or 'baseline:triton' (built from the baseline tree)."""
    name = spec.removeprefix("baseline:")
    try:
        names = expand(name)
    except ValueError as e:
        raise ValueError(f"{spec!r}: {e}; choose from {list(PROVIDERS)} or a forced choice") from None
    if names != [name]:
        raise ValueError(f"{spec!r} names {len(names)} providers ({', '.join(names[:3])}, ...): name one")
    if name == spec:
        return resolve(name)
    if name not in BASELINE_PROVIDERS:
        raise ValueError(f"{spec!r}: a baseline tree provides {['baseline:' + p for p in BASELINE_PROVIDERS]} only")
    if baseline_tree is None:
        raise ValueError(f"{spec!r} needs --baseline-tree")
    package = load_baseline(baseline_tree)
    build = PROVIDERS[name].build
    # The baseline's own skinny kernel decides whether it can run (the first call builds it).
    return dataclasses.replace(PROVIDERS[name], name=spec, module=None, available=None,
                               build=lambda w, dtype: build(w, dtype, package=package))


def graph_timer(fns: list[Callable[[], object]], replays: int) -> Callable[[], float]:
    """One graph of back-to-back calls over the cold copies; each call of the returned function
    gives the median per-call seconds of `replays` replays."""
    single = event_seconds(fns[0], 3)
    calls = max(len(fns), min(MAX_GRAPH_CALLS, math.ceil(TARGET_REPLAY_S / single)))
    graph = capture_graph(fns, calls)
    replay_seconds(graph)  # the first replay uploads the graph
    return lambda: statistics.median(replay_seconds(graph) for _ in range(replays)) / calls


def interleave(time_a: Callable[[], float], time_b: Callable[[], float], repeats: int) -> dict:
    """A B, B A, A B, ...: drift in the machine's state (clocks, temperature) hits both alike."""
    a, b = [], []
    for r in range(repeats):
        if r % 2 == 0:
            a.append(time_a())
            b.append(time_b())
        else:
            b.append(time_b())
            a.append(time_a())
    ratios = [tb / ta for ta, tb in zip(a, b)]
    median = statistics.median(ratios)
    noise = max(abs(r / median - 1) for r in ratios)
    if min(ratios) <= 1 <= max(ratios) or abs(median - 1) <= NOISE_FLOOR:
        verdict = "same"
    else:
        verdict = "faster" if median < 1 else "slower"
    return {"a_us": statistics.median(a) * 1e6, "b_us": statistics.median(b) * 1e6, "ratio": median,
            "ratio_min": min(ratios), "ratio_max": max(ratios), "noise_pct": 100 * noise, "verdict": verdict,
            "ratios": ratios}


def compare(a: Provider, b: Provider, cells: list[tuple], device: str, timer: Timer, repeats: int,
            cold: bool, deadline: float | None = None, log=print) -> list[dict]:
    """cells: (shape, M, dtype, symmetric). timer(fns) -> a function giving per-call seconds.
    cold: make cold copies (GPU); otherwise one copy each. Each implementation's output is judged
    before it is timed; a wrong one (or any error) is the cell's result, recorded in "error"."""
    ws, rows = Workspace(device), []
    for shape, m, dtype, symmetric in cells:
        row = {"shape": shape.id, "m": m, "dtype": dtype, "sym": "sym" if symmetric else "asym", "a": a.name,
               "b": b.name}
        if deadline is not None and time.perf_counter() > deadline:
            rows.append(row | {"error": "not run: time budget spent"})
            continue
        try:
            ws.use((shape, dtype, symmetric))
            x, ref = ws.input(shape, dtype, symmetric, m)
            timers = []
            for p in (a, b):
                count = copies_for(p.weight_bytes(shape.k, shape.n, group_of(shape), symmetric)) if cold else 1
                calls = ws.calls(p, shape, dtype, symmetric, count)
                check(p, calls[0], x, ref, f"{p.name} {shape.id} M={m}")
                timers.append(timer([lambda c=c: c(x) for c in calls]))
            row |= interleave(timers[0], timers[1], repeats)
        except BaseException as e:  # noqa: BLE001 - a failed check (pytest.fail) or error is this cell's result
            if isinstance(e, KeyboardInterrupt):
                raise
            row["error"] = f"{type(e).__name__}: {e}".strip()[:400]
        rows.append(row)
        log(format_row(row))
    return rows


def format_row(r: dict) -> str:
    head = f"{r['shape']:<36} M={r['m']:<5} {r['dtype']} {r['sym']:<4}"
    if "error" in r:
        return f"{head} {r['error']}"
    return (f"{head} {r['a']} {r['a_us']:9.2f} us  {r['b']} {r['b_us']:9.2f} us  B/A {r['ratio']:.3f} "
            f"[{r['ratio_min']:.3f}, {r['ratio_max']:.3f}] noise {r['noise_pct']:.1f}%  {r['verdict']}")


def markdown(rows: list[dict], argv: list[str]) -> str:
    lines = ["# Control: B / A, interleaved in one process", "",
             f"`python3 -m tests.benchmarks.control {shlex.join(argv)}`", "",
             "| shape | M | dtype | sym | A us | B us | B/A | min | max | noise % | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["shape"], str(r["m"]), r["dtype"], r["sym"]]
        if "error" in r:
            lines.append("| " + " | ".join(cells + [r["error"]] + [""] * 6) + " |")
        else:
            lines.append("| " + " | ".join(cells + [f"{r['a_us']:.2f}", f"{r['b_us']:.2f}", f"{r['ratio']:.3f}",
                                                    f"{r['ratio_min']:.3f}", f"{r['ratio_max']:.3f}",
                                                    f"{r['noise_pct']:.1f}", r["verdict"]]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python3 -m tests.benchmarks.control", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="implementation A (the reference of the ratio), e.g. baseline:triton")
    parser.add_argument("b", help="implementation B, e.g. triton")
    parser.add_argument("--baseline-tree", type=Path, default=None, help="checkout providing baseline:NAME")
    parser.add_argument("--shapes", default="default", help="as --bench-shapes (default: the Llama shapes)")
    parser.add_argument("--m", default="1,4,16,256,4096", help="as --bench-m")
    parser.add_argument("--dtypes", default="bf16", help="as --bench-dtypes")
    parser.add_argument("--sym", default="asym", help="as --bench-sym")
    parser.add_argument("--repeats", type=int, default=6, help="A/B pairs per cell")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per turn (median)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no cell after this many seconds (0: none)")
    parser.add_argument("--out", type=Path, default=Path("out/control"), help="folder for control.json and control.md")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the control mode times on a GPU")
    try:
        a, b = implementation(args.a, args.baseline_tree), implementation(args.b, args.baseline_tree)
        shapes, ms = parse_shapes(args.shapes), parse_m(args.m)
        dtypes = parse_names(args.dtypes, list(DTYPES), "--dtypes")
        syms = [SYMMETRY[s] for s in parse_names(args.sym, list(SYMMETRY), "--sym")]
    except (ValueError, SelectionError) as e:
        parser.error(str(e))
    cells = [(s, m, d, y) for s in shapes for d in dtypes for y in syms for m in ms
             if a.valid(s, m, d) and b.valid(s, m, d)]
    start = time.perf_counter()
    rows = compare(a, b, cells, "cuda", lambda fns: graph_timer(fns, args.replays), args.repeats, cold=True,
                   deadline=start + args.budget_s if args.budget_s else None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control.json").write_text(json.dumps({"argv": argv, "gpu": torch.cuda.get_device_name(),
                                                       "rows": rows}, indent=1))
    (args.out / "control.md").write_text(markdown(rows, argv))
    print(f"wrote {args.out / 'control.json'} and control.md ({time.perf_counter() - start:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
