"""The H200 scripts' dry runs: tiny shapes on CPU through the same code the H200 run takes.
(The Triton bench's dry runs are tested in tests/test_triton_kernel.py.)"""

import json
import subprocess
import sys
from pathlib import Path

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
