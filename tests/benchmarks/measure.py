"""Checking and timing one benchmark cell, as DESIGN.md section 5 says.

Cold weights: each provider gets copies of its weight totalling COLD_BYTES (over 10x the H200's
60 MB L2), and the timed CUDA graph cycles through them. pytest-benchmark sees per-call GPU
seconds: the tests mark themselves `benchmark(timer=gpu_clock)`, a clock that only `advance`
moves, by replay time / calls, so every round it records is one replay's per-call time and its
median is DESIGN's headline number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pytest
import torch

from oracle import judge, quantize_rtn, random_quantized, reference_matmul
from oracle.canonical import QuantizedWeight
from oracle.reference import Reference
from oracle.shapes import LinearShape

from .providers import DTYPES, Call, Provider, w4_weight_bytes
from .timing import capture_graph, dense_rate, event_seconds, hbm_bandwidth, replay_seconds

COLD_BYTES = 640 << 20
MAX_COPIES = 256
REPLAYS = 10                # timed rounds (graph replays) per cell, after one warm-up replay
TARGET_REPLAY_S = 2e-3      # calls per graph: enough for ~2 ms a replay, at least one per copy
MAX_GRAPH_CALLS = 1024
FLUSH_BYTES = 256 << 20     # written before each secondary (single-call) timing
EVENT_REPS = 5

_gpu_seconds = 0.0


def gpu_clock() -> float:
    """pytest-benchmark's timer for these tests: GPU seconds measured so far."""
    return _gpu_seconds


def advance(seconds: float) -> None:
    global _gpu_seconds
    _gpu_seconds += seconds


@dataclass(frozen=True)
class Roofline:
    """What the floors divide by, measured once per session on the GPU in hand."""

    bytes_per_s: float       # HBM: the larger of copy (read + write) and read-only bandwidth
    dense_flops: float       # dense bf16 cuBLAS at 8192^3
    copy_bytes_per_s: float
    read_bytes_per_s: float

    @classmethod
    def measure(cls) -> "Roofline":
        bw = hbm_bandwidth()
        return cls(bw["bytes_per_s"], dense_rate(), bw["copy_bytes_per_s"], bw["read_bytes_per_s"])

    def floor_s(self, nbytes: int, flops: int) -> float:
        return max(nbytes / self.bytes_per_s, flops / self.dense_flops)

    def as_dict(self) -> dict:
        return asdict(self)


def io_bytes(m: int, shape: LinearShape) -> int:
    """x read and y written, 16-bit each."""
    return 2 * m * shape.k + 2 * m * shape.n


def group_of(shape: LinearShape) -> int:
    return shape.k if shape.group_size == -1 else shape.group_size


def copies_for(bytes_per_copy: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(COLD_BYTES / bytes_per_copy)))


def make_weight(shape: LinearShape, dtype: str, symmetric: bool, device: str,
                generator: torch.Generator) -> QuantizedWeight:
    """RTN-quantized Gaussian weight with scales in the activation dtype; drawn on the GPU there
    (the CPU path is slow at 470M values)."""
    if device == "cpu":
        return random_quantized(shape.n, shape.k, shape.group_size, symmetric, DTYPES[dtype], generator=generator)
    w = torch.randn(shape.n, shape.k, device=device, generator=generator) * 0.02
    return quantize_rtn(w, shape.group_size, symmetric, DTYPES[dtype])


class Workspace:
    """The weights of the cells running now, each provider's copies of them, and the inputs and
    fp64 reference per M. Cells come weight by weight (matrix order), so whatever belongs to
    another weight is dropped when a new one is asked for."""

    def __init__(self, device: str, seed: int = 0) -> None:
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.key: tuple | None = None
        self.weights: dict[LinearShape, QuantizedWeight] = {}
        self.copies: dict[tuple[str, LinearShape], list[Call]] = {}
        self.inputs: dict[tuple[LinearShape, int], tuple[torch.Tensor, Reference]] = {}

    def use(self, key: tuple) -> None:
        if key != self.key:
            self.key, self.weights, self.copies, self.inputs = key, {}, {}, {}
            if self.device == "cuda":
                torch.cuda.empty_cache()

    def weight(self, shape: LinearShape, dtype: str, symmetric: bool) -> QuantizedWeight:
        if shape not in self.weights:
            self.weights[shape] = make_weight(shape, dtype, symmetric, self.device, self.generator)
        return self.weights[shape]

    def calls(self, provider: Provider, shape: LinearShape, dtype: str, symmetric: bool, count: int) -> list[Call]:
        """`count` cold copies of the weight through `provider` (built once per weight)."""
        key = (provider.name, shape)
        if key not in self.copies:
            w = self.weight(shape, dtype, symmetric)
            self.copies[key] = [provider.build(w, DTYPES[dtype]) for _ in range(count)]
        return self.copies[key]

    def input(self, shape: LinearShape, dtype: str, symmetric: bool, m: int) -> tuple[torch.Tensor, Reference]:
        """x: dtype [M, K], and its exact reference; only the latest M per shape is kept."""
        if (shape, m) not in self.inputs:
            self.inputs = {k: v for k, v in self.inputs.items() if k[0] != shape}
            w = self.weight(shape, dtype, symmetric)
            x = torch.randn(m, shape.k, device=self.device, generator=self.generator).to(DTYPES[dtype])
            self.inputs[(shape, m)] = (x, reference_matmul(x, w, accumulate=torch.float64))
        return self.inputs[(shape, m)]


def check(provider: Provider, call: Call, x: torch.Tensor, ref: Reference, label: str) -> float:
    """Judge one output with the oracle's error model before anything is timed; fails the test
    with the verdict when it is wrong. Returns the worst error / tight bound."""
    v = judge(call(x), ref, dequant_dtype=x.dtype if provider.dequant_dtype else None,
              dequant_roundings=provider.roundings)
    if not v.passed:
        pytest.fail(f"{label}: wrong output, not timed\n{v.summary()}", pytrace=False)
    return v.worst_ratio


def time_graph(benchmark, fns: list[Callable[[], object]], flush: torch.Tensor) -> dict:
    """Times `fns` (one closure per cold copy) through `benchmark`: a CUDA graph of back-to-back
    calls cycling through them, REPLAYS replays, each recorded as replay time / calls. Returns
    the secondary single-call time after an L2 flush and the graph's size."""
    single = event_seconds(fns[0], EVENT_REPS, flush)
    calls = max(len(fns), min(MAX_GRAPH_CALLS, math.ceil(TARGET_REPLAY_S / single)))
    graph = capture_graph(fns, calls)
    benchmark.pedantic(lambda: advance(replay_seconds(graph) / calls), rounds=REPLAYS, warmup_rounds=1)
    return {"event_us": single * 1e6, "graph_calls": calls, "copies": len(fns)}


def rates(seconds: float, nbytes: int, flops: int, floor_s: float, w4_floor_s: float) -> dict:
    """Achieved rates and % of floors for one timed call (or block pass)."""
    return {"median_us": seconds * 1e6, "bytes": nbytes, "gbps": nbytes / seconds / 1e9,
            "tflops": flops / seconds / 1e12, "own_floor_us": floor_s * 1e6, "pct_of_own_floor": 100 * floor_s / seconds,
            "floor_us": w4_floor_s * 1e6, "pct_of_floor": 100 * w4_floor_s / seconds}


def problem_bytes(shape: LinearShape, m: int, symmetric: bool, provider: Provider | None = None) -> int:
    """HBM bytes of one call: the W4 problem's (provider None) or what `provider` must read."""
    weight = (provider.weight_bytes if provider else w4_weight_bytes)(shape.k, shape.n, group_of(shape), symmetric)
    return weight + io_bytes(m, shape)

