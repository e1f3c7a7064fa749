"""The H200 scripts' dry runs (tiny shapes on CPU through the same code the H200 run takes) and
their report helpers. (The Triton bench's dry runs are tested in tests/test_triton_kernel.py.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_reliability_dry_run(tmp_path):
    """Every section: fuzz, large indices, determinism, the sanitizer sweep."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "reliability_h200.py"), "--dry-run", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads((tmp_path / "reliability_h200.json").read_text())
    assert result["failures"] == 0 and result["sanitize_errors"] == 0
    assert result["fuzz"]["passed"] and result["fuzz"]["counts"]["passed"] >= 1
    # Every large shape ran on every kernel it lists, and its sampled rows and columns were judged.
    assert {c["shape"] for c in result["large"]} == {"N*K > 2^32", "N*K/32 just below 2^31 (skinny pipelined)",
                                                     "N*K/32 just above 2^31 (skinny base)", "M*K > 2^32",
                                                     "M*N > 2^32"}
    assert all(c["passed"] and c["nonfinite"] == 0 and c["sampled_cols"] >= 3 for c in result["large"])
    assert {r["kernel"] for r in result["determinism"]} == {"triton", "skinny", "skinny-simt"}
    assert all(r["passed"] for r in result["determinism"])
    assert (tmp_path / "reliability_h200.md").read_text().startswith("# Reliability (issue 8)")
    assert (tmp_path / "fuzz_log.txt").exists()


def test_hybrid_parity_dry_run_merges_its_shards(tmp_path):
    """Two worker processes split the cases by weight; the merged table must hold every case once."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "hybrid_h200.py"), "--dry-run", "--out", str(tmp_path),
                          "--sections", "parity", "--shards", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    parity = json.loads((tmp_path / "hybrid_h200.json").read_text())["parity"]
    cases = [r["case"] for r in parity["hybrid"]["rows"]]
    assert len(cases) == len(set(cases)) == parity["hybrid"]["cases"] == 12
    assert parity["hybrid"]["not_run"] == 0 and parity["hybrid"]["failed"] == 0
    assert parity["hybrid_dense"]["cases"] >= 1 and set(parity["hybrid_dense"]["chosen"]) == {"dense"}
    assert parity["triton"]["cases"] >= 1 and parity["triton"]["failed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hybrid_h200.json", "hybrid_h200.md"]


def test_overlap_dry_run_reports_every_mode(tmp_path):
    """The overlap comparison's report: a column per mode and a speedup per cell and kernel."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "overlap_h200.py"), "--dry-run", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = (tmp_path / "overlap_h200.md").read_text()
    assert "| shape | M | kernel | floor us | none | weights | weights speedup |" in report
    assert "skinny weights: geometric-mean speedup over none" in report
    result = json.loads((tmp_path / "overlap_h200.json").read_text())
    assert {r["overlap"] for r in result["timing"]} == {"none", "weights"}


def test_variant_sweep_dry_run_times_only_the_kernels_named(tmp_path):
    """--variants over every fixture shape at chosen M and kernels: one timing cell per distinct
    (k, n) x dtype case x M x kernel that runs as itself (seg_xs runs regs_s4 above M = 4, so it is
    not timed again there), plus the repeat; the table lists each M."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "skinny_h200.py"), "--variants", "--dry-run",
                          "--shapes", "all", "--ms", "4,9", "--kernels", "regs_s4,seg_xs,stream", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    from bench.skinny_h200 import named_shapes
    from oracle.shapes import MODEL_SHAPES

    cases = 2 * len({(s.k, s.n) for s in MODEL_SHAPES})
    timing = json.loads((tmp_path / "skinny_variants.json").read_text())["timing"]
    timed = {(r["case"], r["m"], r["variant_name"]) for r in timing if not r["repeat"]}
    assert len({case for case, _, _ in timed}) == cases == 2 * len(named_shapes({"all"}))
    assert {(m, v) for _, m, v in timed} == {(4, "regs_s4"), (4, "seg_xs"), (4, "stream"), (9, "regs_s4"),
                                             (9, "stream")}
    assert len(timed) == cases * 5 and sum(r["repeat"] for r in timing) == cases * 2
    assert "K4096xN28672 b16a     9" in run.stdout


def test_named_shapes_and_timing_order():
    from bench.skinny_h200 import named_shapes, timing_order
    from optimized import skinny

    assert named_shapes({"qwen3-4b.o"}) == [("qwen3-4b.o", 4096, 2560)]
    # mistral-7b repeats llama3.1-8b's shapes: one entry per (k, n), under the first name.
    assert ("llama3.1-8b.o", 4096, 4096) in named_shapes({"all"})
    assert all(not name.startswith("mistral") for name, _, _ in named_shapes({"all"}))
    assert {name.rsplit(".", 1)[0] for name, _, _ in named_shapes(set())} == {"llama3.1-8b", "llama3.3-70b"}
    with pytest.raises(SystemExit, match="unknown shapes \\['nope.o'\\]"):
        named_shapes({"nope.o"})
    v = skinny.VARIANTS.index
    assert [skinny.settled_variant("seg_p", m) for m in (4, 5)] == ["seg_p", "regs_s4"]
    assert skinny.settled_variant("stream", 16) == "stream" and skinny.settled_variant("base", 5) == "base"
    assert [skinny.settled_variant("stream", m, "simt") for m in (8, 9)] == ["regs_s4", "base"]
    # seg_p runs regs_s4 at M = 5: timed only where regs_s4 is not.
    assert timing_order((v("regs_s4"), v("seg_p")), 5) == [(v("regs_s4"), "mma")]
    assert timing_order((v("seg_p"),), 5) == [(v("seg_p"), "mma")]
    assert timing_order((v("stream"), v("seg_p")), 1) == [(v("stream"), "mma"), (v("seg_p"), "mma"),
                                                           (v("stream"), "simt"), (v("seg_p"), "simt")]


def timing_row(case: str, m: int, us: float, floor_us: float) -> dict:
    return {"case": case, "m": m, "mma_us": us, "floor_us": floor_us, "mma_pct_floor": 100 * floor_us / us}


def test_target_summary_counts_issue_4_targets():
    """Only M = 1 cells with a floor >= 7 us count for the 90% target, worst first; t16/t1 per case."""
    from bench.skinny_h200 import target_summary

    timing = [timing_row("big", 1, 10.0, 9.5), timing_row("big", 16, 11.0, 9.6),
              timing_row("slow", 1, 20.0, 10.0), timing_row("slow", 16, 40.0, 10.2),
              timing_row("tiny", 1, 6.0, 3.0), timing_row("tiny", 16, 6.5, 3.1),
              {"case": "broken", "m": 1, "error": "boom"}]
    summary = target_summary(timing)
    assert [c["case"] for c in summary["m1_cells"]] == ["slow", "big"]
    assert summary["m1_met"] == 1
    assert [(c["case"], round(c["ratio"], 3)) for c in summary["m16_over_m1"]] == [("slow", 2.0), ("big", 1.1),
                                                                                   ("tiny", 1.083)]
    assert summary["m16_met"] == 2


def test_compare_skinny_reports_after_over_before(tmp_path):
    """Cells both tables timed, ratio after / before, grouped by M; the CLI writes the report."""
    before = {"environment": {"gpu": "A"}, "timing": [timing_row("a", 1, 10.0, 9.0), timing_row("a", 16, 20.0, 9.0),
                                                      timing_row("only-before", 1, 5.0, 4.0)]}
    after = {"environment": {"gpu": "B"}, "timing": [timing_row("a", 1, 5.0, 9.0), timing_row("a", 16, 20.4, 9.0)]}
    paths = [tmp_path / "before.json", tmp_path / "after.json"]
    for path, table in zip(paths, (before, after)):
        path.write_text(json.dumps(table))
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "compare_skinny.py"), *map(str, paths), "--out",
                          str(tmp_path / "report.md")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    report = (tmp_path / "report.md").read_text()
    assert "2 cells, geometric mean 0.714" in report
    assert "| 1 | 1 | 0.500 | 1 | 0 |" in report and "| 16 | 1 | 1.020 | 0 | 0 |" in report
    assert "**Different cards**" in report

    from bench.compare_skinny import compare

    with pytest.raises(ValueError, match="share no timed mma cell"):
        compare(before, {"timing": [timing_row("other", 1, 1.0, 1.0)]})


def test_fit_policy_finds_the_size_crossover(tmp_path):
    """Two kernels whose times cross at 80 MiB of weights: the fitted threshold policy lands between
    the sizes on either side and matches the fastest kernel in every cell, while each fixed kernel
    loses somewhere."""
    from bench.fit_policy import cell_times, fit, report

    rows = []
    for k, n in ((4096, 4096), (4096, 14336), (8192, 28672), (8192, 57344)):  # 8, 28, 112, 224 MiB
        size_mib = k * n / 2 / 2**20
        for m in (5, 9):
            for name, us in (("regs_s4", 2 + size_mib / 10), ("stream", 6 + size_mib / 20)):
                rows.append({"case": f"K{k}xN{n}-bf16-asym", "k": k, "n": n, "m": m, "engine": "mma",
                             "repeat": False, "variant_name": name, "us": us})
    rows.append(dict(rows[0], repeat=True, us=99.0))  # a noise repeat: ignored
    cells = cell_times([{"timing": rows}])
    assert len(cells) == 8 and cells[("K4096xN4096-bf16-asym", 5)]["us"]["regs_s4"] == 2 + 8 / 10
    result = fit(cells, ("regs_s4", "stream"))
    fitted = result["buckets"]["5..8"]["regs_s4 below 70.0 MiB, stream above"]
    assert fitted["geomean"] == 1.0 and fitted["worst"] == 1.0 and 28 * 2**20 < fitted["threshold"] < 112 * 2**20
    assert result["overall"]["regs_s4"]["worst"] > 1.0 and result["overall"]["stream"]["worst"] > 1.0
    text = report(result, ["sweep.json"])
    assert "## M 9..16" in text and "| regs_s4 below 70.0 MiB, stream above | 4 | 1.000 | 1.000 |" in text


def test_fit_policy_finds_a_long_k_rule():
    """A small shape of long K where stream wins breaks every size threshold; the K-or-size rule
    (stream from a K or a size) matches the fastest kernel everywhere."""
    from bench.fit_policy import cell_times, fit

    rows = []
    for k, n, stream_wins in ((4096, 4096, False), (16384, 1024, True), (4096, 28672, True)):
        for name, us in (("regs_s4", 10.0), ("stream", 8.0 if stream_wins else 12.0)):
            rows.append({"case": f"K{k}xN{n}-bf16-asym", "k": k, "n": n, "m": 9, "engine": "mma", "repeat": False,
                         "variant_name": name, "us": us})
    result = fit(cell_times([{"timing": rows}]), ("regs_s4", "stream"))["buckets"]["9..16"]
    sizes = [s for name, s in result.items() if "threshold" in s and s["k_threshold"] is None]
    assert sizes and min(s["geomean"] for s in sizes) > 1.0
    (k_rule,) = [s for name, s in result.items() if name.startswith("stream from K 10240 or")]
    assert k_rule["geomean"] == 1.0 and k_rule["k_threshold"] == 10240
