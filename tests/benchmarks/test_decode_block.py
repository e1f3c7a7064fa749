"""End-to-end decode proxy: the four linear layers of one transformer block (qkv, o, gate_up,
down) of Llama-3.1-8B and Llama-3.3-70B at M = 1 and 16, back to back in one CUDA graph per
provider, each pass on its own cold copy of the block; reported as tokens/s per block (a pass
moves M tokens through the block's linear layers). Attention and norms are left out: this is
the part W4A16 kernels change."""

from __future__ import annotations

import pytest

from .matrix import BlockCell
from .measure import check, copies_for, gpu_clock, group_of, problem_bytes, rates, time_graph
from .providers import HybridCall, resolve

pytestmark = pytest.mark.benchmark(group="decode-block", timer=gpu_clock)


def test_decode_block(benchmark, bench, block_cell: BlockCell) -> None:
    cell, provider = block_cell, resolve(block_cell.provider)
    bench.begin(benchmark, provider)
    ws = bench.workspace
    ws.use(("block", cell.model, cell.dtype, cell.symmetric))
    block_bytes = sum(provider.weight_bytes(s.k, s.n, group_of(s), cell.symmetric) for s in cell.layers)
    count = copies_for(block_bytes) if benchmark.enabled else 1
    layers = [ws.calls(provider, s, cell.dtype, cell.symmetric, count) for s in cell.layers]
    xs, info = [], {"kind": "block", "id": cell.id, "model": cell.model, "m": cell.m, "dtype": cell.dtype,
                    "sym": "sym" if cell.symmetric else "asym", "provider": cell.provider,
                    "layers": [s.id for s in cell.layers]}
    for shape, calls in zip(cell.layers, layers):
        x, ref = ws.input(shape, cell.dtype, cell.symmetric, cell.m)
        check(provider, calls[0], x, ref, f"{cell.id} {shape.layer}")
        xs.append(x)
        if isinstance(calls[0], HybridCall):
            info.setdefault("hybrid_impl", {})[shape.layer] = calls[0].chosen(cell.m)["hybrid_impl"]
    passes = [lambda i=i: [calls[i](x) for calls, x in zip(layers, xs)] for i in range(count)]
    benchmark.extra_info.update(info)
    if not benchmark.enabled:
        benchmark.pedantic(passes[0])  # the smoke run: one block pass, untimed
        return
    benchmark.extra_info.update(time_graph(benchmark, passes, bench.flush))
    roof, seconds = bench.roofline, benchmark.stats.stats.median
    flops = sum(2 * cell.m * s.n * s.k for s in cell.layers)
    nbytes = sum(problem_bytes(s, cell.m, cell.symmetric, provider) for s in cell.layers)
    # Each layer is its own launch: the block's floor is the sum of the layers' floors.
    own_floor = sum(roof.floor_s(problem_bytes(s, cell.m, cell.symmetric, provider), 2 * cell.m * s.n * s.k)
                    for s in cell.layers)
    w4_floor = sum(roof.floor_s(problem_bytes(s, cell.m, cell.symmetric), 2 * cell.m * s.n * s.k) for s in cell.layers)
    benchmark.extra_info.update(rates(seconds, nbytes, flops, own_floor, w4_floor), tokens_per_s=cell.m / seconds,
                                cold_bytes=count * block_bytes, roofline=roof.as_dict())
    bench.finish(benchmark, f"block/{cell.id}")
