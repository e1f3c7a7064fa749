"""Running a tier in parts: shards, the device of each pytest-xdist worker."""

import pytest

from oracle import parity_cases
from oracle.check import probe_key
from oracle.runner import parse_shard, shard, worker_device


@pytest.mark.parametrize("count", (1, 2, 3, 7))
def test_shards_are_disjoint_whole_weight_groups_and_cover_the_tier(count):
    cases = parity_cases("cpu")
    shards = [shard(cases, i, count) for i in range(1, count + 1)]
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in cases) and len(ids) == len(set(ids))
    for s in shards:
        others = {probe_key(c) for t in shards if t is not s for c in t}
        assert not {probe_key(c) for c in s} & others
    assert shards == [shard(cases, i, count) for i in range(1, count + 1)], "not deterministic"


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b"])
def test_bad_shard_is_named(text):
    with pytest.raises(ValueError, match="shard: expected 'i/n' with 1 <= i <= n"):
        parse_shard(text)


@pytest.mark.parametrize("worker, gpus, device", [
    (None, 0, "cpu"), ("gw3", 0, "cpu"), (None, 1, "cuda:0"), ("gw0", 2, "cuda:0"), ("gw1", 2, "cuda:1"),
    ("gw2", 2, "cuda:0"), ("gw7", 4, "cuda:3"), ("master", 4, "cuda:0"),
])
def test_xdist_worker_i_runs_on_gpu_i_mod_g(worker, gpus, device):
    assert worker_device(worker, gpus) == device
