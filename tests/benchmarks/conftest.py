"""The benchmark suite's options, matrix and session state.

    pytest tests/benchmarks --benchmark-only --benchmark-json=out/bench.json     # on a GPU
    pytest tests/benchmarks --benchmark-only --bench-m 1,2,3 --bench-shapes llama3.3-70b -k triton
    pytest -n auto                                   # anywhere: each body once, as a smoke test
    pytest tests/benchmarks --benchmark-only --bench-providers triton@decode,skinny@all   # a tuning sweep

The `--bench-*` options exist when tests/benchmarks (or a file in it) is on the command line;
the W4A16_BENCH_* environment variables work for any invocation (see matrix.OPTIONS).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from . import golden
from .matrix import OPTIONS, SelectionError, block_matrix, matrix, selection, selection_values, smoke_matrix
from .measure import FLUSH_BYTES, Roofline, Workspace
from .providers import Provider

# Stops starting cells this many seconds after the first one began, so a run under the GPU
# machine's 10-minute command limit still ends and writes its JSON; 0 means no limit.
DEFAULT_BUDGET_S = 480.0
STATE = pytest.StashKey["BenchSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("w4a16-bench", "W4A16 benchmarks (tests/benchmarks)")
    for option, env, text in OPTIONS.values():
        group.addoption(option, default=None, help=f"{text} (env {env})")
    group.addoption("--bench-budget-s", type=float, default=None,
                    help=f"skip cells once this many seconds have passed (default {DEFAULT_BUDGET_S:.0f}, "
                         "0: no limit; env W4A16_BENCH_BUDGET_S)")
    group.addoption("--update-golden", action="store_true", default=False,
                    help="merge this run's timings into the golden file (env W4A16_BENCH_UPDATE_GOLDEN=1)")
    group.addoption("--bench-golden", default=None,
                    help="golden file (default fixtures/golden/<the device's policy name>.json; env W4A16_BENCH_GOLDEN)")


def option(config: pytest.Config, name: str, env: str):
    """The option's value when this conftest registered it, else the environment's."""
    value = config.getoption(name, default=None)
    return os.environ.get(env) if value in (None, False) else value


def has_gpu() -> bool:
    return torch.cuda.is_available()


def timing_run(config: pytest.Config) -> bool:
    """Whether pytest-benchmark will time: it turns itself off under xdist and --benchmark-disable
    (read from its session object; it has no public accessor)."""
    session = getattr(config, "_benchmarksession", None)
    return has_gpu() and session is not None and not session.disabled


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Real shapes when timing; otherwise the smoke set, so a parity run (-n auto) on a GPU
    machine stays small instead of building 70B-sized weights in every worker."""
    try:
        sel = selection(selection_values(lambda name: metafunc.config.getoption(name, default=None)))
    except SelectionError as e:
        raise pytest.UsageError(str(e)) from None
    timing = timing_run(metafunc.config)
    if "cell" in metafunc.fixturenames:
        cells = matrix(sel) if timing else smoke_matrix(sel.providers, has_gpu())
        metafunc.parametrize("cell", cells, ids=[c.id for c in cells])
    if "block_cell" in metafunc.fixturenames:
        cells = block_matrix(sel.providers, timing, has_gpu())
        metafunc.parametrize("block_cell", cells, ids=[c.id for c in cells])


class BenchSession:
    """State shared by every cell of a run: the workspace, the roofline (measured at the first
    timed cell), the L2 flush buffer, the deadline and the golden bands."""

    def __init__(self, config: pytest.Config) -> None:
        self.device = "cuda" if has_gpu() else "cpu"
        self.device_name = torch.cuda.get_device_name() if has_gpu() else platform.processor() or "cpu"
        self.workspace = Workspace(self.device)
        budget = option(config, "bench_budget_s", "W4A16_BENCH_BUDGET_S")
        self.budget_s = DEFAULT_BUDGET_S if budget is None else float(budget)
        self.start = time.perf_counter()
        self.golden_path = Path(option(config, "bench_golden", "W4A16_BENCH_GOLDEN")
                                or golden.golden_path(self.device_name))
        self.golden = golden.load(self.golden_path)
        self.update_golden = bool(option(config, "update_golden", "W4A16_BENCH_UPDATE_GOLDEN"))
        self.timed: dict[str, dict] = {}
        self.comparisons: dict[str, golden.Comparison] = {}
        self._roofline: Roofline | None = None
        self._flush: torch.Tensor | None = None

    @property
    def roofline(self) -> Roofline:
        if self._roofline is None:
            self._roofline = Roofline.measure()
        return self._roofline

    @property
    def flush(self) -> torch.Tensor:
        if self._flush is None:
            self._flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=self.device)
        return self._flush

    def begin(self, benchmark, provider: Provider) -> None:
        """Skip (with the reason) a cell that cannot run here or now."""
        if benchmark.enabled and self.device == "cpu":
            pytest.skip("no GPU: timings need CUDA; without one, the bodies run once as a smoke test "
                        "under -n auto or --benchmark-disable")
        if benchmark.enabled and self.budget_s and time.perf_counter() - self.start > self.budget_s:
            pytest.skip(f"time budget of {self.budget_s:.0f} s spent (--bench-budget-s); select the rest "
                        "with --bench-shapes / --bench-m / -k in another run")
        missing = provider.missing()
        if missing:
            pytest.skip(f"{provider.name}: {missing}")

    def finish(self, benchmark, key: str) -> None:
        """Record the cell's band for --update-golden and compare it with its golden band;
        a regression fails the cell (after pytest-benchmark has its numbers)."""
        stats = benchmark.stats.stats
        median_us, iqr_us = stats.median * 1e6, stats.iqr * 1e6
        self.timed[key] = golden.band(median_us, iqr_us)
        c = golden.compare(self.golden, self.device_name, key, median_us)
        self.comparisons[key] = c
        benchmark.extra_info.update(golden=c.status, golden_detail=c.text, iqr_us=iqr_us)
        if c.regression and not self.update_golden:
            pytest.fail(f"{key}: slower than its golden band: {c.text}. Confirm against the baseline with "
                        "python3 -m tests.benchmarks.control before updating the goldens (--update-golden).",
                        pytrace=False)


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> BenchSession:
    state = BenchSession(request.config)
    request.config.stash[STATE] = state
    return state


def environment() -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "hip": torch.version.hip}
    if has_gpu():
        env["gpu"] = torch.cuda.get_device_name()
    gemlite = sys.modules.get("gemlite")  # imported only when its cells ran
    if gemlite is not None:
        env["gemlite"] = getattr(gemlite, "__version__", "unknown")
    return env


def invocation(config: pytest.Config) -> str:
    """The command line that ran this session, as the report's provenance quotes it."""
    return shlex.join([Path(sys.executable).name, "-m", "pytest", *config.invocation_params.args])


def commit() -> str | None:
    """The short commit id of the checkout, with "+" when it has uncommitted changes; None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["w4a16"] = environment() | {"command": invocation(config), "commit": commit()}
    state = config.stash.get(STATE, None)
    if state is not None and state._roofline is not None:
        machine_info["w4a16"]["roofline"] = state._roofline.as_dict()


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and state.update_golden and state.timed:
        golden.update(state.golden_path, state.device_name, environment(), state.timed)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or not state.comparisons:
        return
    tr = terminalreporter
    tr.section("W4A16 benchmarks against goldens")
    if state._roofline is not None:
        r = state._roofline
        tr.line(f"roofline: HBM {r.bytes_per_s / 1e12:.2f} TB/s, dense bf16 {r.dense_flops / 1e12:.0f} TFLOP/s")
    counts: dict[str, int] = {}
    for c in state.comparisons.values():
        counts[c.status] = counts.get(c.status, 0) + 1
    tr.line(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    for key, c in state.comparisons.items():
        if c.status in ("slower", "faster"):
            tr.line(f"{'REGRESSION' if c.status == 'slower' else 'IMPROVED (out of band)'} {key}: {c.text}")
    if state.update_golden:
        tr.line(f"golden file updated: {state.golden_path} ({len(state.timed)} cells)")
