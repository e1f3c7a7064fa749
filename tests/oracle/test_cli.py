"""The CLI's first contact: clear errors for specs it cannot load, progress in a log, shards."""

import pytest

from oracle import parity_cases
from oracle.cli import main
from oracle.runner import parse_shard, shard


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


@pytest.mark.parametrize("count", (1, 2, 3, 7))
def test_shards_are_disjoint_whole_weight_groups_and_cover_the_tier(count):
    cases = parity_cases("cpu")
    shards = [shard(cases, i, count) for i in range(1, count + 1)]
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in cases) and len(ids) == len(set(ids))
    for s in shards:
        others = {(c.k, c.n, c.group_size, c.dtype, c.symmetric, c.act_order) for t in shards if t is not s for c in t}
        assert not {(c.k, c.n, c.group_size, c.dtype, c.symmetric, c.act_order) for c in s} & others
    assert shards == [shard(cases, i, count) for i in range(1, count + 1)], "not deterministic"


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b"])
def test_bad_shard_is_named(text):
    with pytest.raises(ValueError, match="shard: expected 'i/n' with 1 <= i <= n"):
        parse_shard(text)
