"""Per-call time of a short GPU call as DESIGN.md section 5 measures it: a CUDA graph of many
back-to-back calls, each on its own cold weight copy, median replay time / calls."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def graph_seconds(fns: list[Callable[[], object]], calls: int | None = None, replays: int = 10) -> float:
    """fns: one closure per cold weight copy; the graph holds `calls` calls (default: one per
    closure) cycling through them. Returns the median per-call seconds over `replays` replays
    (the first replay, which pays for graph upload, is dropped)."""
    calls = calls or len(fns)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()  # allocator and lazy initialization stay outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    times = []
    for _ in range(replays + 1):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    del graph
    return statistics.median(times[1:]) / calls
