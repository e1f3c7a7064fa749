"""Golden bands: both directions reported, bands compared only on their own device, updates merge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import golden

H200 = "NVIDIA H200"


def test_band_is_two_sided_and_widens_with_noise() -> None:
    assert golden.band(100.0, 1.0) == {"median_us": 100.0, "lo_us": 90.0, "hi_us": 110.0}
    assert golden.band(100.0, 5.0) == {"median_us": 100.0, "lo_us": 85.0, "hi_us": 115.0}


@pytest.mark.parametrize("median_us, status", [(100.0, "in band"), (111.0, "slower"), (89.0, "faster")])
def test_compare_reports_both_directions(median_us: float, status: str) -> None:
    g = {"device": H200, "cells": {"matmul/a": golden.band(100.0, 0.0)}}
    c = golden.compare(g, H200, "matmul/a", median_us)
    assert c.status == status and c.regression == (status == "slower")
    assert f"{median_us:.2f} us against band [90.00, 110.00] (golden 100.00 us" in c.text


def test_compare_without_a_golden_or_on_another_device() -> None:
    g = {"device": H200, "cells": {"matmul/a": golden.band(100.0, 0.0)}}
    assert golden.compare(g, H200, "matmul/b", 1.0).status == "no golden"
    assert golden.compare(g, "NVIDIA H100 80GB HBM3", "matmul/a", 500.0).status == "other device"
    assert golden.compare({"device": None, "cells": {}}, H200, "matmul/a", 1.0).status == "no golden"


def test_absent_blank_and_committed_files_load_empty(tmp_path: Path) -> None:
    assert golden.load(tmp_path / "absent.json")["cells"] == {}
    (tmp_path / "blank.json").write_text("\n")
    assert golden.load(tmp_path / "blank.json")["cells"] == {}
    assert isinstance(golden.load(golden.golden_path("NVIDIA H200"))["cells"], dict)


def test_golden_file_follows_the_device_policy() -> None:
    assert golden.golden_path("NVIDIA H200").name == "h200.json" and golden.golden_path("NVIDIA H200").exists()
    assert golden.golden_path("NVIDIA H100 80GB HBM3").name == "h100.json"


def test_update_merges_and_drops_other_devices(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    golden.update(path, H200, {"torch": "x"}, {"matmul/a": golden.band(10.0, 0.0)})
    golden.update(path, H200, {"torch": "x"}, {"matmul/b": golden.band(20.0, 0.0)})
    assert sorted(json.loads(path.read_text())["cells"]) == ["matmul/a", "matmul/b"]
    golden.update(path, "NVIDIA H100", {}, {"matmul/c": golden.band(30.0, 0.0)})
    data = golden.load(path)
    assert data["device"] == "NVIDIA H100" and list(data["cells"]) == ["matmul/c"]
