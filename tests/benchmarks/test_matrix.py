"""The benchmark matrix: selection parsing (forced-choice providers included), readable ids,
invalid combinations left out; the tile candidates and the forced Triton provider on CPU."""

from __future__ import annotations

import pytest
import torch

from optimized import skinny
from optimized.tile_configs import check_config
from oracle import judge, random_quantized, reference_matmul
from oracle.shapes import LinearShape, unique_shapes

from . import candidates, matrix, providers
from .matrix import DEFAULTS, SelectionError, block_matrix, parse_m, parse_providers, parse_shapes, selection, smoke_matrix

KERNELS = skinny.KERNELS
# The M of matrix.ALL_M the skinny tile kernel takes on this torch build (ROCm: none above MAX_M).
TILE_MS = tuple(m for m in matrix.ALL_M if m <= skinny.MAX_M or torch.version.hip is None)


def test_default_selection_is_the_llama_headline() -> None:
    cells = matrix.matrix(selection(DEFAULTS))
    assert {c.shape.model for c in cells} == {"llama3.1-8b", "llama3.3-70b"}
    assert {(c.dtype, c.sym) for c in cells} == {("bf16", "asym")}
    assert cells[0].id == "llama3.1-8b.qkv-K4096xN6144-M1-bf16-asym-oracle"
    assert len({c.id for c in cells}) == len(cells)


def test_invalid_combinations_are_left_out() -> None:
    sel = selection({"shapes": "all", "m": "all", "dtypes": "all", "sym": "all", "providers": "all"})
    cells = matrix.matrix(sel)
    # Above M = 16 skinny runs its tile kernel only (CUDA, K % 128 == 0): every shape here has whole
    # 128-k pieces, so with a CUDA (or CPU) torch it keeps every M; a k-tail shape stops at 16.
    skinny_ks = {c.shape.k for c in cells if c.provider == "skinny"}
    assert skinny_ks and all(k % skinny.TILE_K == 0 for k in skinny_ks)
    assert {c.m for c in cells if c.provider == "skinny"} == set(TILE_MS)
    k_tail = LinearShape("boundary", "k_tail", 4096 + 64, 1024, 64)
    assert providers.PROVIDERS["skinny"].valid(k_tail, 16, "bf16")
    assert not providers.PROVIDERS["skinny"].valid(k_tail, 17, "bf16")
    assert not [c for c in cells if c.provider == "tinygemm" and c.dtype == "fp16"]
    assert {c.m for c in cells if c.provider == "triton"} == set(matrix.ALL_M)
    # Cells come weight by weight: one weight (and its copies) is live at a time.
    keys = [c.weight_key for c in cells]
    assert len(set(keys)) == len([k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k])


def test_selection_parsing() -> None:
    assert [s.layer for s in parse_shapes("llama3.3-70b")] == ["qkv", "o", "gate_up", "down"]
    assert {s.model for s in parse_shapes("boundary")} == {"boundary"}
    assert parse_m("1, 3,4096") == (1, 3, 4096) and parse_m("decode") == (1, 2, 3, 4, 8, 16)
    with pytest.raises(SelectionError, match="matches no shape"):
        parse_shapes("gpt5")
    with pytest.raises(SelectionError, match="unknown"):
        selection(DEFAULTS | {"providers": "triton,marlin"})


def test_selection_values_prefer_option_then_environment(monkeypatch) -> None:
    monkeypatch.setenv("W4A16_BENCH_M", "2")
    monkeypatch.setenv("W4A16_BENCH_DTYPES", "fp16")
    values = matrix.selection_values(lambda name: {"bench_m": "1"}.get(name))
    assert values["m"] == "1" and values["dtypes"] == "fp16" and values["shapes"] == "default"


def test_smoke_and_block_matrices() -> None:
    cpu = smoke_matrix(tuple(matrix.PROVIDERS), gpu=False)
    assert {c.provider for c in cpu} == {"oracle", "triton", "hybrid", "hybrid_dense", "dense", "dequant_dense"}
    assert {c.provider for c in smoke_matrix(tuple(matrix.PROVIDERS), gpu=True)} == set(matrix.PROVIDERS)
    timed = block_matrix(tuple(matrix.PROVIDERS), timing=True, gpu=True)
    assert {(b.model, b.m) for b in timed} == {(m, n) for m in matrix.LLAMA for n in (1, 16)}
    assert "oracle" not in {b.provider for b in timed}  # a reference, not an inference path
    # Below skinny's M limit the dense cache changes nothing: timed only above it.
    assert {c.m for c in cpu if c.provider == "hybrid_dense"} == {33} and "hybrid_dense" not in {b.provider for b in timed}
    assert timed[0].id == "llama3.1-8b-block-M1-triton"
    assert [s.layer for s in timed[0].layers] == ["qkv", "o", "gate_up", "down"]
    assert {b.model for b in block_matrix(("triton",), timing=False, gpu=False)} == {"smoke"}


def test_forced_triton_providers_expand_and_keep_their_m_range() -> None:
    decode = candidates.group_ids("decode")
    assert parse_providers("triton,triton@decode") == ("triton", *(f"triton@{t}" for t in decode))
    assert parse_providers("triton@m16n64k128s32w4p4-swap-h") == ("triton@m16n64k128s32w4p4-swap-h",)
    # A tile id not among the candidates is still a provider; the same name twice counts once.
    assert parse_providers("triton@m32n32k64s1w4p2,triton@m32n32k64s1w4p2") == ("triton@m32n32k64s1w4p2",)
    assert len(parse_providers("triton@all")) == len(candidates.candidates())
    with pytest.raises(SelectionError, match="candidate group"):
        parse_providers("triton@fastest")
    with pytest.raises(SelectionError, match="only"):
        parse_providers("dense@cublaslt")
    sel = selection(DEFAULTS | {"providers": "triton@decode,triton@mid,triton@prefill", "m": "all"})
    cells = matrix.matrix(sel)
    for tile in candidates.candidates():
        lo, hi = candidates.m_range(tile)
        ms = {c.m for c in cells if c.provider == f"triton@{tile.id}"}
        assert ms == {m for m in matrix.ALL_M if lo <= m and (hi is None or m <= hi)}, tile.id
    assert candidates.m_range(candidates.GROUPS["decode"][1][0]) == (1, 16)
    shared = next(t for t in candidates.GROUPS["prefill"][1] if t in candidates.GROUPS["mid"][1])
    assert candidates.m_range(shared) == (17, None)  # in mid and prefill
    # Forced providers are tuning sweeps, not inference paths: no decode-block cells.
    assert not block_matrix(sel.providers, timing=True, gpu=True)


def test_skinny_kernels_are_providers() -> None:
    assert parse_providers("skinny@ring,skinny@stream") == ("skinny@ring", "skinny@stream")
    assert parse_providers("skinny@all") == tuple(f"skinny@{k}" for k in KERNELS)
    with pytest.raises(SelectionError, match="the skinny kernels are"):
        parse_providers("skinny@regs_s4")
    p = providers.resolve("skinny@ring")
    assert p.info == {"skinny_kernel": "ring"} and p.max_m == 16 and not p.cpu
    tile = providers.resolve("skinny@tile")
    assert tile.info == {"skinny_kernel": "tile"} and tile.max_m is None and not tile.cpu
    # The tile kernel runs any M (K % 128 == 0 on every default shape), the wgmma kernel any M above
    # 16 (below, the plan runs another kernel); every other kernel stops at 16.
    cells = matrix.matrix(selection(DEFAULTS | {"providers": "skinny@all", "m": "all"}))
    assert {c.provider for c in cells} == {f"skinny@{k}" for k in KERNELS}
    expected = {"tile": set(TILE_MS), "wgmma": {m for m in TILE_MS if m > 16}}
    for kernel in KERNELS:
        ms = {c.m for c in cells if c.provider == f"skinny@{kernel}"}
        assert ms == expected.get(kernel, {1, 2, 3, 4, 8, 16}), kernel
    assert max(matrix.ALL_M) > 16
    k_tail = LinearShape("boundary", "k_tail", 4096 + 64, 1024, 64)
    assert tile.valid(k_tail, 16, "bf16") and not tile.valid(k_tail, 17, "bf16")
    assert not smoke_matrix(("skinny@ring",), gpu=False) and smoke_matrix(("skinny@ring",), gpu=True)


def test_skinny_provider_forwards_the_forced_kernel(monkeypatch) -> None:
    """skinny@<kernel> calls skinny_matmul with kernel=<kernel> and the decode step's overlap."""
    calls = []
    monkeypatch.setattr(skinny, "skinny_matmul", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    w = random_quantized(64, 256, 128, False, torch.bfloat16, generator=torch.Generator().manual_seed(1))
    providers.build_skinny(w, torch.bfloat16, kernel="ring")(torch.zeros(1, 256, dtype=torch.bfloat16))
    providers.build_skinny(w, torch.bfloat16)(torch.zeros(1, 256, dtype=torch.bfloat16))
    assert calls == [{"overlap": "weights", "kernel": "ring"}, {"overlap": "weights"}]


def test_candidates_are_valid_tiles_with_ids_that_round_trip() -> None:
    tiles = candidates.candidates()
    assert len({t.id for t in tiles}) == len(tiles)
    for tile in tiles:
        assert candidates.parse(tile.id) == tile
    # Every candidate, fitted as the provider fits it, runs every Llama shape at G = 128.
    for shape in [s for s in unique_shapes() if s.model in matrix.LLAMA]:
        for tile in tiles:
            cfg = providers.fitted_tile(tile, shape.n, shape.k, 128, "NVIDIA H200")
            check_config(cfg, shape.k, 128)
            assert (cfg.kernel_path, cfg.dequant) == (tile.kernel_path, tile.dequant)


@pytest.mark.parametrize("tile, m", (("m1n128k128s8w4p1", 1), ("m16n64k128s32w4p4-swap-h", 5),
                                     ("m64n64k128s2w4p3-swap-h", 33)))
def test_forced_triton_provider_computes_correctly(tile: str, m: int) -> None:
    """A triton@ cell's body on CPU (the interpreter): the forced tile, fitted to the weight, judged."""
    w = random_quantized(64, 256, 128, False, torch.bfloat16, generator=torch.Generator().manual_seed(m))
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = providers.resolve(f"triton@{tile}").build(w, torch.bfloat16)(x)
    v = judge(y, reference_matmul(x, w), dequant_dtype=torch.bfloat16)
    assert v.passed, v.summary()
