"""`w4a16-oracle report` on a synthetic pytest-benchmark JSON: table content, speed-ups, the
decode proxy, golden outliers, and the PNGs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.cli import main

SHAPE = "llama3.1-8b.qkv-K4096xN6144"


def bench(kind: str, provider: str, m: int, us: float, **extra) -> dict:
    info = {"kind": kind, "provider": provider, "m": m, "dtype": "bf16", "sym": "asym", "median_us": us,
            "pct_of_floor": 100 * 3.0 / us, "floor_us": 3.0, **extra}
    if kind == "matmul":
        info.setdefault("shape", SHAPE)
    return {"name": f"test_{kind}[{provider}-M{m}]", "extra_info": info, "stats": {"median": us * 1e-6}}


def write_json(path: Path, benchmarks: list[dict]) -> Path:
    machine = {"w4a16": {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
                         "roofline": {"bytes_per_s": 4.25e12, "dense_flops": 680e12}}}
    path.write_text(json.dumps({"machine_info": machine, "benchmarks": benchmarks}))
    return path


@pytest.fixture
def bench_json(tmp_path: Path) -> Path:
    rows = [
        bench("matmul", "dense", 1, 20.0), bench("matmul", "triton", 1, 10.0),
        bench("matmul", "hybrid", 1, 8.0, hybrid_impl="skinny"),
        bench("matmul", "dense", 16, 21.0), bench("matmul", "triton", 16, 14.0, golden="slower",
                                                  golden_detail="14.00 us against band [9.00, 11.00]"),
        bench("matmul", "hybrid", 16, 7.0, hybrid_impl="skinny", golden="faster", golden_detail="7.00 us below"),
        bench("matmul", "triton", 4, 12.0, shape="boundary.n8-K4096xN8"),
        bench("block", "triton", 1, 100.0, model="llama3.1-8b", tokens_per_s=10000.0,
              hybrid_impl={"qkv": "skinny", "o": "triton"}),
        bench("block", "dense", 16, 400.0, model="llama3.1-8b", tokens_per_s=40000.0),
        {"name": "test_unrelated", "extra_info": {}, "stats": {"median": 1.0}},  # not ours: ignored
    ]
    return write_json(tmp_path / "bench.json", rows)


def test_report_table(bench_json: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert main(["report", str(bench_json), "--out", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert "NVIDIA H200" in text and "HBM 4.25 TB/s, dense bf16 680 TFLOP/s" in text
    assert "| shape | M | floor us | dense | triton | hybrid | hybrid chose |" in text
    assert f"| {SHAPE} | 1 | 3.00 | 20.00 (15%) | 10.00 (30%) | 8.00 (38%) | skinny |" in text
    # Speed-up over dense: 20 / 10 and 20 / 8 at M = 1; a shape without dense gets "-".
    assert f"| {SHAPE} | 1 | 2.00 | 2.50 |" in text
    assert "| boundary.n8-K4096xN8 | 4 | - | - |" in text
    assert "| llama3.1-8b | 1 | 10,000 (3%) | - |" in text and "| llama3.1-8b | 16 | - | 40,000 (1%) |" in text
    assert f"REGRESSION matmul {SHAPE} M=16 bf16 asym triton: 14.00 us against band" in text
    assert f"IMPROVED matmul {SHAPE} M=16 bf16 asym hybrid" in text
    assert not list(out.glob("*.png"))


def test_report_plots(bench_json: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    assert main(["report", str(bench_json), "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["boundary.n8-K4096xN8-bf16-asym.png", f"{SHAPE}-bf16-asym.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert f"![{SHAPE}]({SHAPE}-bf16-asym.png)" in (out / "report.md").read_text()


def test_report_states_the_best_of_ours_against_each_goal(tmp_path: Path) -> None:
    """The goals table takes the fastest of our providers per cell (never dense or a peer), divides
    by the M = 1 time only where the M = 1 floor is at least 7 us, keeps the worst M >= 1024 ratio,
    and counts the peer cells ours win; a shape without a goal's cells is left out."""
    big = "llama3.1-8b.gate_up-K4096xN28672"
    rows = [
        bench("matmul", "hybrid", 1, 10.0, shape=big, floor_us=8.0), bench("matmul", "tinygemm", 1, 9.0, shape=big),
        bench("matmul", "hybrid", 16, 11.0, shape=big), bench("matmul", "triton", 16, 12.0, shape=big),
        bench("matmul", "dense", 16, 30.0, shape=big), bench("matmul", "gemlite", 16, 12.5, shape=big),
        bench("matmul", "hybrid", 32, 20.0, shape=big),
        bench("matmul", "hybrid", 64, 25.0, shape=big), bench("matmul", "dense", 64, 30.0, shape=big),
        bench("matmul", "hybrid", 1024, 105.0, shape=big), bench("matmul", "dense", 1024, 100.0, shape=big),
        bench("matmul", "hybrid", 4096, 120.0, shape=big), bench("matmul", "dense", 4096, 100.0, shape=big),
        # A small shape (M = 1 floor under 7 us): no t(M) / t(1); its M = 128 ratio is 2.0.
        bench("matmul", "hybrid", 1, 4.0), bench("matmul", "hybrid", 16, 9.0),
        bench("matmul", "hybrid", 128, 10.0), bench("matmul", "dense", 128, 20.0),
        bench("matmul", "triton", 4, 12.0, shape="boundary.n8-K4096xN8"),
    ]
    out = tmp_path / "report"
    main(["report", str(write_json(tmp_path / "bench.json", rows)), "--out", str(out), "--no-plots"])
    text = (out / "report.md").read_text()
    assert (f"| {big} | 1.10 met | 2.00 missed | 2.73 met | 1.20 missed | - | - | 0.83 missed | 1 of 2 |"
            in text), text
    assert f"| {SHAPE} | - | - | - | - | 2.00 met | - | - | - |" in text
    assert "| boundary.n8-K4096xN8 |" not in text.split("against the goals")[1]


def test_later_file_wins_and_empty_input_is_an_error(bench_json: Path, tmp_path: Path) -> None:
    newer = write_json(tmp_path / "newer.json", [bench("matmul", "triton", 1, 5.0), bench("matmul", "dense", 1, 20.0)])
    out = tmp_path / "merged"
    main(["report", str(bench_json), str(newer), "--out", str(out), "--no-plots"])
    assert f"| {SHAPE} | 1 | 3.00 | 20.00 (15%) | 5.00 (60%) | 8.00 (38%) | skinny |" in (out / "report.md").read_text()
    mid = write_json(tmp_path / "mid.json", [bench("matmul", "triton", 4, 9.0), bench("matmul", "dense", 4, 19.0)])
    main(["report", str(bench_json), str(mid), "--out", str(out), "--no-plots"])
    text = (out / "report.md").read_text()
    rows = [line.split(" | ")[1] for line in text.splitlines() if line.startswith(f"| {SHAPE} | ")]
    assert rows[:3] == ["1", "4", "16"], "a later file's M sorts into its shape's rows"
    empty = write_json(tmp_path / "empty.json", [])
    with pytest.raises(SystemExit, match="no timed tests/benchmarks results"):
        main(["report", str(empty), "--out", str(tmp_path / "none"), "--no-plots"])


def test_report_names_card_commit_and_command_not_paths(tmp_path: Path) -> None:
    """Provenance: each input's commit and command (recorded by tests/benchmarks, or pytest-benchmark's
    commit_info), how many cells it supplies, and the command that regenerates the report; input
    folders do not appear."""
    first = write_json(tmp_path / "first.json", [bench("matmul", "triton", 1, 10.0), bench("matmul", "dense", 1, 20.0)])
    data = json.loads(first.read_text())
    data["commit_info"] = {"id": "0123456789abcdef", "dirty": True, "time": "2030-01-01T00:00:00"}
    first.write_text(json.dumps(data))
    second = write_json(tmp_path / "second.json", [bench("matmul", "triton", 1, 9.0)])
    data = json.loads(second.read_text())
    data["machine_info"]["w4a16"] |= {"command": "python3 -m pytest tests/benchmarks --bench-m 1", "commit": "abc1234"}
    second.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert main(["report", str(first), str(second), "--out", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert "| first.json | 1 | 0123456+ | - |" in text  # dense from the first file, triton from the second
    assert "| second.json | 1 | abc1234 | `python3 -m pytest tests/benchmarks --bench-m 1` |" in text
    assert f"`python3 -m oracle report first.json second.json --out {out} --no-plots`" in text
    assert str(tmp_path) not in text.replace(f"--out {out}", "") and "2030" not in text


def model_row(provider: str, workload: str, m: int, ms: float, **extra) -> dict:
    """A row as tests/benchmarks/model_e2e.py writes it."""
    info = {"kind": "model", "model": "llama3.1-8b", "workload": workload, "m": m, "dtype": "bf16", "sym": "asym",
            "provider": provider, "median_us": ms * 1e3, "tokens_per_s": m * 1e3 / ms, **extra}
    return {"name": f"model_e2e[{workload}-M{m}-{provider}]", "extra_info": info, "stats": {"median": ms * 1e-3}}


def test_report_model_section_beside_the_per_layer_numbers(tmp_path: Path) -> None:
    """Whole-model rows render their own section (tokens/s, ms, % of the decode floor, speed-up
    over bf16, the hybrid op's choices, the checks and skipped providers) after the matmul tables."""
    layer = write_json(tmp_path / "bench.json", [bench("matmul", "dense", 1, 20.0), bench("matmul", "triton", 1, 10.0)])
    model = write_json(tmp_path / "model_e2e.json", [
        model_row("bf16", "decode", 1, 6.0, floor_us=4800.0, pct_of_floor=80.0),
        model_row("w4a16", "decode", 1, 2.0, floor_us=1500.0, pct_of_floor=75.0,
                  hybrid_impl={"q_proj": "skinny", "down_proj": "skinny"}),
        model_row("bf16", "decode", 32, 8.0), model_row("w4a16", "decode", 32, 10.0,
                                                        hybrid_impl={"q_proj": "triton", "down_proj": "triton"}),
        model_row("bf16", "prefill", 2048, 200.0), model_row("w4a16", "prefill", 2048, 400.0),
    ])
    data = json.loads(model.read_text())
    data |= {"checks": {"w4a16": "PASS\nlayers: 224 of 224 within the oracle's bound\nlogits: PASS: ratio 1.01"},
             "skipped": {"torchao": "torchao is not installed"}}
    model.write_text(json.dumps(data))
    out = tmp_path / "report"
    assert main(["report", str(layer), str(model), "--out", str(out), "--no-plots"]) == 0
    text = (out / "report.md").read_text()
    assert text.index("## Matmul, bf16 asym") < text.index("## Model end to end")
    assert "| model | workload | bf16 | w4a16 |" in text
    assert ("| llama3.1-8b | decode, batch 1 | 166.7 tok/s, 6.00 ms (80% of 4.80 ms) | 500.0 tok/s, 2.00 ms "
            "(75% of 1.50 ms) |") in text
    assert "| llama3.1-8b | decode, batch 32 | 4,000.0 tok/s, 8.00 ms | 3,200.0 tok/s, 10.00 ms |" in text
    assert "| llama3.1-8b | prefill, 2048 tokens | 10,240.0 tok/s, 200.00 ms | 5,120.0 tok/s, 400.00 ms |" in text
    # Speed-up over bf16: 6 / 2, 8 / 10, 200 / 400.
    assert "| llama3.1-8b | decode, batch 1 | 3.00 |" in text and "| llama3.1-8b | decode, batch 32 | 0.80 |" in text
    assert "| llama3.1-8b | prefill, 2048 tokens | 0.50 |" in text
    assert "- w4a16: decode 1: skinny, decode 32: triton" in text
    assert "- w4a16: PASS; layers: 224 of 224 within the oracle's bound; logits: PASS: ratio 1.01" in text
    assert "- skipped torchao: torchao is not installed" in text
