"""bench/control.py on CPU: a baseline tree loaded beside this one (this tree, as its own
baseline), the interleaving and its noise estimate, and a wrong implementation caught before
it is timed."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import pytest
import torch

from bench import control
from oracle import random_quantized
from oracle.shapes import LinearShape

ROOT = Path(__file__).resolve().parents[2]
TINY = LinearShape("smoke", "tiny", 256, 64)


def tiny_weight(symmetric: bool, dtype: torch.dtype):
    return random_quantized(TINY.n, TINY.k, 128, symmetric, dtype, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", control.BASELINE_PROVIDERS)
def test_baseline_tree_runs_beside_this_one(name: str) -> None:
    """The same sources loaded twice (the second under the alias, its ops renamed) give the same bits."""
    w = tiny_weight(False, torch.bfloat16)
    x = torch.randn(5, TINY.k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ours = control.PROVIDERS[name].build(w, torch.bfloat16)(x)
    base = control.implementation(f"baseline:{name}", ROOT)
    assert base.name == f"baseline:{name}"
    assert torch.equal(base.build(w, torch.bfloat16)(x), ours)


def test_implementation_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="skinny's op exists once per process"):
        control.implementation("baseline:skinny", ROOT)
    with pytest.raises(ValueError, match="needs --baseline-tree"):
        control.implementation("baseline:triton", None)
    with pytest.raises(ValueError, match="unknown provider"):
        control.implementation("cutlass", None)
    assert control.implementation("triton", None) is control.PROVIDERS["triton"]


def fake_timer(values):
    it = iter(values)
    return lambda: next(it)


def test_interleave_ratio_noise_and_verdict() -> None:
    faster = control.interleave(fake_timer([10.0] * 4), fake_timer([5.0, 5.5, 5.0, 5.5]), 4)
    assert faster["verdict"] == "faster" and faster["ratio"] == pytest.approx(0.525)
    assert (faster["ratio_min"], faster["ratio_max"]) == (0.5, 0.55)
    assert faster["noise_pct"] == pytest.approx(100 * (0.55 / 0.525 - 1))
    same = control.interleave(fake_timer([10.0] * 4), fake_timer([9.8, 10.3, 9.9, 10.1]), 4)
    assert same["verdict"] == "same"
    slower = control.interleave(fake_timer([10.0] * 2), fake_timer([12.0, 12.5]), 2)
    assert slower["verdict"] == "slower"


def host_timer(fns):
    """CPU stand-in for the graph timer: host seconds of one call."""
    def run() -> float:
        t0 = time.perf_counter()
        fns[0]()
        return time.perf_counter() - t0
    return run


def test_compare_checks_before_timing() -> None:
    dense = control.PROVIDERS["dense"]
    wrong = dataclasses.replace(dense, name="wrong", build=lambda w, dtype: (lambda x: dense.build(w, dtype)(x) * 2))
    cells = list(itertools.product([TINY], [1, 3], ["fp16"], [True]))
    good = control.compare(control.PROVIDERS["dequant_dense"], dense, cells, "cpu", host_timer, 2, cold=False,
                           log=lambda _: None)
    assert [r["m"] for r in good] == [1, 3] and all(r["ratio"] > 0 and "error" not in r for r in good)
    bad = control.compare(dense, wrong, cells[:1], "cpu", host_timer, 2, cold=False, log=lambda _: None)
    assert "wrong output, not timed" in bad[0]["error"]
    table = control.markdown(good, ["dequant_dense", "dense"]).splitlines()
    assert table[2] == "`python bench/control.py dequant_dense dense`"
    assert table[6].startswith("| smoke.tiny-K256xN64 | 1 | fp16 | sym | ") and table[6].endswith(f" {good[0]['verdict']} |")
