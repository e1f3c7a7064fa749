"""Every measured decision of our kernels, one JSON file per device in optimized/policies/.

A policy file holds three sections, and each decision in it carries its evidence: the command that
measured it, the commit it ran at and a one-line summary of the numbers.

* "triton": the Triton kernel's tile table (optimized/tile_configs.py fits a bucket to a call).
* "hybrid": where the hybrid op stops preferring the skinny kernel (skinny_max_m), starts
  preferring the transient dequantize-then-GEMM path (transient_min_m) and, with a dense cache,
  the dense GEMM (dense_min_m).
* "skinny": the thresholds of the skinny kernel's plan (optimized/csrc/skinny_plan.h SkinnyPolicy,
  same field order as SKINNY_FIELDS).

`policy_for(device_name)` picks the file whose "matches" names part of the device name
(torch.cuda.get_device_name(), or "interpreter" for CPU tensors), else the one marked "default".
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from .tile_configs import DEQUANT_TAGS, DEQUANTS, PATHS, TileConfig, TileTable

POLICY_DIR = Path(__file__).resolve().parent / "policies"
INTERPRETER = "interpreter"  # the device name of CPU tensors (Triton's interpreter)


class PolicyError(ValueError):
    """A policy file is malformed: names the file, the entry and what was expected."""


@dataclass(frozen=True)
class Evidence:
    command: str  # what measured it ("none" for a choice that is not a measurement)
    commit: str   # the commit the command ran at
    summary: str  # the numbers, in one line


@dataclass(frozen=True)
class HybridThresholds:
    """skinny_max_m:    the skinny kernel is preferred for M <= this where it takes the call (above
                     skinny.MAX_M only its tile kernel runs: CUDA, K % 128 == 0).
    transient_min_m: W dequantized into a shared workspace, then one dense GEMM, for M >= this.
    dense_min_m:     with a dense cache, the dense GEMM is preferred for M >= this."""

    skinny_max_m: int
    transient_min_m: int
    dense_min_m: int


@dataclass(frozen=True)
class SkinnyPolicy:
    """The skinny plan's measured thresholds (csrc/skinny_plan.h SkinnyPolicy, same order).

    ring_max_m:                    above the segmented kernels' M, the register ring runs up to this M
                                   and the batch kernel above it, where the streaming kernel does not.
    stream_min_k:                  the streaming kernel runs from this K ...
    stream_min_weight_bytes_ring:  ... or from these weight bytes (N K / 2) at M <= ring_max_m,
    stream_min_weight_bytes_batch: ... or these above it.
    persistent_min_iters:          the persistent segmented grid needs this many iterations a warp,
    persistent_max_load_pct:       and runs where the shared-x grid loads the SMs below this % of
                                   even (or runs several waves).
    shared_x_max_bytes:            x is staged in shared memory up to this size.
    stream_one_block_cost:         the streaming split model's time factor where one block fits an SM.
    """

    ring_max_m: int
    stream_min_k: int
    stream_min_weight_bytes_ring: int
    stream_min_weight_bytes_batch: int
    persistent_min_iters: int
    persistent_max_load_pct: int
    shared_x_max_bytes: int
    stream_one_block_cost: float

    def values(self) -> list[float]:
        """The fields in SkinnyPolicy order, as the skinny ops take them."""
        return [float(getattr(self, f.name)) for f in fields(self)]


SKINNY_FIELDS = tuple(f.name for f in fields(SkinnyPolicy))
TILE_FIELDS = tuple(f.name for f in fields(TileConfig))


@dataclass(frozen=True)
class Policy:
    name: str      # the file's stem
    device: str    # the device it was measured on, in words
    triton: TileTable
    hybrid: HybridThresholds
    skinny: SkinnyPolicy
    evidence: dict[str, Evidence]  # "triton.M<=1", "hybrid", "skinny.ring_max_m", ... -> its evidence

    @property
    def source(self) -> str:
        return f"optimized/policies/{self.name}.json"


def _evidence(where: str, data: object) -> Evidence:
    if not isinstance(data, dict) or set(data) - {"decides"} != {"command", "commit", "summary"}:
        raise PolicyError(f"{where}: expected evidence {{command, commit, summary}}, got {data!r}")
    return Evidence(str(data["command"]), str(data["commit"]), str(data["summary"]))


def _tile(where: str, entry: dict) -> TileConfig:
    missing = [f for f in TILE_FIELDS if f not in entry]
    if missing:
        raise PolicyError(f"{where}: expected the tile fields {list(TILE_FIELDS)}, missing {missing}")
    cfg = TileConfig(**{f: entry[f] for f in TILE_FIELDS})
    if cfg.path not in ("auto", *PATHS) or cfg.dequant not in DEQUANTS:
        raise PolicyError(f"{where}: expected path auto or one of {list(PATHS)} and dequant one of {list(DEQUANTS)}, "
                          f"got {cfg.path!r}, {cfg.dequant!r}")
    return cfg


def parse(name: str, data: dict) -> Policy:
    """The Policy of one file's JSON; raises PolicyError naming the entry at fault."""
    where = f"optimized/policies/{name}.json"
    for key in ("device", "matches", "triton", "hybrid", "skinny"):
        if key not in data:
            raise PolicyError(f"{where}: expected a {key!r} entry")
    evidence: dict[str, Evidence] = {}
    t = data["triton"]
    buckets = []
    for i, entry in enumerate(t["buckets"]):
        label = "triton.M" + ("<=" + str(entry.get("max_m")) if entry.get("max_m") is not None else ">last")
        buckets.append((entry["max_m"], _tile(f"{where} {label}", entry)))
        evidence[label] = _evidence(f"{where} {label}", entry.get("evidence"))
    if not buckets or buckets[-1][0] is not None:
        raise PolicyError(f"{where} triton: expected buckets ending with max_m null (every larger M)")
    ms = [m for m, _ in buckets[:-1]]
    if ms != sorted(set(ms)):
        raise PolicyError(f"{where} triton: expected ascending max_m, got {ms}")
    table = TileTable(name, int(t["target_programs"]), tuple(buckets), int(t.get("split_below", 0)))
    h = data["hybrid"]
    missing = [f for f in ("skinny_max_m", "transient_min_m", "dense_min_m") if f not in h]
    if missing:
        raise PolicyError(f"{where} hybrid: expected skinny_max_m, transient_min_m and dense_min_m, missing {missing}")
    hybrid = HybridThresholds(int(h["skinny_max_m"]), int(h["transient_min_m"]), int(h["dense_min_m"]))
    evidence["hybrid"] = _evidence(f"{where} hybrid", h.get("evidence"))
    evidence["hybrid.transient_min_m"] = _evidence(f"{where} hybrid.transient_min_m", h.get("transient_evidence"))
    s = data["skinny"]
    missing = [f for f in SKINNY_FIELDS if f not in s]
    if missing:
        raise PolicyError(f"{where} skinny: expected {list(SKINNY_FIELDS)}, missing {missing}")
    skinny = SkinnyPolicy(**{f: s[f] for f in SKINNY_FIELDS})
    for entry in s.get("evidence", []):
        for key in entry.get("decides", []):
            evidence[f"skinny.{key}"] = _evidence(f"{where} skinny.{key}", entry)
    undocumented = [f for f in SKINNY_FIELDS if f"skinny.{f}" not in evidence]
    if undocumented:
        raise PolicyError(f"{where} skinny: expected evidence for every threshold, none for {undocumented}")
    return Policy(name, str(data["device"]), table, hybrid, skinny, evidence)


@functools.cache
def load_all() -> dict[str, tuple[tuple[str, ...], bool, Policy]]:
    """name -> (matches, default, policy) for every file in POLICY_DIR."""
    out = {}
    for path in sorted(POLICY_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        out[path.stem] = (tuple(data["matches"]), bool(data.get("default")), parse(path.stem, data))
    defaults = [name for name, (_, default, _) in out.items() if default]
    if len(defaults) != 1:
        raise PolicyError(f"{POLICY_DIR}: expected exactly one file marked default, got {defaults}")
    return out


@functools.cache
def policy_for(device_name: str) -> Policy:
    """The policy of the device called `device_name` (INTERPRETER for CPU tensors)."""
    files = load_all()
    for matches, _, policy in files.values():
        if any(m in device_name for m in matches):
            return policy
    return next(policy for _, default, policy in files.values() if default)


# ---------------------------------------------------------------------------------------------
# Fitting rules: how benchmark timings become the decisions above. tools/fit_policy.py applies
# them to pytest-benchmark results of tests/benchmarks; they live here so that tests hold them.

_TILE_ID = re.compile(r"m(\d+)n(\d+)k(\d+)s(\d+)w(\d+)p(\d+)(-gemv|-dot|-swap)?(-h)?")
_TILE_PATHS = {None: "auto", "-gemv": "gemv", "-dot": "dot", "-swap": "dot_swap"}


def tile_from_id(text: str) -> TileConfig:
    """The TileConfig whose `id` is `text` (e.g. "m16n64k128s32w4p4-swap-h"); raises ValueError."""
    found = _TILE_ID.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not a tile id: expected m<block_m>n<block_n>k<block_k>s<split_k>"
                         f"w<num_warps>p<num_stages>, then -gemv, -dot or -swap (path) and -h (half "
                         f"dequant)")
    sizes = [int(v) for v in found.groups()[:6]]
    dequant = next(name for name, tag in DEQUANT_TAGS.items() if tag == (found.group(8) or ""))
    return TileConfig(*sizes, path=_TILE_PATHS[found.group(7)], dequant=dequant)


def geometric_mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def skinny_max_m(ratio_by_m: Mapping[int, float]) -> int:
    """ratio_by_m: M -> skinny time / Triton time at that M (the geometric mean over the shapes).
    The largest M with skinny faster (ratio < 1) at every measured M up to it; 0 when skinny is
    slower at the smallest measured M."""
    best = 0
    for m in sorted(ratio_by_m):
        if ratio_by_m[m] >= 1.0:
            break
        best = m
    return best


def against_fallback(skinny: Mapping[tuple, float], triton: Mapping[tuple, float], transient: Mapping[tuple, float],
                     transient_min_m: int) -> dict[int, float]:
    """Times in us per cell (shape, dtype, sym, M) of each path. M -> the geometric mean over the
    cells of skinny's time over that of the path the hybrid op runs when skinny does not take the
    call: the transient path from transient_min_m on, Triton below it; a cell without that rival's
    time is left out."""
    ratios: dict[int, list[float]] = {}
    for key, t in skinny.items():
        rival = transient if key[3] >= transient_min_m else triton
        if key in rival:
            ratios.setdefault(key[3], []).append(t / rival[key])
    return {m: geometric_mean(v) for m, v in sorted(ratios.items())}


def dense_min_m(ratio_by_m: Mapping[int, float]) -> int | None:
    """ratio_by_m: M -> dense GEMM (or transient path) time / Triton time at that M (the geometric
    mean over the shapes). The smallest measured M from which it is faster (ratio < 1) at every
    larger measured M; None when it is slower at the largest measured M."""
    first = None
    for m in sorted(ratio_by_m, reverse=True):
        if ratio_by_m[m] >= 1.0:
            break
        first = m
    return first


def bucket_ranges(table: TileTable) -> list[tuple[int, int | None]]:
    """(smallest M, largest M or None for any larger) of each bucket of `table`, in its order."""
    out, lo = [], 1
    for max_m, _ in table.buckets:
        out.append((lo, max_m))
        lo = (max_m or lo) + 1
    return out


def best_tile(pct_by_tile: Mapping[str, Mapping[Hashable, float]]) -> tuple[str, float] | None:
    """pct_by_tile: tile id -> measured cell -> % of the floor. The tile with the highest geometric
    mean over the cells, among the tiles measured on every cell that any tile was measured on (a
    tile missing a cell, e.g. one a time budget cut, is left out); None when no tile qualifies."""
    cells = set().union(*(set(c) for c in pct_by_tile.values())) if pct_by_tile else set()
    scores = {tile: geometric_mean(pcts[c] for c in cells) for tile, pcts in pct_by_tile.items()
              if cells and cells <= set(pcts)}
    if not scores:
        return None
    tile = max(scores, key=lambda t: (scores[t], t))
    return tile, scores[tile]


def choice_score(choice_us: Mapping[Hashable, float], kernel_us: Mapping[Hashable, Mapping[str, float]]) -> dict | None:
    """How close a policy's choice comes to the fastest kernel. choice_us: cell -> time of the
    policy's own choice; kernel_us: cell -> kernel -> time of each forced kernel. Over the cells
    with both: the geometric mean and the worst of choice time / fastest kernel's time (1 is
    best), the worst cell and the kernel that was fastest there; None when no cell has both."""
    ratios = {cell: (us / min(kernel_us[cell].values()), min(kernel_us[cell], key=kernel_us[cell].get))
              for cell, us in choice_us.items() if kernel_us.get(cell)}
    if not ratios:
        return None
    worst = max(ratios, key=lambda c: ratios[c][0])
    return {"cells": len(ratios), "geomean": geometric_mean(r for r, _ in ratios.values()),
            "worst": ratios[worst][0], "worst_cell": worst, "fastest_there": ratios[worst][1]}
