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
    # Preferring skinny above the M it can run would only make every such call pass it over.
    assert 0 <= p.hybrid.skinny_max_m <= skinny.MAX_M and p.hybrid.dense_min_m >= 1
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
