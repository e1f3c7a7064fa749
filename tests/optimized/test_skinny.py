"""The skinny kernel without a GPU.

* Compilers: the extension's units compile for sm_90 (nvcc) and link with nothing undefined, no
  register-kernel spills, the segmented loop stays within its instruction budget, every kernel
  waits for its predecessor before it touches x or y; the same source compiles for AMD wave32 and
  wave64 (hipcc).
* The plan (csrc/skinny_plan.h plan_call, through the emulator's plan-only build): the default
  kernel, split, grid, ring depth, shared memory and workspace on decode shapes, every fallback,
  every refusal, and thresholds that come from the policy.
* The kernels on the CPU emulation (csrc/skinny_emu.h): every kernel and the default plan judged by
  the oracle at the boundaries each one has, exact probes, and the bit-identity the plan promises.
* The Python side on CPU: the ops' schemas and fake implementation, the wrapper's contract checks.

A missing compiler skips its cell, unless W4A16_REQUIRE_COMPILERS=1 (CI) makes it a failure. Every
compiled program is built once per run and shared by the xdist workers (tests/support/compilers.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from optimized import skinny
from optimized.contract import ContractError
from tests.support import skinny_sass
from tests.support.sass import HGMMA_RS, loop_instructions, wgmma_register_hazards
from tests.support.skinny_emulator import (
    EMULATED_DEVICE,
    EmulatedPlanError,
    default_policy,
    emulate_call,
    emulated_plan,
    emulated_plans,
)

CSRC = skinny.CSRC
POLICY = dict(zip(("ring_max_m", "stream_min_k", "stream_min_weight_bytes_ring", "stream_min_weight_bytes_batch",
                   "persistent_min_iters", "persistent_max_load_pct", "shared_x_max_bytes", "stream_one_block_cost"),
                  default_policy()))
# A K whose x at 4 padded rows is over the policy's shared-memory limit (M 3..4 read x from global memory).
X_OVER_SHARED_K = int(POLICY["shared_x_max_bytes"]) // 8 + 128


def policy_with(**changes) -> list[float]:
    """The H200 policy with some fields changed, as the ops take it."""
    return [float(changes.get(name, value)) for name, value in POLICY.items()]


# ---------------------------------------------------------------------------------------------
# Compilers


@pytest.fixture(scope="module")
def sm90() -> Path:
    return skinny_sass.build_sm90()


def test_nvcc_sm90_units_link_and_register_kernels_do_not_spill(sm90):
    """The launch and family units link into one library with nothing undefined (built with
    --no-undefined), every kernel family is compiled, and no ring, segmented or wgmma kernel has a
    stack frame or spills."""
    assert (sm90 / skinny_sass.LIBRARY).exists()
    report = {}
    for unit in skinny_sass.UNITS:
        report.update(skinny_sass.ptxas_report((sm90 / f"{unit.stem}.log").read_text()))
    for name in ("batch_kernel", "ring_kernel", "segment_kernel", "stream_kernel", "tile_kernel", "wgmma_kernel",
                 "reduce_partials_kernel"):
        assert any(f"{len(name)}{name}I" in mangled for mangled in report), f"no {name} was compiled"
    register = {name: r for name, r in report.items()
                if "11ring_kernel" in name or "14segment_kernel" in name or "12wgmma_kernel" in name}
    spilling = {name: r for name, r in register.items() if r[1:] != (0, 0, 0)}
    assert not spilling, f"register kernels with a stack frame or spills (regs, stack, st, ld): {spilling}"


def test_segment_loop_instruction_budget(sm90):
    """The M = 1 segmented kernels' main loops (bf16, zero points, G = 128): weights reach the tensor
    cores as exact q - z with no per-weight scale multiply (a group's sums are scaled once), one mma
    per 8 weights of a lane, no local memory; x staged in shared memory, at most 2.8 instructions per
    weight. The persistent kernel's loop is the shared-x one's plus, in each of its 3 unrolled
    iterations, the end of a row group (its outputs' sums and stores, or a cut group's partial sums
    kept for the block, and the next group's offsets), which runs once a group: at most 250
    instructions each."""
    kernels = {"segment_smem": next(k for k in skinny_sass.kernels() if k.label == "segment_smem, M = 1"),
               "segment_persistent": next(k for k in skinny_sass.kernels() if k.label.startswith("segment_persistent"))}
    costs = {}
    for label, kernel in kernels.items():
        costs[label] = cost = skinny_sass.loop_cost(kernel, sm90 / "skinny_segment.o", "bf16", 128, False)
        ops = cost["opcodes_per_weight"]
        assert ops.get("HMMA.16816.F32.BF16") == pytest.approx(1 / 8), ops
        assert not [op for op in ops if op.startswith("HMUL2")], ops
        assert not [op for op in ops if op.startswith(("LDL", "STL"))], ops
    assert costs["segment_smem"]["per_weight"] <= 2.8, costs["segment_smem"]
    extra = costs["segment_persistent"]["loop_instructions"] - costs["segment_smem"]["loop_instructions"]
    assert 0 < extra <= 3 * 250, (extra, costs)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_wgmma_loop_issues_warpgroup_mma_within_budget(sm90, dtype):
    """The sm_90a build gives the wgmma kernel its body (an sm_90 build compiles it empty, and the
    plan would still run it): each M tile's main loop (zero points, G = 128) holds two pieces, each
    8 HGMMA (one per 16 k) with A from registers, and spends at most 4.8 instructions a dequantized
    weight a thread (bf16 4.6 as built: a shift, byte permute, LOP3, subtract and scale a pair, plus
    the stage's mbarrier wait, the weight loads and the scale loads; the copies are the copy
    warpgroup's)."""
    obj = sm90 / "skinny_wgmma.o"
    for kernel in (k for k in skinny_sass.kernels() if k.name == "wgmma_kernel"):
        sass = skinny_sass.function_sass(obj, kernel.mangled(dtype, 128, False))
        hgmma = [text for text in loop_instructions(sass) if text.startswith("HGMMA")]
        cost = skinny_sass.loop_cost(kernel, obj, dtype, 128, False)
        assert len(hgmma) == 16 and all(HGMMA_RS.match(text) for text in hgmma), (kernel.label, hgmma)
        assert cost["per_weight"] <= 4.8, (kernel.label, cost)


@pytest.mark.parametrize("unit", ["skinny_tile", "skinny_wgmma"])
def test_block_tiles_store_outputs_sixteen_bytes_at_a_time(sm90, unit):
    """The tile and wgmma kernels' blocks store y as 8 outputs a thread in one 16-byte store (and
    partial sums in two), the element-by-element stores being the tail of a row that is no multiple
    of 8: one 2-byte store per output, with its index arithmetic, took a quarter of the wgmma
    kernel's issue slots at M = 1024 on an H100."""
    ops = skinny_sass.kernel_memory_ops(sm90 / f"{unit}.o")
    kernels = {name: stores for name, stores in ops.items() if "_kernelI" in name and "reduce" not in name}
    assert kernels, f"no tile or wgmma kernel in {unit}"
    for name, memory in kernels.items():
        stores = [op for op in memory if op.startswith("STG")]
        assert stores.count("STG.E.128") >= 3, (name, stores)


@pytest.mark.parametrize("case", ["bf16-G32-sym", "bf16-G128-asym", "fp16-G64-asym", "fp16-G128-sym"])
def test_wgmma_registers_stay_untouched_while_the_tensor_cores_read_them(sm90, case):
    """No instruction of either M tile's main loop writes an A register of an HGMMA that may still
    be running (not yet retired by a WARPGROUP.DEPBAR), across the loop's back edge too: ptxas
    does not flag a register set reused one piece too early, and the wrong sums it gives depend
    on timing, so the emulator cannot see them."""
    dtype, group, sym = case.split("-")
    obj = sm90 / "skinny_wgmma.o"
    for kernel in (k for k in skinny_sass.kernels() if k.name == "wgmma_kernel"):
        sass = skinny_sass.function_sass(obj, kernel.mangled(dtype, int(group[1:]), sym == "sym"))
        assert sum(text.startswith("HGMMA") for text in loop_instructions(sass)) == 16, kernel.label
        assert not wgmma_register_hazards(sass), (kernel.label, wgmma_register_hazards(sass)[:4])


@pytest.mark.parametrize("unit", [u.stem for u in skinny_sass.UNITS if u.stem != "skinny_launch"])
def test_every_kernel_waits_for_its_predecessor_before_x_and_y(sm90, unit):
    """Programmatic dependent launch (optimized.skinny.OVERLAPS "weights"): in the sm_90 SASS of
    every kernel of the unit the launch trigger (PREEXIT) comes before the wait for the previous
    kernel (ACQBULK), and the wait before every coherent global load (x and bias, which the previous
    kernel may have written) and every global store (y, which it may still read). Read-only loads
    (.CONSTANT: weights, scales, zero points) may come before it; ptxas moves those across the wait,
    so x must never take that path: the only 16-byte read-only loads are the weights' (L1
    no-allocate, .NA), and a 16-byte x load through __ldg fails this. Asynchronous copies to shared
    memory (LDGSTS, with their LDGDEPBAR) may precede the wait where they carry weights: all of the
    stream kernel's, and the tile kernel's first stages of weights (at most 14 copies a thread: 3
    stages of 4), with their x copies after the wait. The wgmma kernel's copy lane loads boxes by TMA
    (UTMALDG): only its first stages' weights (one load in a loop) before its own wait, the last."""
    kernels = {name: ops for name, ops in skinny_sass.kernel_memory_ops(sm90 / f"{unit}.o").items()
               if "_kernel" in name}
    expected = {"skinny_batch": 84, "skinny_ring": 36, "skinny_segment": 108, "skinny_stream": 50,
                "skinny_tile": 50, "skinny_wgmma": 38}[unit]
    assert len(kernels) == expected, f"{len(kernels)} kernels in {unit}, expected {expected}: {sorted(kernels)[:4]}"
    bad = {}
    for name, ops in kernels.items():
        trigger = [i for i, op in enumerate(ops) if op == "PREEXIT"]
        wait = [i for i, op in enumerate(ops) if op == "ACQBULK"]
        ordered = [i for i, op in enumerate(ops)
                   if op.startswith("STG") or (op.startswith("LDG") and ".CONSTANT" not in op
                                               and not op.startswith(("LDGSTS", "LDGDEPBAR")))]
        x_read_only = [op for op in ops if op.startswith("LDG") and ".128" in op and ".CONSTANT" in op
                       and ".NA" not in op]
        early_copies = sum(op.startswith("LDGSTS") for op in ops[:wait[0] if wait else len(ops)])
        tma = [i for i, op in enumerate(ops) if op.startswith("UTMALDG")]
        early_tma = sum(i < wait[-1] for i in tma) if wait else len(tma)
        if x_read_only or not (trigger and wait and ordered and trigger[0] < wait[0] < ordered[0]) or \
                ("tile_kernel" in name and early_copies > 14) or \
                ("wgmma_kernel" in name and (early_copies or len(tma) < 3 or early_tma != 1)):
            bad[name] = {"PREEXIT": trigger[:1], "ACQBULK": wait[:2], "first x load or y store": ordered[:1],
                         "read-only 16-byte loads": x_read_only[:2], "copies before the wait": early_copies,
                         "TMA loads": len(tma), "TMA loads before the last wait": early_tma}
    assert not bad, f"kernels that may touch x or y before waiting for the previous kernel: {bad}"


@pytest.fixture(scope="module")
def hip() -> Path:
    return skinny_sass.build_hip()


def test_hipcc_compiles_for_wave32_and_wave64(hip):
    """The launch and every family's unit in one HIP unit compile for gfx1030 (wave32 RDNA) and
    gfx90a (wave64 CDNA), each target seeing its own warp size in compat.h (skinny_sass.HIP_UNIT
    asserts it), or rows and lanes would not match."""
    assert (hip / "skinny.o").stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# The plan, from plan_call itself (the emulator's plan-only build)

# Decode shapes (K, N) on 132 SMs, bf16 with zero points, G 128: the kernel of each M = 1..16.
DEFAULT_KERNELS = {
    # x of M 3..4 is 114688 bytes, over shared_x_max_bytes; long K: stream from M = 5.
    (14336, 4096): ["segment"] * 4 + ["stream"] * 12,
    # x in shared memory at split 1 (M = 1) only; the ring to ring_max_m, then the batch kernel.
    (3584, 4608): ["segment_smem"] + ["segment"] * 3 + ["ring"] * 4 + ["batch"] * 8,
    # The persistent grid where the shared-x one would run several waves; 224 MiB of weights: stream.
    (8192, 57344): ["segment_persistent"] * 4 + ["stream"] * 12,
}


def test_default_plan_on_decode_shapes():
    """The default plan per M on three decode shapes: the kernels above; the segmented kernels'
    split the smallest whose grid has a block for each of the 132 SMs (or 8); the persistent grid 2
    blocks an SM at split 1; the stream kernel a split whose shared memory fits, a workspace exactly
    when it splits K, and a ring with which two blocks share an SM (4 slots, but 2 at M 5..8 and
    10..16 of N 57344, where 4 slots and x would leave one block an SM); and M sharing a summation
    order exactly within 1, 2, 3..4, 5..8 and 9..16."""
    for (k, n), kernels in DEFAULT_KERNELS.items():
        plans = emulated_plans([dict(m=m, n=n, k=k, group_size=128, symmetric=False) for m in range(1, 17)])
        assert [p.kernel for p in plans] == kernels, (k, n)
        for m, p in enumerate(plans, 1):
            where = (k, n, m, p)
            assert p.engine == "mma" and p.shared_bytes <= EMULATED_DEVICE[2], where
            if p.kernel in ("segment", "segment_smem"):
                def grid(split: int) -> int:
                    return -(-n // (32 * (1 if m == 1 else 2 if m == 2 else 4) // split))
                assert p.blocks == grid(p.split) and (p.blocks >= 132 or p.split == 8), where
                assert p.split == 1 or grid(p.split // 2) < 132, where
                assert p.shared_bytes == (2 * k * (1 if m == 1 else 2 if m == 2 else 4) if p.kernel == "segment_smem"
                                          else 0), where
            if p.kernel == "segment_persistent":
                assert (p.split, p.blocks) == (1, 2 * 132), where
            if p.kernel == "stream":
                assert p.workspace_floats == (p.split * m * n if p.split > 1 else 0), where
                assert p.stages == (2 if n == 57344 and m != 9 else 4), where
                assert EMULATED_DEVICE[3] // (p.shared_bytes + 1024) >= 2, where
            else:
                assert (p.stages, p.workspace_floats) == (0, 0), where
        groups = [[m for m, p in enumerate(plans, 1) if p.summation == s] for s in dict.fromkeys(p.summation
                                                                                               for p in plans)]
        assert groups == [[1], [2], [3, 4], [5, 6, 7, 8], list(range(9, 17))], (k, n, groups)


def test_stream_grid_of_one_block_an_sm_keeps_the_deep_ring():
    """At K 4096 x N 28672, M = 16 the stream kernel's grid (split 1) has no more blocks than SMs:
    its ring keeps 4 slots, one block an SM."""
    p = emulated_plan(16, 28672, 4096, 128, False)
    assert (p.kernel, p.split, p.stages) == ("stream", 1, 4) and p.blocks <= 132, p


@pytest.mark.parametrize("kernel,m,k,n,split", [
    pytest.param("batch", 9, 2048, 264, 0, id="batch"),
    pytest.param("ring", 5, 2048, 264, 0, id="ring"),
    pytest.param("segment", 1, 2048, 264, 2, id="segment"),
    pytest.param("segment_smem", 1, 2048, 264, 1, id="segment_smem"),
    pytest.param("segment_persistent", 1, 8192, 57344, 0, id="segment_persistent"),
    pytest.param("stream", 9, 2048, 264, 0, id="stream"),
    pytest.param("tile", 9, 2048, 264, 0, id="tile"),
    pytest.param("tile", 17, 2048, 264, 2, id="tile-M17"),
])
def test_kernel_names_are_the_plan_enum(kernel, m, k, n, split):
    """skinny.KERNELS follows csrc/skinny_plan.h Kernel: a kernel asked for by name where it can run
    comes back under the same name (the plan returns its index)."""
    assert skinny.KERNELS.index(kernel) >= 0
    assert emulated_plan(m, n, k, 128, False, kernel=kernel, split=split).kernel == kernel


def test_a_forced_split_steers_only_the_kernel_it_was_asked_for():
    """A split forced on a kernel that cannot run the call (segment at M = 17, where the wgmma kernel
    runs) leaves the kernel that runs its own plan's split; forced on the tile kernel, it is taken."""
    own = emulated_plan(17, 264, 2048, 128, False)
    settled = emulated_plan(17, 264, 2048, 128, False, kernel="segment", split=2)
    forced = emulated_plan(17, 264, 2048, 128, False, kernel="tile", split=2)
    assert own.split != 2 and (settled.kernel, settled.split) == ("wgmma", own.split), (own, settled)
    assert (forced.kernel, forced.split) == ("tile", 2), forced


# (id, request, what runs): a kernel asked for where it cannot run, and the device's engine.
SETTLED = [
    ("segment-above-M4-ring", dict(m=5, kernel="segment"), "ring"),
    ("segment-simt-M1-ring", dict(m=1, kernel="segment", engine="simt"), "ring"),
    ("segment-simt-M3-batch", dict(m=3, kernel="segment", engine="simt"), "batch"),
    ("persistent-x-over-shared-segment", dict(m=3, k=X_OVER_SHARED_K, n=8, kernel="segment_persistent"), "segment"),
    ("persistent-no-grid-smem", dict(m=1, n=264, k=2048, kernel="segment_persistent", num_sms=4), "segment_smem"),
    ("persistent-no-grid-split-segment", dict(m=1, kernel="segment_persistent"), "segment"),
    ("smem-at-split-2-segment", dict(m=1, kernel="segment_smem", split=2), "segment"),
    ("stream-simt-M1-ring", dict(m=1, kernel="stream", engine="simt"), "ring"),
    ("stream-simt-M6-batch", dict(m=6, kernel="stream", engine="simt"), "batch"),
    ("stream-K-tail-M6-batch", dict(m=6, k=2016, group_size=32, kernel="stream"), "batch"),
    ("stream-K-tail-M12-batch", dict(m=12, k=2016, group_size=32, kernel="stream"), "batch"),
    ("ring-K-tail-batch", dict(m=5, k=4032, group_size=64, kernel="ring"), "batch"),
    ("ring-N4-batch", dict(m=5, n=4, symmetric=True, kernel="ring"), "batch"),
    ("ring-simt-M2-batch", dict(m=2, kernel="ring", engine="simt"), "batch"),
    ("tile-simt-M9-batch", dict(m=9, kernel="tile", engine="simt"), "batch"),
    ("tile-K-tail-M12-batch", dict(m=12, k=2016, group_size=32, kernel="tile"), "batch"),
    ("ring-above-M16-gate-up-tile", dict(m=17, n=28672, k=4096, kernel="ring"), "tile"),
    ("batch-above-M16-wgmma", dict(m=130, kernel="batch"), "wgmma"),
    ("auto-M130-wgmma", dict(m=130), "wgmma"),
    ("auto-M32-one-wave-wgmma", dict(m=32), "wgmma"),
    ("auto-M32-down-wgmma", dict(m=32, n=4096, k=14336), "wgmma"),
    ("auto-M32-gate-up-two-waves-tile", dict(m=32, n=28672, k=4096), "tile"),
    ("auto-M32-sm80-tile", dict(m=32, device=(108, 32, 163 * 1024, 164 * 1024, 80)), "tile"),
    ("auto-M33-wgmma", dict(m=33), "wgmma"),
    ("tile-M64-tile", dict(m=64, kernel="tile"), "tile"),
    ("wgmma-M16-batch", dict(m=16, kernel="wgmma"), "batch"),
    ("wgmma-sm80-M64-tile", dict(m=64, kernel="wgmma", device=(108, 32, 163 * 1024, 164 * 1024, 80)), "tile"),
    ("auto-sm75-M1-simt-ring", dict(m=1, device=(68, 32, 64 * 1024, 64 * 1024, 75)), "ring"),
    ("auto-rocm-wave64-M4-batch", dict(m=4, device=(104, 64, 64 * 1024, 64 * 1024, 0)), "batch"),
    ("ring-offsets-over-int32-batch", dict(m=5, n=1 << 20, k=1 << 16, kernel="ring"), "batch"),
    ("auto-offsets-over-int32-M1-batch", dict(m=1, n=1 << 20, k=1 << 16), "batch"),
    ("auto-offsets-over-int32-M5-stream", dict(m=5, n=1 << 20, k=1 << 16), "stream"),
]


@pytest.mark.parametrize("request_,ran", [pytest.param(r, ran, id=name) for name, r, ran in SETTLED])
def test_plan_settles_a_kernel_that_cannot_run(request_, ran):
    """The segmented kernels are mma kernels of M <= 4; the persistent one needs x in shared memory
    and a grid, the shared-x one split 1; the stream kernel is an mma kernel of whole 128-k pieces;
    the ring needs whole iterations, N >= 8 and (on the simt engine) M = 1; the ring and segmented
    kernels keep weight offsets in 32 bits. The tile kernel is an mma kernel of whole 128-k pieces
    (where it cannot run at M <= 16 the stream kernel's fallbacks apply), and the only kernel above
    M = 16, whatever kernel was asked for. The batch kernel runs everything else, and a device
    without mma.sync (sm_75, ROCm) runs the simt engine."""
    call = dict(m=1, n=264, k=2048, group_size=128, symmetric=False)
    call.update(request_)
    p = emulated_plan(**call)
    assert p.kernel == ran, p
    device = call.get("device", EMULATED_DEVICE)
    assert p.engine == ("mma" if device[4] >= 80 and call.get("engine") != "simt" else "simt"), p


def test_forced_split_steers_only_the_kernel_asked_for():
    """A forced split runs with the kernel it was asked for; where another kernel runs, that one
    takes its own planned split; a fallback to the batch kernel keeps the split already planned (so
    that rows keep their bits from the simt ring at M = 1 to the batch kernel at M 2..8)."""
    assert emulated_plan(1, 264, 2048, 128, False, kernel="segment", split=4).split == 4
    ring = emulated_plan(5, 264, 2048, 128, False).split
    asked = emulated_plan(5, 264, 2048, 128, False, kernel="segment", split=4 if ring != 4 else 2)
    assert (asked.kernel, asked.split) == ("ring", ring)
    simt = [emulated_plan(m, 264, 2048, 128, False, engine="simt") for m in range(1, 9)]
    assert [p.kernel for p in simt] == ["ring"] + ["batch"] * 7
    assert len({p.summation for p in simt}) == 1, simt


@pytest.mark.parametrize("changes,m,k,n,default,changed", [
    pytest.param(dict(ring_max_m=16), 12, 3584, 4608, "batch", "ring", id="ring_max_m-16"),
    pytest.param(dict(ring_max_m=4), 5, 3584, 4608, "ring", "batch", id="ring_max_m-4"),
    pytest.param(dict(stream_min_k=1 << 30, stream_min_weight_bytes_ring=1 << 50), 5, 14336, 4096, "stream",
                 "ring", id="stream-off"),
    pytest.param(dict(stream_min_weight_bytes_batch=0), 9, 3584, 4608, "batch", "stream",
                 id="stream_min_weight_bytes_batch-0"),
    pytest.param(dict(shared_x_max_bytes=0), 1, 8192, 57344, "segment_persistent", "segment",
                 id="shared_x_max_bytes-0"),
    pytest.param(dict(persistent_min_iters=1 << 20), 1, 8192, 57344, "segment_persistent", "segment_smem",
                 id="persistent_min_iters-large"),
    pytest.param(dict(persistent_max_load_pct=0), 1, 8192, 6144, "segment_persistent", "segment_smem",
                 id="persistent_max_load_pct-0"),
])
def test_plan_follows_the_policy(changes, m, k, n, default, changed):
    """Each measured threshold comes from the policy values the op is given: changing one moves the
    kernel where it decides."""
    assert emulated_plan(m, n, k, 128, False).kernel == default
    assert emulated_plan(m, n, k, 128, False, policy=policy_with(**changes)).kernel == changed


def test_stream_split_follows_the_one_block_cost():
    """stream_one_block_cost prices a grid of more blocks than SMs whose blocks fit one an SM: at
    K 5120 x N 28672, M = 5 the default cost splits K 4 ways with a 4-slot ring, a cost of 1 takes
    split 1, one block an SM with the 2-slot ring."""
    p = emulated_plan(5, 28672, 5120, 128, False)
    cheap = emulated_plan(5, 28672, 5120, 128, False, policy=policy_with(stream_one_block_cost=1.0))
    assert (p.kernel, p.split, p.stages) == ("stream", 4, 4)
    assert (cheap.kernel, cheap.split, cheap.stages) == ("stream", 1, 2)


REFUSED = [
    ("M0", dict(m=0), "M must be at least 1, got M=0"),
    # Above M = 16 only the tile kernel runs: an mma kernel of whole 128-k pieces.
    ("M17-simt", dict(m=17, engine="simt"), r"M > 16 runs on the tile kernel only, which needs the mma engine "
     r"\(CUDA, compute capability 8.0\+\) and K a multiple of 128, got M=17, K=2048, engine simt"),
    ("M17-on-sm75", dict(m=17, device=(68, 32, 65536, 65536, 75)), r"needs the mma engine .* got M=17, K=2048, "
     "engine simt"),
    ("M17-on-rocm", dict(m=17, device=(104, 64, 65536, 65536, 0)), "M > 16 runs on the tile kernel only"),
    ("M17-K-tail", dict(m=17, k=2112, group_size=64), r"K a multiple of 128, got M=17, K=2112$"),
    ("group-96", dict(group_size=96, k=192), "group_size must be 32, 64 or 128, got 96"),
    ("K-not-multiple-of-group", dict(k=192), "K must be a multiple of group_size"),
    ("asym-N12", dict(n=12), "N must be a multiple of 8 with zero points"),
    ("engine-bogus", dict(engine="bogus"), "engine must be 'auto', 'mma' or 'simt', got 'bogus'"),
    ("engine-mma-on-sm75", dict(engine="mma", device=(68, 32, 65536, 65536, 75)),
     r"engine 'mma' needs compute capability 8.0\+"),
    ("kernel-bogus", dict(kernel="persistent"), "kernel must be 'auto' or one of batch, ring, segment"),
    ("split-negative", dict(kernel="stream", split=-1), r"split must be 0 \(the plan's\) or positive, got -1"),
    ("split-with-auto", dict(split=2), "split must be 0 .* unless kernel names one other than segment_persistent"),
    ("split-with-persistent", dict(kernel="segment_persistent", split=1), "unless kernel names one other than"),
    ("split-ring-3", dict(kernel="ring", split=3), "a forced split of kernel ring must be a power of two up to the 8"),
    ("split-segment-16", dict(kernel="segment", split=16), "power of two up to the 8 warps of a block, got 16"),
    ("split-batch-8-on-wave64", dict(kernel="batch", split=8, device=(104, 64, 65536, 65536, 0)),
     "up to the 4 warps of a block, got 8"),
    ("split-stream-beyond-pieces", dict(kernel="stream", k=256, split=3),
     r"the stream kernel's split must be in \[1, K/128\] = \[1, 2\], got 3"),
    ("split-tile-beyond-pieces", dict(kernel="tile", m=17, k=256, split=3),
     r"the tile kernel's split must be in \[1, K/128\] = \[1, 2\], got 3"),
    ("split-stream-too-small-for-shared", dict(kernel="stream", m=16, k=14336, n=4096, split=1),
     "bytes of shared memory a block, the device allows"),
    ("policy-ring_max_m-20", dict(policy=policy_with(ring_max_m=20)),
     r"policy field ring_max_m must be an integer in \[4, 16\], got 20"),
    ("policy-load-pct-fraction", dict(policy=policy_with(persistent_max_load_pct=80.5)),
     "persistent_max_load_pct must be an integer"),
    ("policy-one-block-cost-below-1", dict(policy=policy_with(stream_one_block_cost=0.5)),
     r"stream_one_block_cost must be a number in \[1, 100\]"),
    ("policy-seven-values", dict(policy=default_policy()[:7]), "a request line holds"),
    ("device-warp-48", dict(device=(132, 48, 65536, 65536, 90)), "a warp size of 32 or 64"),
    ("device-no-sms", dict(device=(0, 32, 65536, 65536, 90)), "at least one SM"),
]


@pytest.mark.parametrize("request_,message", [pytest.param(r, msg, id=name) for name, r, msg in REFUSED])
def test_plan_refuses(request_, message):
    """What the plan refuses, with a message naming what was expected and what was given; the ops
    raise it (skinny_binding.cpp), and the policy and device lists are range-checked first."""
    call = dict(m=1, n=264, k=2048, group_size=128, symmetric=False)
    call.update(request_)
    with pytest.raises(EmulatedPlanError, match=message):
        emulated_plan(**call)


# ---------------------------------------------------------------------------------------------
# The kernels on the CPU emulation: each kernel's index arithmetic, ring and reductions, judged by
# the oracle like the GPU parity runs.

# (kernel or "auto", engine, n, k, g, dtype, symmetric, m, emulate_call options, the kernel that runs).
EMULATED = [
    # batch: 8 warps on each row, the simt engine's M tiles (4, 8), a K tail (the last chunk reads
    # zeros), rows past n with a padded x row stride.
    ("batch", "mma", 264, 8192, 128, torch.bfloat16, True, 16, dict(split=8), "batch"),
    ("batch", "simt", 264, 8192, 128, torch.bfloat16, False, 3, dict(split=2), "batch"),
    ("batch", "mma", 264, 4032, 64, torch.bfloat16, False, 16, {}, "batch"),
    ("batch", "simt", 200, 2016, 32, torch.float16, False, 7, dict(row_pad=24), "batch"),
    # ring: the register ring wrapping (16 iterations a warp at split 4), M tiles 8 and 16, G 32
    # and 64, N = 8 (rows past n), a padded x row stride, a misaligned scale view, simt at M = 1.
    ("ring", "mma", 264, 8192, 128, torch.float16, False, 1, dict(split=4), "ring"),
    ("ring", "mma", 264, 8192, 128, torch.float16, False, 9, dict(split=1), "ring"),
    ("ring", "mma", 264, 2048, 64, torch.bfloat16, False, 16, dict(num_sms=4), "ring"),
    ("ring", "mma", 264, 2048, 32, torch.float16, False, 5, dict(num_sms=4), "ring"),
    ("ring", "mma", 8, 4096, 128, torch.float16, False, 9, {}, "ring"),
    ("ring", "mma", 200, 2048, 128, torch.bfloat16, True, 2, dict(num_sms=1, row_pad=24), "ring"),
    ("ring", "mma", 264, 2048, 128, torch.float16, False, 3, dict(scale_offset=1), "ring"),
    ("ring", "simt", 264, 2048, 128, torch.float16, True, 1, {}, "ring"),
    # segment, at every M_PAD (1, 2, 4): rows past n, a K tail (its chunks read zeros), warps
    # without an iteration (split 4 of 2 iterations), the ring wrapping, G = 32 and 64.
    ("segment", "mma", 8, 4096, 128, torch.bfloat16, False, 4, {}, "segment"),
    ("segment", "mma", 200, 2048, 128, torch.float16, True, 3, dict(num_sms=1, row_pad=24), "segment"),
    ("segment", "mma", 264, 2016, 32, torch.float16, False, 2, dict(num_sms=4), "segment"),
    ("segment", "mma", 264, 2048, 64, torch.bfloat16, False, 4, dict(num_sms=4, scale_offset=1), "segment"),
    ("segment", "mma", 64, 2048, 128, torch.bfloat16, True, 1, dict(split=4), "segment"),
    ("segment", "mma", 24, 1056, 32, torch.float16, False, 1, {}, "segment"),
    ("segment", "mma", 264, 8192, 128, torch.float16, False, 1, dict(split=4), "segment"),
    # segment_smem: the same boundaries through the copy of x to shared memory, and a K whose x at
    # M_PAD = 4 is over shared_x_max_bytes (x from global memory).
    ("segment_smem", "mma", 264, 8192, 128, torch.bfloat16, False, 1, dict(split=1), "segment_smem"),
    ("segment_smem", "mma", 8, 4096, 128, torch.bfloat16, False, 4, dict(split=1), "segment_smem"),
    ("segment_smem", "mma", 200, 2048, 128, torch.float16, True, 3, dict(split=1, row_pad=24), "segment_smem"),
    ("segment_smem", "mma", 264, 2016, 32, torch.float16, False, 2, dict(split=1), "segment_smem"),
    ("segment_smem", "mma", 264, 2048, 64, torch.bfloat16, False, 4, dict(split=1, scale_offset=1), "segment_smem"),
    ("segment_smem", "mma", 24, 1056, 32, torch.float16, False, 1, dict(split=1), "segment_smem"),
    ("segment_smem", "mma", 8, X_OVER_SHARED_K, 128, torch.float16, False, 3, dict(split=1), "segment"),
    # segment_persistent at every M_PAD (one SM: 2 blocks, whose warps' shares of the iterations
    # cut row groups, so that the block adds the cut ones' partial sums and each warp's ring runs on
    # from one row group into the next): rows past n (N 200, 504, 36), the zero-point nibble
    # changing between row groups at M_PAD = 1, a K tail, G = 32 and 64, and on 4 SMs row groups
    # cut over 4 warps (K 32768, N 36).
    ("segment_persistent", "mma", 264, 2048, 128, torch.bfloat16, False, 1, dict(num_sms=1), "segment_persistent"),
    ("segment_persistent", "mma", 200, 2048, 128, torch.float16, True, 2, dict(num_sms=1, row_pad=24),
     "segment_persistent"),
    ("segment_persistent", "mma", 208, 2016, 32, torch.float16, False, 2, dict(num_sms=1), "segment_persistent"),
    ("segment_persistent", "mma", 504, 2048, 128, torch.bfloat16, False, 3, dict(num_sms=1), "segment_persistent"),
    ("segment_persistent", "mma", 416, 2048, 64, torch.bfloat16, False, 4, dict(num_sms=1, scale_offset=1),
     "segment_persistent"),
    ("segment_persistent", "mma", 36, 32768, 128, torch.float16, True, 1, dict(num_sms=4), "segment_persistent"),
    # stream: every warp layout (M 1..2, 3..4, 5..8, 9..16), rows past n (N = 8, 200), K split
    # across blocks unevenly (the reduce kernel adds the partial sums), warps without a piece
    # (split 5 of 8 pieces at 8 warps along K), G = 32 and 64, a padded x row stride and a
    # misaligned scale view; its own split plan at 132 and 4 SMs.
    ("stream", "mma", 264, 8192, 128, torch.float16, False, 1, dict(split=1), "stream"),
    ("stream", "mma", 200, 2048, 128, torch.bfloat16, True, 3, dict(split=2, row_pad=24), "stream"),
    ("stream", "mma", 264, 2048, 64, torch.bfloat16, False, 16, dict(split=3, scale_offset=1), "stream"),
    ("stream", "mma", 264, 2048, 32, torch.float16, False, 9, dict(num_sms=4), "stream"),
    ("stream", "mma", 8, 1024, 128, torch.bfloat16, False, 5, dict(split=5), "stream"),
    ("stream", "mma", 64, 2048, 32, torch.float16, True, 2, {}, "stream"),
    # tile: every M tile (16 with its G = 128 sums scaled after the mma, 32, 64, and 128 with two
    # warps along M and several M tiles), rows past n and m, K split across blocks unevenly, G = 32
    # and 64, a padded x row stride and a misaligned scale view; its own split plan on 4 SMs; an N
    # that is no multiple of 8 (outputs stored one by one).
    ("tile", "mma", 264, 1024, 128, torch.bfloat16, False, 16, dict(split=1), "tile"),
    ("tile", "mma", 264, 1024, 32, torch.float16, False, 20, dict(split=3, row_pad=24), "tile"),
    ("tile", "mma", 200, 512, 64, torch.bfloat16, True, 64, dict(split=2, scale_offset=1), "tile"),
    ("tile", "mma", 136, 512, 128, torch.float16, True, 130, dict(split=1), "tile"),
    ("tile", "mma", 64, 2048, 64, torch.bfloat16, False, 40, dict(num_sms=4), "tile"),
    ("tile", "mma", 36, 1024, 128, torch.bfloat16, True, 20, dict(split=2), "tile"),
    # wgmma: every M tile (32, 64, 128 and several M tiles), rows past n (a block is 128) and m, K
    # split across blocks unevenly, G = 32 and 64, a padded x row stride and a misaligned scale view;
    # its own split plan on 4 SMs; an N that is no multiple of 8, with and without a split.
    ("wgmma", "mma", 264, 1024, 128, torch.bfloat16, False, 17, dict(split=1), "wgmma"),
    ("wgmma", "mma", 200, 1024, 32, torch.float16, False, 40, dict(split=3, row_pad=24), "wgmma"),
    ("wgmma", "mma", 136, 512, 64, torch.bfloat16, True, 64, dict(split=2, scale_offset=1), "wgmma"),
    ("wgmma", "mma", 128, 512, 128, torch.float16, True, 130, dict(split=1), "wgmma"),
    ("wgmma", "mma", 64, 2048, 64, torch.bfloat16, False, 100, dict(num_sms=4), "wgmma"),
    ("wgmma", "mma", 36, 512, 128, torch.float16, True, 40, {}, "wgmma"),
    ("wgmma", "mma", 36, 1024, 64, torch.bfloat16, True, 70, dict(split=3), "wgmma"),
    # The default plan each side of M = 4 and ring_max_m, with and without zero points, where it
    # runs each kernel (the persistent grid on one SM, x in shared memory on 4 SMs, the stream
    # kernel from stream_min_k, at M = 17 the wgmma kernel where its grid fits the tile kernel's
    # waves and the tile kernel where it does not) and the simt engine.
    ("auto", "mma", 264, 2048, 128, torch.bfloat16, False, 1, dict(num_sms=1), "segment_persistent"),
    ("auto", "mma", 264, 2048, 128, torch.bfloat16, False, 1, dict(num_sms=4), "segment_smem"),
    ("auto", "mma", 264, 2048, 128, torch.float16, False, 4, {}, "segment"),
    ("auto", "mma", 264, 2048, 128, torch.float16, True, 4, {}, "segment"),
    ("auto", "mma", 264, 2048, 128, torch.bfloat16, False, 5, {}, "ring"),
    ("auto", "mma", 264, 2048, 128, torch.float16, False, 8, {}, "ring"),
    ("auto", "mma", 264, 2048, 128, torch.bfloat16, False, 9, {}, "batch"),
    ("auto", "mma", 264, 4096, 64, torch.float16, True, 16, {}, "batch"),
    ("auto", "mma", 264, 2016, 32, torch.bfloat16, False, 9, {}, "batch"),
    ("auto", "mma", 64, 6144, 128, torch.bfloat16, False, 12, {}, "stream"),
    ("auto", "mma", 64, 1024, 128, torch.bfloat16, False, 17, {}, "wgmma"),
    ("auto", "mma", 512, 512, 128, torch.float16, False, 17, dict(num_sms=2), "tile"),
    ("auto", "simt", 264, 2048, 128, torch.float16, True, 1, {}, "ring"),
    ("auto", "simt", 264, 2048, 128, torch.bfloat16, False, 3, {}, "batch"),
]


def emulated_id(c) -> str:
    kernel, engine, n, k, g, dtype, symmetric, m, options, _ = c
    return (f"{kernel}-{engine}-N{n}-K{k}-G{g}-{str(dtype)[6:]}-{'sym' if symmetric else 'asym'}-M{m}"
            + "".join(f"-{key}={value}" for key, value in options.items()))


@pytest.mark.parametrize("kernel,engine,n,k,g,dtype,symmetric,m,options,ran",
                         [pytest.param(*c, id=emulated_id(c)) for c in EMULATED])
def test_emulated_kernel_matches_oracle(emulator, tmp_path, kernel, engine, n, k, g, dtype, symmetric, m, options,
                                        ran):
    from oracle import judge, plain_torch_matmul, random_quantized, reference_matmul
    from oracle.layouts import to_kernel_layout

    gen = torch.Generator().manual_seed(n * 7 + k + m)
    weight = random_quantized(n, k, g, symmetric, dtype, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    y, plan = emulate_call(emulator, tmp_path, x, to_kernel_layout(weight, dtype), bias, kernel=kernel, engine=engine,
                           **options)
    assert plan.kernel == ran, plan
    verdict = judge(y, reference_matmul(x, weight, bias), dequant_dtype=dtype, dequant_roundings=1,
                    baseline=plain_torch_matmul(x, weight, bias))
    assert verdict.passed, verdict.summary()


def persistent_cut_units(n: int, m: int, k: int, blocks: int) -> set[int]:
    """The row groups of the persistent grid of `blocks` blocks that warp boundaries cut, restated
    from the kernel's split (csrc/skinny_segment.cuh): block b owns row groups [b U / B, (b + 1) U / B)
    and its 8 warps split their iterations evenly."""
    m_pad = 1 if m <= 1 else 2 if m <= 2 else 4
    units = -(-n // (4 * m_pad))
    per_unit = -(-k // (8 // m_pad * 128))
    cut = set()
    for b in range(blocks):
        first, iters = b * units // blocks, ((b + 1) * units // blocks - b * units // blocks) * per_unit
        cut |= {first + w * iters // 8 // per_unit for w in range(1, 8) if w * iters // 8 % per_unit}
    return cut


@pytest.mark.parametrize("m,n,symmetric,g", [
    (1, 200, False, 128), (1, 264, True, 64), (2, 200, True, 64), (2, 208, False, 32), (3, 520, False, 128),
    (4, 416, False, 32),
], ids=lambda v: str(v))
def test_emulated_persistent_whole_row_groups_equal_smem(emulator, tmp_path, m, n, symmetric, g):
    """The persistent kernel forms the sums of a row group one warp runs whole as the shared-x
    kernel does at split 1: those rows' bits equal the shared-x kernel's, whichever warp and block
    own them (one SM: 2 blocks). The row groups that warp boundaries cut (some in every case here)
    are added from their warps' parts instead, and the oracle judges them
    (test_emulated_kernel_matches_oracle)."""
    from oracle import random_quantized
    from oracle.layouts import to_kernel_layout

    k = 2048
    gen = torch.Generator().manual_seed(m * 31 + g)
    weight = random_quantized(n, k, g, symmetric, torch.bfloat16, generator=gen)
    kw = to_kernel_layout(weight, torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = (torch.randn(n, generator=gen) * 0.1).to(torch.bfloat16)
    y_p, plan_p = emulate_call(emulator, tmp_path, x, kw, bias, kernel="segment_persistent", num_sms=1)
    y_s, plan_s = emulate_call(emulator, tmp_path, x, kw, bias, kernel="segment_smem", split=1)
    assert (plan_p.kernel, plan_s.kernel, plan_p.blocks) == ("segment_persistent", "segment_smem", 2)
    rows = 4 * (1 if m <= 1 else 2 if m <= 2 else 4)
    cut = persistent_cut_units(n, m, k, plan_p.blocks)
    whole = torch.tensor([r // rows not in cut for r in range(n)])
    assert cut and whole.any()
    assert torch.equal(y_p.view(torch.int16)[:, whole], y_s.view(torch.int16)[:, whole])


@pytest.mark.parametrize("symmetric,dtype", [(False, torch.bfloat16), (True, torch.float16)],
                         ids=["bf16-asym", "fp16-sym"])
def test_emulated_stream_ring_depth_keeps_rows(emulator, tmp_path, symmetric, dtype):
    """The stream kernel at K 4096, G 128, split 2 on one SM (2 blocks): M = 9 runs a ring of 4
    slots (two blocks fit an SM), M = 16, whose x is 29 KB larger, one of 2. The ring depth changes
    no sum: both plans share their summation order, rows 0..8 are bit-identical, and both match the
    oracle."""
    from oracle import judge, plain_torch_matmul, random_quantized, reference_matmul
    from oracle.layouts import to_kernel_layout

    gen = torch.Generator().manual_seed(int(symmetric))
    n, k, g = 200, 4096, 128
    weight = random_quantized(n, k, g, symmetric, dtype, generator=gen)
    kw = to_kernel_layout(weight, dtype)
    x = torch.randn(16, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    options = dict(kernel="stream", split=2, num_sms=1)
    y9, plan9 = emulate_call(emulator, tmp_path, x[:9], kw, bias, **options)
    y16, plan16 = emulate_call(emulator, tmp_path, x, kw, bias, **options)
    assert (plan9.stages, plan16.stages) == (4, 2) and plan9.summation == plan16.summation
    assert torch.equal(y9.view(torch.int16), y16[:9].view(torch.int16))
    verdict = judge(y16, reference_matmul(x, weight, bias), dequant_dtype=dtype, dequant_roundings=1,
                    baseline=plain_torch_matmul(x, weight, bias))
    assert verdict.passed, verdict.summary()


@pytest.mark.parametrize("kernel", ["tile", "wgmma"])
@pytest.mark.parametrize("m_small,m_large", [(17, 32), (40, 64), (65, 130)], ids=lambda v: f"M{v}")
def test_emulated_tile_rows_keep_their_bits_within_an_m_tile(emulator, tmp_path, m_small, m_large, kernel):
    """The tile and wgmma kernels' rows depend on M only through the plan: two M of one tile size
    (or of whole M tiles of 128) at one split share their summation order, and the first rows are
    bit-identical; both match the oracle."""
    from oracle import judge, plain_torch_matmul, random_quantized, reference_matmul
    from oracle.layouts import to_kernel_layout

    gen = torch.Generator().manual_seed(m_large)
    n, k, g, dtype = 136, 512, 64, torch.bfloat16
    weight = random_quantized(n, k, g, False, dtype, generator=gen)
    kw = to_kernel_layout(weight, dtype)
    x = torch.randn(m_large, k, generator=gen).to(dtype)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    y_s, plan_s = emulate_call(emulator, tmp_path, x[:m_small], kw, bias, kernel=kernel, split=2)
    y_l, plan_l = emulate_call(emulator, tmp_path, x, kw, bias, kernel=kernel, split=2)
    assert plan_s.kernel == plan_l.kernel == kernel and plan_s.summation == plan_l.summation
    assert torch.equal(y_s.view(torch.int16), y_l[:m_small].view(torch.int16))
    verdict = judge(y_l, reference_matmul(x, weight, bias), dequant_dtype=dtype, dequant_roundings=1,
                    baseline=plain_torch_matmul(x, weight, bias))
    assert verdict.passed, verdict.summary()


# Each kernel on a small probe weight: (rows of x per call, options). The segmented kernels take
# 4 rows at most; the persistent one gets a grid on 3 SMs at every M from a policy that asks for no
# iterations a warp and an even load.
PROBED = {
    "batch": (16, dict(split=2)),
    "ring": (16, dict(split=2)),
    "segment": (4, dict(split=2)),
    "segment_smem": (4, dict(split=1)),
    "segment_persistent": (4, dict(num_sms=3, policy=policy_with(persistent_min_iters=0, persistent_max_load_pct=100))),
    "stream": (16, dict(split=2)),
    "tile": (40, dict(split=2)),
    "wgmma": (40, dict(split=2)),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kernel", skinny.KERNELS)
def test_emulated_kernel_passes_exact_probes(emulator, tmp_path, kernel, dtype):
    """One-hot rows and group indicators of x (oracle.probes) make every correct kernel's output
    exact: a mismatch is a bug (a wrong nibble, zero point, scale or row), never rounding."""
    from oracle import probe_weight, run_probes
    from oracle.layouts import to_kernel_layout

    max_m, options = PROBED[kernel]
    weight = probe_weight(64, 256, 128, False, dtype, generator=torch.Generator().manual_seed(1))
    kw = to_kernel_layout(weight, dtype)
    bias = (torch.randn(64, generator=torch.Generator().manual_seed(2)) * 0.1).to(dtype)
    ran = set()

    def run(x, b):
        y, plan = emulate_call(emulator, tmp_path, x, kw, b, kernel=kernel, **options)
        ran.add(plan.kernel)
        return y

    result = run_probes(run, weight, dtype, bias, max_m=max_m)
    # The wgmma kernel takes M above 16 only: below, the plan's own kernel runs the probes.
    assert kernel in ran and (ran == {kernel} or kernel == "wgmma"), ran
    assert result.passed, result.summary()


# ---------------------------------------------------------------------------------------------
# Python side on CPU


def torch_check_messages(source: str) -> list[list[str]]:
    """The message arguments (after the condition) of every TORCH_CHECK in C++ source text."""
    calls = []
    for start in (m.end() for m in re.finditer(r"\bTORCH_CHECK\(", source)):
        depth, args, current, in_string = 1, [], "", False
        for i, ch in enumerate(source[start:]):
            if ch == '"' and source[start + i - 1] != "\\":
                in_string = not in_string
            if not in_string:
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0 or (depth == 1 and ch == ","):
                    args.append(" ".join(current.split()))
                    current = ""
                    if depth == 0:
                        break
                    continue
            current += ch
        calls.append(args[1:])
    return calls


def test_binding_never_streams_a_number_into_a_message():
    """Every argument of the binding's TORCH_CHECK messages is text: a literal, std::string (the
    plan's and policy parser's errors, the op's name), a dtype or device (streamed as their names),
    or a number through num()/dims() (std::to_string). On the device image an integer streamed by
    extension code crashed the process instead of raising."""
    text_like = re.compile(r'^("[^"]*"\s*)+$|^(num|dims|std::string)\(.*\)$|.*(scalar_type|device)\(\)$|'
                           r'^\w+ \? "[^"]*" : "[^"]*"$|^(op|error|plan\.error)$')
    calls = torch_check_messages((CSRC / "skinny_binding.cpp").read_text())
    assert len(calls) >= 20, "fewer TORCH_CHECKs than the binding has: the parser is broken"
    streamed = [arg for args in calls for arg in args if not text_like.match(arg)]
    assert not streamed, f"message arguments streamed as numbers (wrap them in num() or dims()): {streamed}"
    assert torch_check_messages('TORCH_CHECK(a == 1, "got ", a, " and ", num(b));') == [['"got "', "a", '" and "',
                                                                                          "num(b)"]]


def test_build_sources_are_the_family_units():
    """The extension builds the binding, the launch and one unit per kernel family: every .cu of
    csrc/, nothing else."""
    names = [f.name for f in skinny._sources()]
    assert names == ["skinny_binding.cpp", "skinny_launch.cu", "skinny_batch.cu", "skinny_ring.cu",
                     "skinny_segment.cu", "skinny_stream.cu", "skinny_tile.cu", "skinny_wgmma.cu"]
    assert sorted(f.name for f in CSRC.glob("*.cu")) == sorted(names[1:])
    for f in skinny._sources():
        assert f.exists(), f


@pytest.fixture
def no_build(monkeypatch):
    """Contract checks must fire before any compile: building here fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the skinny extension was built on a machine without a device")
    monkeypatch.setattr(skinny, "build", forbidden)


def test_is_available_reports_a_reason_without_compiling(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a device is present; this checks the CPU-only report")
    from torch.utils import cpp_extension

    def forbidden(*args, **kwargs):
        raise AssertionError("is_available() compiled on a machine without a device")
    monkeypatch.setattr(cpp_extension, "load", forbidden)
    ok, reason = skinny.is_available()
    assert not ok
    assert "torch.cuda.is_available() is False" in reason


def test_plan_needs_the_extension():
    if torch.cuda.is_available():
        pytest.skip("a device is present; this checks the CPU-only report")
    with pytest.raises(skinny.SkinnyUnavailable, match="torch.cuda.is_available"):
        skinny.plan(1, 64, 256, 128, True)


def test_plan_values_name_the_fields():
    """SkinnyPlan.from_values reads the plan op's list: kernel and engine by name, the summation
    tuple last; a list of the wrong length is refused."""
    plan = skinny.SkinnyPlan.from_values([4, 1, 1, 264, 0, 16384, 0, 1, 4, 1, 1, 264])
    assert (plan.kernel, plan.engine, plan.split, plan.blocks, plan.shared_bytes) == \
        ("segment_persistent", "mma", 1, 264, 16384)
    assert plan.summation == (1, 4, 1, 1, 264)
    with pytest.raises(ValueError, match="12 integers"):
        skinny.SkinnyPlan.from_values([0] * 11)


def weights(n: int, k: int, g: int, dtype: torch.dtype, symmetric: bool, weight_dtype: torch.dtype = torch.int32,
            device: str = "cpu"):
    per_elem = 8 if weight_dtype == torch.int32 else 2
    qweight = torch.zeros(n, k // per_elem, dtype=weight_dtype, device=device)
    scales = torch.ones(n, k // g, dtype=dtype, device=device)
    zeros = None if symmetric else torch.zeros(n // 8, k // g, dtype=torch.int32, device=device)
    return qweight, scales, zeros


FAKE_CASES = [
    pytest.param(m, dtype, sym, wdt, id=f"M{m}-{str(dtype)[6:]}-{'sym' if sym else 'asym'}-{str(wdt)[6:]}")
    for m in (1, 16)
    for dtype in (torch.float16, torch.bfloat16)
    for sym in (True, False)
    for wdt in (torch.int32, torch.int8)
]


@pytest.mark.parametrize("m,dtype,symmetric,weight_dtype", FAKE_CASES)
def test_fake_gives_output_shape_and_dtype(m, dtype, symmetric, weight_dtype):
    n, k, g = 64, 256, 128
    with FakeTensorMode():
        x = torch.empty(m, k, dtype=dtype)
        qweight, scales, zeros = weights(n, k, g, dtype, symmetric, weight_dtype)
        bias = torch.empty(n, dtype=dtype)
        y = torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, g, bias, "auto", default_policy())
    assert tuple(y.shape) == (m, n) and y.dtype == dtype


def test_fake_on_meta_tensors():
    x = torch.empty(5, 512, dtype=torch.bfloat16, device="meta")
    qweight, scales, zeros = weights(32, 512, 64, torch.bfloat16, False, device="meta")
    y = torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, 64, None, "simt", default_policy())
    assert y.device.type == "meta" and tuple(y.shape) == (5, 32) and y.dtype == torch.bfloat16
    y = torch.ops.w4a16.skinny_matmul(x, qweight, scales, zeros, 64, None, "mma", default_policy(), "stream", "weights",
                                      2)
    assert tuple(y.shape) == (5, 32)


@pytest.mark.parametrize("m", (skinny.MAX_M + 1, 130), ids=lambda m: f"M{m}")
def test_fake_takes_m_beyond_max(m):
    """Above MAX_M the tile kernel runs any M: the fake gives its [M, N] (the op's plan refuses a
    call the tile kernel cannot run)."""
    with FakeTensorMode():
        x = torch.empty(m, 256, dtype=torch.float16)
        y = torch.ops.w4a16.skinny_matmul(x, *weights(64, 256, 128, torch.float16, True), 128, None, "auto",
                                          default_policy())
    assert tuple(y.shape) == (m, 64) and y.dtype == torch.float16


def test_fake_rejects_no_rows():
    with FakeTensorMode(), pytest.raises(RuntimeError, match="at least one row"):
        x = torch.empty(0, 256, dtype=torch.float16)
        torch.ops.w4a16.skinny_matmul(x, *weights(64, 256, 128, torch.float16, True), 128, None, "auto",
                                      default_policy())


def call(m=1, n=64, k=256, g=128, dtype=torch.float16, symmetric=False, weight_dtype=torch.int32, **overrides):
    x = torch.randn(m, k).to(dtype)
    qweight, scales, zeros = weights(n, k, g, dtype, symmetric, weight_dtype)
    args = {"x": x, "qweight": qweight, "scales": scales, "zeros": zeros, "group_size": g, **overrides}
    return skinny.skinny_matmul(**args)


REJECTED = [
    pytest.param(dict(zeros=torch.zeros(64, 2, dtype=torch.float16)),
                 r"^Zero points must be int32 or uint32 \(packed 8x uint4 along dim 0\)", id="unpacked-zero-points"),
    pytest.param(dict(m=skinny.MAX_M + 1, k=192, g=64),
                 rf"^skinny_matmul cannot take this call: M={skinny.MAX_M + 1} above {skinny.MAX_M} runs on the tile "
                 rf"kernel, which needs K % {skinny.TILE_K} == 0, got K=192$", id="M-above-max-K-not-tiled"),
    pytest.param(dict(g=256, k=512), r"group_size must be one of \(32, 64, 128\)", id="group-size-256"),
    pytest.param(dict(k=48, g=32), "K must be a multiple of group_size", id="K-not-multiple-of-group"),
    pytest.param(dict(k=100, g=32), "K must be a multiple of 8", id="K-not-multiple-of-8"),
    pytest.param(dict(n=12), "Zero points must be int32 or uint32", id="asym-N-not-multiple-of-8"),
    pytest.param(dict(engine="tensor"), "engine must be one of", id="unknown-engine"),
    pytest.param(dict(kernel="persistent"), r"kernel must be 'auto' or one of \('batch', 'ring'", id="unknown-kernel"),
    pytest.param(dict(kernel=2), "kernel must be 'auto' or one of", id="kernel-as-an-index"),
    pytest.param(dict(overlap="early"), "overlap must be one of", id="unknown-overlap"),
    pytest.param(dict(kernel="stream", split=-1), r"split must be an int >= 0", id="split-negative"),
    pytest.param(dict(kernel="stream", split=2.0), r"split must be an int >= 0", id="split-float"),
]


@pytest.mark.parametrize("overrides,message", REJECTED)
def test_wrapper_rejects_before_build(no_build, overrides, message):
    with pytest.raises(ContractError, match=message):
        call(**overrides)


@pytest.mark.parametrize("weight_dtype", [torch.int32, torch.int8], ids=["int32-N-K/8", "int8-N-K/2"])
def test_valid_cpu_call_passes_the_contract_then_is_unavailable(no_build, weight_dtype):
    with pytest.raises(skinny.SkinnyUnavailable, match="CUDA/ROCm devices"):
        call(weight_dtype=weight_dtype)


@pytest.mark.parametrize("m", (skinny.MAX_M + 1, 130), ids=lambda m: f"M{m}")
def test_m_above_max_on_whole_tile_pieces_passes_the_contract(no_build, m):
    """K = 256 is two TILE_K pieces: the tile kernel takes any M, so the call gets past the contract."""
    with pytest.raises(skinny.SkinnyUnavailable, match="CUDA/ROCm devices"):
        call(m=m, k=256)


def test_unfit_names_what_the_tile_kernel_needs():
    """unfit(m, k, rocm): "" up to MAX_M whatever K and device; above, the tile kernel's needs."""
    assert [skinny.unfit(m, k, rocm) for m in (1, skinny.MAX_M) for k in (64, 192) for rocm in (False, True)] == \
        [""] * 8
    assert skinny.unfit(skinny.MAX_M + 1, 2 * skinny.TILE_K, False) == ""
    assert skinny.unfit(4096, 4096, False) == ""
    assert skinny.unfit(17, 192, False) == "M=17 above 16 runs on the tile kernel, which needs K % 128 == 0, got K=192"
    assert "CUDA-only" in skinny.unfit(17, 256, True)


def test_planner_builds_from_the_plan_header_alone():
    """The plan-only program includes skinny_plan.h and nothing else of csrc/ (no CUDA, HIP or torch
    header), and the host compiler builds it with -Wall -Wextra -Werror (tests/support/
    skinny_emulator.py build_planner): the binding's plan needs nothing else."""
    from tests.support.skinny_emulator import EMULATOR, build_planner

    includes = re.findall(r'^#include "([^"]+)"', EMULATOR.read_text(), flags=re.M)
    assert includes == ["skinny_plan.h"], includes
    assert re.findall(r'^#include "([^"]+)"', (CSRC / "skinny_plan.h").read_text(), flags=re.M) == []
    out = subprocess.run([str(build_planner()), "--plan"], input="", capture_output=True, text=True, check=True)
    assert out.stdout == ""
