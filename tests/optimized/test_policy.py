"""The per-device policy files (optimized/policies/*.json): every decision the kernels read is
there, well formed and backed by evidence, and each device name resolves to its own file."""

from __future__ import annotations

import json
import re

import pytest

from optimized import dispatch, policy, skinny
from optimized.policy import POLICY_DIR, PolicyError, parse, policy_for
from optimized.tile_configs import check_config

FILES = sorted(POLICY_DIR.glob("*.json"))
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
CUDA_ONLY = {"h100", "h200"}  # the policy files whose devices are NVIDIA GPUs


def load(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_file_parses_with_evidence_for_every_decision(path):
    p = parse(path.stem, load(path))
    assert set(p.evidence) >= {"hybrid", *(f"skinny.{f}" for f in policy.SKINNY_FIELDS)}
    assert sum(key.startswith("triton.") for key in p.evidence) == len(p.triton.buckets)
    for key, e in p.evidence.items():
        assert e.command and e.summary, key
        assert COMMIT.match(e.commit), f"{key}: commit {e.commit!r} is not a commit id"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_values_are_ones_the_kernels_can_run(path):
    p = parse(path.stem, load(path))
    for _, cfg in p.triton.buckets:
        check_config(cfg, 4096, 128)
    # Above MAX_M only the tile kernel runs, on CUDA alone: a file that may match a ROCm device
    # preferring skinny there would only make every such call pass it over.
    assert 0 <= p.hybrid.skinny_max_m and p.hybrid.dense_min_m >= 1
    assert p.hybrid.skinny_max_m <= skinny.MAX_M or path.stem in CUDA_ONLY, p.hybrid
    s = p.skinny
    assert s.ring_max_m >= 1 and s.stream_min_k > 0 and s.shared_x_max_bytes > 0
    assert 0 < s.persistent_max_load_pct <= 100 and s.stream_one_block_cost >= 1.0


def test_exactly_one_default_and_it_catches_unknown_devices():
    defaults = [p.stem for p in FILES if load(p).get("default")]
    assert len(defaults) == 1, defaults
    assert policy_for("a device no file names").name == defaults[0]


@pytest.mark.parametrize("path", [p for p in FILES if load(p)["matches"]], ids=lambda p: p.stem)
def test_each_named_device_resolves_to_its_file(path):
    for name in load(path)["matches"]:
        assert policy_for(f"NVIDIA {name} 141GB").name == path.stem
        t = dispatch.thresholds_for(f"NVIDIA {name} 141GB")
        assert t.source == f"optimized/policies/{path.name}"


def test_cpu_tensors_use_the_interpreter_file():
    assert policy_for(policy.INTERPRETER).name == "interpreter"


@pytest.mark.parametrize("mutate, expected", [
    pytest.param(lambda d: d["skinny"].pop("ring_max_m"), "missing ['ring_max_m']", id="skinny-field-missing"),
    pytest.param(lambda d: d["skinny"].__setitem__("evidence", []), "expected evidence for every threshold",
                 id="skinny-evidence-missing"),
    pytest.param(lambda d: d["triton"]["buckets"][0].pop("evidence"), "expected evidence {command, commit, summary}",
                 id="tile-evidence-missing"),
    pytest.param(lambda d: d["triton"]["buckets"].pop(), "expected buckets ending with max_m null",
                 id="no-catch-all-bucket"),
    pytest.param(lambda d: d["triton"]["buckets"][1].__setitem__("path", "marlin"),
                 "expected path auto or one of", id="tile-path-unknown"),
    pytest.param(lambda d: d.pop("hybrid"), "expected a 'hybrid' entry", id="section-missing"),
])
def test_malformed_file_is_named_with_what_was_expected(mutate, expected):
    data = load(POLICY_DIR / "h200.json")
    mutate(data)
    with pytest.raises(PolicyError, match=re.escape(expected)) as info:
        parse("h200", data)
    assert "optimized/policies/h200.json" in str(info.value)


# ----------------------------------------------------------------------------------------------
# The fitting rules tools/fit_policy.py applies to benchmark results


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_tile_ids_round_trip(path):
    for _, cfg in parse(path.stem, load(path)).triton.buckets:
        assert policy.tile_from_id(cfg.id) == cfg


@pytest.mark.parametrize("text", ("m16n64k128", "m16n64k128s2w4p3-fast", "M16n64k128s2w4p3", "m16n64k128s2w4p3-h-swap"))
def test_tile_id_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="is not a tile id"):
        policy.tile_from_id(text)


@pytest.mark.parametrize("ratios, expected", (
    ({1: 0.5, 4: 0.7, 16: 0.9}, 16),              # faster everywhere
    ({1: 0.5, 4: 0.7, 8: 1.02, 16: 0.9}, 4),      # a loss at 8 ends it, whatever comes after
    ({1: 1.1, 4: 0.7}, 0),                        # slower at the smallest M: never preferred
    ({16: 0.9, 1: 0.6, 4: 1.0}, 1),               # order of the mapping does not matter; 1.0 is a loss
))
def test_skinny_max_m_is_the_last_m_of_an_unbroken_win(ratios, expected):
    assert policy.skinny_max_m(ratios) == expected


@pytest.mark.parametrize("transient_min_m, expected", (
    (512, {64: 0.6, 512: (0.6 * 2.0) ** 0.5, 1024: 1.5}),  # from 512 on skinny meets the transient
                                                            # path; shape b has none at 1024: left out
    (8192, {64: 0.6, 512: (0.6 * 0.5) ** 0.5, 1024: 0.75}),  # no transient path: Triton throughout
))
def test_skinny_is_weighed_against_the_path_that_runs_without_it(transient_min_m, expected):
    def cells(*times):  # (shape a, shape b) at M 64, 512, 1024
        keys = [(shape, "bf16", "asym", m) for m in (64, 512, 1024) for shape in ("a", "b")]
        return {key: t for key, t in zip(keys, times) if t is not None}

    skinny = cells(6, 6, 6, 3, 9, 6)
    triton = cells(10, 10, 10, 6, 12, 8)
    transient = cells(20, 20, 10, 1.5, 6, None)
    fitted = policy.against_fallback(skinny, triton, transient, transient_min_m)
    assert fitted == pytest.approx(expected)
    assert policy.skinny_max_m(fitted) == (64 if transient_min_m == 512 else 1024)


@pytest.mark.parametrize("ratios, expected", (
    ({16: 1.3, 32: 0.9, 64: 0.7, 4096: 0.5}, 32),
    ({16: 0.9, 32: 1.1, 64: 0.7, 4096: 0.5}, 64),  # a loss at 32 moves it past 32
    ({32: 0.9, 4096: 1.01}, None),                 # slower at the largest M: no crossover
    ({4096: 0.5, 128: 0.8}, 128),
))
def test_dense_min_m_starts_an_unbroken_win_to_the_largest_m(ratios, expected):
    assert policy.dense_min_m(ratios) == expected


def test_bucket_ranges_cover_every_m_once():
    table = policy_for("NVIDIA H200").triton
    ranges = policy.bucket_ranges(table)
    assert ranges[0][0] == 1 and ranges[-1][1] is None and len(ranges) == len(table.buckets)
    assert all(hi + 1 == nxt for (_, hi), (nxt, _) in zip(ranges, ranges[1:]))


def test_best_tile_takes_the_highest_geometric_mean_over_complete_tiles():
    cells = {"a": {1: 40.0, 2: 10.0}, "b": {1: 20.0, 2: 21.0}, "c": {1: 90.0}}
    # a: sqrt(400) = 20, b: sqrt(420); c misses cell 2 and is left out.
    assert policy.best_tile(cells) == ("b", pytest.approx(420 ** 0.5))
    cells["a"][2] = 12.0  # sqrt(480)
    assert policy.best_tile(cells)[0] == "a"
    assert policy.best_tile({}) is None and policy.best_tile({"a": {1: 5.0}, "b": {2: 5.0}}) is None


def test_choice_score_against_the_fastest_kernel():
    kernels = {("s", 1): {"ring": 10.0, "stream": 8.0}, ("s", 4): {"ring": 5.0}, ("t", 1): {}}
    s = policy.choice_score({("s", 1): 8.0, ("s", 4): 6.0, ("t", 1): 3.0, ("u", 1): 1.0}, kernels)
    assert s["cells"] == 2 and s["worst"] == pytest.approx(1.2) and s["worst_cell"] == ("s", 4)
    assert s["geomean"] == pytest.approx(1.2 ** 0.5) and s["fastest_there"] == "ring"
    assert policy.choice_score({("s", 1): 1.0}, {}) is None
