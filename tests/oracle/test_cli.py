"""The CLI's first contact: clear errors for specs it cannot load, progress in a log, shards."""

import json

import pytest

from oracle.cli import main


@pytest.mark.parametrize("target, expected", [
    ("nosuch.module:spec", "kernel: expected an importable module 'nosuch.module'"),
    ("oracle.peers:nosuch", "expected 'oracle.peers' to define 'nosuch', but it does not (KernelSpec objects there: "
                            "['gemlite', 'tinygemm'])"),
    ("oracle.cases:Case", "expected oracle.cases:Case to be an oracle.kernel_spec.KernelSpec, got type"),
    ("oracle.peers", "kernel: expected 'package.module:spec', got 'oracle.peers'"),
])
def test_unloadable_specs_are_named_without_a_traceback(target, expected):
    with pytest.raises(SystemExit) as info:
        main(["check", target])
    assert expected in str(info.value)


def test_progress_shows_in_a_log(capsys):
    assert main(["check", "oracle.baselines:torch_dequant", "--shard", "7/64", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tier cpu: ") and "progress: " in out and "left" in out
    table = [line for line in out.splitlines() if "torch-dequant" in line]
    assert table and "│" in table[0] and len(table[0]) <= 160


def test_shard_reports_merge_into_the_single_runs_table(tmp_path, capsys):
    """Two shards run apart, merged by `report`, give every case the verdict of the single run."""
    for part in ("1/2", "2/2"):
        assert main(["check", "oracle.baselines:torch_dequant", "--shard", part, "--workers", "1",
                     "--json", str(tmp_path / f"shard{part[0]}.json")]) == 0
    assert main(["check", "oracle.baselines:torch_dequant", "--workers", "1", "--json", str(tmp_path / "all.json")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "shard1.json"), str(tmp_path / "shard2.json"),
                 "--json", str(tmp_path / "merged.json")]) == 0
    assert "shards 1/2, 2/2" in capsys.readouterr().out
    merged = json.loads((tmp_path / "merged.json").read_text())["kernels"]
    single = json.loads((tmp_path / "all.json").read_text())["kernels"]
    keep = ("case", "passed", "worst_ratio", "violations", "probe_rows", "probe_mismatches", "diagnosis")
    assert {k: [{f: r[f] for f in keep} for r in v] for k, v in merged.items()} == \
        {k: [{f: r[f] for f in keep} for r in v] for k, v in single.items()}


def test_overlapping_shards_are_refused(tmp_path):
    main(["check", "oracle.baselines:torch_dequant", "--shard", "1/8", "--workers", "1",
          "--json", str(tmp_path / "a.json")])
    with pytest.raises(SystemExit, match="expected disjoint shards"):
        main(["report", str(tmp_path / "a.json"), str(tmp_path / "a.json")])
