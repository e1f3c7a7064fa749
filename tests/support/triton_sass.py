"""Instructions per weight in the Triton kernel's K loop, from sm_90 SASS built without a GPU.

A tile is fitted to K = N = 8192 as the device's policy fits its table (`select_config`), compiled
for sm_90 with the specialization a real launch gets, disassembled with the cuobjdump Triton
ships (tests/support/sass.py), and its main loop (the longest backward branch) counted by opcode.
"Per weight" divides by the weight elements one thread handles per loop iteration (block_n *
block_k / threads), so it is the cost of a weight, not of a multiply-add: a multi-row GEMV spends
its count on block_m rows.

The kernels must be compiled ones: under Triton's interpreter (TRITON_INTERPRET=1 when
`optimized.triton_w4a16` was imported) they cannot be, so callers run this in a process without it
(tests run it in a subprocess, tools/triton_sass.py clears the variable before importing).
"""

from __future__ import annotations

import os

FIT_K = FIT_N = 8192
DEVICE = "NVIDIA H200"  # whose policy fits the tile (target_programs, split_below)


def analyse(tile, group: int = 128, dtype: str = "bf16", symmetric: bool = False, device: str = DEVICE) -> dict:
    """tile: an optimized.tile_configs.TileConfig; group: the resolved group size; dtype: "fp16"
    or "bf16" (x, scales and y). Returns the fitted tile's id, registers and stack bytes per
    thread, the loop's instruction count, weights per thread per iteration, instructions per
    weight and each opcode's count per weight (most frequent first)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1: the kernels are interpreted functions here and cannot be "
                           "compiled; run in a process without it")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from optimized import triton_w4a16
    from optimized.policy import policy_for
    from optimized.tile_configs import fit_config
    from tests.support.sass import cubin_resources, cuobjdump, loop_opcodes

    table = policy_for(device).triton
    fitted = fit_config(tile, FIT_N, FIT_K, group, table.target_programs, table.split_below)
    partials = fitted.split_k > 1
    fn = triton_w4a16._w4a16_kernel
    constexprs = triton_w4a16.kernel_constexprs(fitted, group, partials, not symmetric, False, False)
    sig, attrs = triton_w4a16.compile_signature(fn, constexprs, dtype, partials)
    compiled = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": fitted.num_warps, "num_stages": fitted.num_stages})
    ops = loop_opcodes(cuobjdump(compiled.asm["cubin"], "-sass"))
    weights = fitted.block_n * fitted.block_k / (32 * fitted.num_warps)
    res = cubin_resources(compiled.asm["cubin"])
    return {"config": fitted.id, "group": group, "dtype": dtype, "symmetric": symmetric,
            "registers": res["regs"], "stack": res["stack"], "weights_per_thread": weights,
            "loop_instructions": sum(ops.values()), "per_weight": sum(ops.values()) / weights,
            "opcodes_per_weight": {op: n / weights for op, n in ops.most_common()}}
