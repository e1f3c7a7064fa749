"""The control mode on CPU: the renames that let a baseline tree load beside this one, this tree
loaded as its own baseline (its Triton kernel, hybrid op and skinny op side by side with ours),
the interleaving and its noise estimate, and a wrong implementation caught before it is timed."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from pathlib import Path

import pytest
import torch

from oracle import random_quantized
from oracle.shapes import LinearShape

from . import control

ROOT = Path(__file__).resolve().parents[2]
TINY = LinearShape("smoke", "tiny", 256, 64)


def tiny_weight(symmetric: bool, dtype: torch.dtype):
    return random_quantized(TINY.n, TINY.k, 128, symmetric, dtype, generator=torch.Generator().manual_seed(3))


def test_renames_move_every_op_to_the_baseline_namespace() -> None:
    py = 'OP = "w4a16::matmul"\ny = torch.ops.w4a16.skinny_matmul(x)\nEXTENSION_NAME = "w4a16_skinny"\n'
    assert control.rename_python(py) == ('OP = "w4a16_baseline::matmul"\ny = torch.ops.w4a16_baseline.skinny_matmul(x)\n'
                                         'EXTENSION_NAME = "w4a16_baseline_skinny"\n')
    cpp = ('TORCH_LIBRARY_IMPL(w4a16, CUDA, m) { m.impl("skinny_matmul", &f); }\nTORCH_LIBRARY( w4a16 , m) {}\n'
           'TORCH_LIBRARY_FRAGMENT(w4a16,m) {}\nauto op = find("w4a16::skinny_matmul");\nnamespace w4a16x {}\n')
    assert control.rename_cpp(cpp) == (
        'TORCH_LIBRARY_IMPL(w4a16_baseline, CUDA, m) { m.impl("skinny_matmul", &f); }\n'
        'TORCH_LIBRARY( w4a16_baseline , m) {}\nTORCH_LIBRARY_FRAGMENT(w4a16_baseline,m) {}\n'
        'auto op = find("w4a16_baseline::skinny_matmul");\nnamespace w4a16x {}\n')


def test_baseline_copy_has_no_op_of_this_tree() -> None:
    folder = control.baseline_copy(ROOT)
    sources = {p.relative_to(folder): p.read_text() for p in folder.rglob("*") if p.suffix in (".py", *control.CPP_SUFFIXES)}
    assert {p.relative_to(ROOT / "optimized") for p in control.package_files(ROOT)} >= set(sources)
    cpp = {p: t for p, t in sources.items() if p.suffix in control.CPP_SUFFIXES}
    assert cpp and not [p for p, t in cpp.items() if control.CPP_LIBRARY.search(t)]
    assert any("TORCH_LIBRARY_IMPL(w4a16_baseline," in t for t in cpp.values())
    assert not [p for p, t in sources.items() if '"w4a16::' in t or "torch.ops.w4a16." in t]
    assert control.baseline_copy(ROOT) == folder  # one copy per content


@pytest.mark.parametrize("name", ("triton", "hybrid"))
def test_baseline_tree_runs_beside_this_one(name: str) -> None:
    """The same sources loaded twice (the second from the renamed copy) give the same bits."""
    w = tiny_weight(False, torch.bfloat16)
    x = torch.randn(5, TINY.k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    ours = control.PROVIDERS[name].build(w, torch.bfloat16)(x)
    base = control.implementation(f"baseline:{name}", ROOT)
    assert base.name == f"baseline:{name}"
    assert torch.equal(base.build(w, torch.bfloat16)(x), ours)


def test_baseline_skinny_is_its_own_op_and_extension() -> None:
    """The baseline's skinny module defines w4a16_baseline::skinny_matmul, builds from the copy
    under another extension name, and is the one the baseline's hybrid op calls."""
    from optimized import skinny

    assert control.implementation("baseline:skinny", ROOT).name == "baseline:skinny"
    package = control.load_baseline(ROOT)
    base = __import__(f"{package}.skinny", fromlist=["skinny_matmul"])
    hybrid = __import__(f"{package}.hybrid", fromlist=["matmul"])
    assert base is not skinny and hybrid.skinny is base
    assert base.EXTENSION_NAME != skinny.EXTENSION_NAME
    assert Path(base.__file__).parent == control.baseline_copy(ROOT)
    assert hasattr(torch.ops.w4a16_baseline, "skinny_matmul") and hasattr(torch.ops.w4a16, "skinny_matmul")
    assert hasattr(torch.ops.w4a16_baseline, "matmul")
    assert sys.modules[f"{package}.triton_w4a16"] is not sys.modules.get("optimized.triton_w4a16")


def test_implementation_refuses_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a baseline tree provides"):
        control.implementation("baseline:dense", ROOT)
    with pytest.raises(ValueError, match="needs --baseline-tree"):
        control.implementation("baseline:triton", None)
    with pytest.raises(ValueError, match="unknown provider"):
        control.implementation("cutlass", None)
    with pytest.raises(ValueError, match="name one"):
        control.implementation("triton@decode", None)
    with pytest.raises(ValueError, match="not a w4a16-oracle tree"):
        control.load_baseline(tmp_path)
    assert control.implementation("triton", None) is control.PROVIDERS["triton"]
    assert control.implementation("triton@m1n128k128s8w4p1", None).info == {"tile": "m1n128k128s8w4p1"}


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
    # A and B alternate which goes first: A B, B A, ...
    order = []
    control.interleave(lambda: order.append("a") or 1.0, lambda: order.append("b") or 1.0, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]


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
    timed = []
    bad = control.compare(dense, wrong, cells[:1], "cpu", lambda fns: timed.append(fns) or host_timer(fns), 2,
                          cold=False, log=lambda _: None)
    assert "wrong output, not timed" in bad[0]["error"] and len(timed) == 1  # only the correct one was timed
    late = control.compare(dense, dense, cells[:1], "cpu", host_timer, 2, cold=False, deadline=0.0, log=lambda _: None)
    assert late[0]["error"].startswith("not run")
    rows = control.markdown(good, ["dequant_dense", "dense"]).splitlines()
    assert f"| smoke.tiny-K256xN64 | 1 | fp16 | sym | {good[0]['a_us']:.2f} | " in "\n".join(rows)
