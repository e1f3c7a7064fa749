"""GPU timing for the benchmarks and the control mode, as DESIGN.md section 5 measures it.

The headline: a CUDA graph of many back-to-back calls, each on its own cold weight copy, median
replay time / calls. Also the secondary measurement (one call between events after an L2 flush)
and the two rates the floors divide by (HBM bandwidth, dense bf16 FLOP/s), measured on the GPU in
hand. Every function here needs a CUDA (or ROCm) device.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def capture_graph(fns: list[Callable[[], object]], calls: int | None = None) -> torch.cuda.CUDAGraph:
    """A graph of `calls` calls (default: one per closure) cycling through `fns`, one closure per
    cold weight copy. Two warm-up calls on a side stream keep the allocator and lazy
    initialization (Triton compilation, cuBLAS handles) outside the capture."""
    calls = calls or len(fns)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    return graph


def replay_seconds(graph: torch.cuda.CUDAGraph) -> float:
    """Seconds of one replay of `graph`, between events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e-3


def graph_seconds(fns: list[Callable[[], object]], calls: int | None = None, replays: int = 10) -> float:
    """fns: one closure per cold weight copy; the graph holds `calls` calls (default: one per
    closure) cycling through them. Returns the median per-call seconds over `replays` replays
    (the first replay, which pays for graph upload, is dropped)."""
    calls = calls or len(fns)
    graph = capture_graph(fns, calls)
    times = [replay_seconds(graph) for _ in range(replays + 1)]
    del graph
    return statistics.median(times[1:]) / calls


def event_seconds(fn: Callable[[], object], reps: int, flush: torch.Tensor | None = None) -> float:
    """Median seconds of single calls between events, each after writing `flush` (a buffer
    larger than L2) when given. Carries several microseconds of fixed launch cost."""
    fn()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return statistics.median(times)


def hbm_bandwidth(device: str = "cuda") -> dict:
    """Bytes per second of a 2 GiB device copy (read + write counted) and of a 2 GiB read-only
    sum; floors use the larger, which is the stricter floor."""
    src = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    words = src.view(torch.int32)
    copy_s = event_seconds(lambda: dst.copy_(src), reps=12)
    read_s = event_seconds(lambda: words.sum(), reps=12)
    copy_bw, read_bw = 2 * (1 << 31) / copy_s, (1 << 31) / read_s
    return {"copy_bytes_per_s": copy_bw, "read_bytes_per_s": read_bw, "bytes_per_s": max(copy_bw, read_bw)}


def dense_rate(device: str = "cuda") -> float:
    """bf16 FLOP/s of an 8192^3 cuBLAS matmul on random data."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    return 2 * 8192**3 / event_seconds(lambda: a @ b, reps=10)
