"""Golden timings: a two-sided band per cell, one file per device: fixtures/golden/<policy>.json,
named like the device's policy file (optimized/policies/, e.g. h200.json for an NVIDIA H200).

    {"device": "NVIDIA H200", "environment": {...}, "updated": "2025-...",
     "cells": {"matmul/<cell id>": {"median_us": 13.2, "lo_us": 11.9, "hi_us": 14.5}, ...}}

A timing above its band is a regression (the cell fails); one below it is reported as an
improvement, so a stale band cannot hide a speed-up. Bands are only compared on the device
they were recorded on. `--update-golden` merges this run's cells into the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
REL_BAND = 0.10   # graph timings on the H200 repeat within a few percent
IQR_BANDS = 3.0   # a noisier cell gets a wider band: 3 interquartile ranges of its replays


def golden_path(device_name: str) -> Path:
    """The golden file of the device called `device_name` (torch.cuda.get_device_name())."""
    from optimized.policy import policy_for

    return GOLDEN_DIR / f"{policy_for(device_name).name}.json"


def band(median_us: float, iqr_us: float) -> dict:
    half = max(REL_BAND * median_us, IQR_BANDS * iqr_us)
    return {"median_us": median_us, "lo_us": median_us - half, "hi_us": median_us + half}


def load(path: Path) -> dict:
    """The golden file, or an empty one when it is absent or blank."""
    text = path.read_text() if path.exists() else ""
    return json.loads(text) if text.strip() else {"device": None, "cells": {}}


@dataclass(frozen=True)
class Comparison:
    status: str   # "in band", "slower", "faster", "no golden", "other device"
    text: str

    @property
    def regression(self) -> bool:
        return self.status == "slower"


def compare(golden: dict, device: str, key: str, median_us: float) -> Comparison:
    if golden.get("device") and golden["device"] != device:
        return Comparison("other device", f"goldens are for {golden['device']}, this is {device}")
    g = golden.get("cells", {}).get(key)
    if g is None:
        return Comparison("no golden", "no golden for this cell")
    status = "slower" if median_us > g["hi_us"] else "faster" if median_us < g["lo_us"] else "in band"
    return Comparison(status, f"{median_us:.2f} us against band [{g['lo_us']:.2f}, {g['hi_us']:.2f}] "
                              f"(golden {g['median_us']:.2f} us, {median_us / g['median_us']:.3f}x)")


def update(path: Path, device: str, environment: dict, timed: dict[str, dict]) -> None:
    """Merge `timed` (key -> band) into the file; cells recorded on another device are dropped."""
    old = load(path)
    cells = old.get("cells", {}) if old.get("device") == device else {}
    cells.update(timed)
    out = {"device": device, "environment": environment, "updated": datetime.now(timezone.utc).isoformat(),
           "cells": dict(sorted(cells.items()))}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
