"""Every provider on every selected (shape, M, dtype, symmetry) cell: checked by the oracle,
then timed with cold weights in a CUDA graph (see measure.py and DESIGN.md section 5)."""

from __future__ import annotations

import pytest

from .matrix import Cell
from .measure import check, copies_for, gpu_clock, group_of, problem_bytes, rates, time_graph
from .providers import HybridCall, resolve

pytestmark = pytest.mark.benchmark(group="matmul", timer=gpu_clock)


def cell_info(cell: Cell) -> dict:
    s = cell.shape
    return {"kind": "matmul", "id": cell.id, "shape": s.id, "model": s.model, "layer": s.layer, "k": s.k, "n": s.n,
            "group": group_of(s), "m": cell.m, "dtype": cell.dtype, "sym": cell.sym, "provider": cell.provider,
            **resolve(cell.provider).info}


def test_matmul(benchmark, bench, cell: Cell) -> None:
    provider = resolve(cell.provider)
    bench.begin(benchmark, provider)
    ws = bench.workspace
    ws.use(cell.weight_key)
    shape, weight_bytes = cell.shape, provider.weight_bytes(cell.shape.k, cell.shape.n, group_of(cell.shape),
                                                            cell.symmetric)
    calls = ws.calls(provider, shape, cell.dtype, cell.symmetric, copies_for(weight_bytes) if benchmark.enabled else 1)
    x, ref = ws.input(shape, cell.dtype, cell.symmetric, cell.m)
    info = cell_info(cell) | {"worst_ratio": check(provider, calls[0], x, ref, cell.id)}
    if isinstance(calls[0], HybridCall):
        info |= calls[0].chosen(cell.m)
    benchmark.extra_info.update(info)
    if not benchmark.enabled:
        benchmark.pedantic(calls[0], args=(x,))  # the smoke run: the body once, untimed
        return
    benchmark.extra_info.update(time_graph(benchmark, [lambda c=c: c(x) for c in calls], bench.flush))
    roof, flops = bench.roofline, 2 * cell.m * shape.n * shape.k
    nbytes, w4_bytes = problem_bytes(shape, cell.m, cell.symmetric, provider), problem_bytes(shape, cell.m, cell.symmetric)
    benchmark.extra_info.update(
        rates(benchmark.stats.stats.median, nbytes, flops, roof.floor_s(nbytes, flops), roof.floor_s(w4_bytes, flops)),
        cold_bytes=len(calls) * weight_bytes, roofline=roof.as_dict())
    bench.finish(benchmark, f"matmul/{cell.id}")
