"""The benchmark matrix: selection parsing, readable ids, invalid combinations left out."""

from __future__ import annotations

import pytest

from . import matrix
from .matrix import DEFAULTS, SelectionError, block_matrix, parse_m, parse_shapes, selection, smoke_matrix


def test_default_selection_is_the_llama_headline() -> None:
    cells = matrix.matrix(selection(DEFAULTS))
    assert {c.shape.model for c in cells} == {"llama3.1-8b", "llama3.3-70b"}
    assert {(c.dtype, c.sym) for c in cells} == {("bf16", "asym")}
    assert cells[0].id == "llama3.1-8b.qkv-K4096xN6144-M1-bf16-asym-oracle"
    assert len({c.id for c in cells}) == len(cells)


def test_invalid_combinations_are_left_out() -> None:
    sel = selection({"shapes": "all", "m": "all", "dtypes": "all", "sym": "all", "providers": "all"})
    cells = matrix.matrix(sel)
    assert not [c for c in cells if c.provider == "skinny" and c.m > 16]
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
