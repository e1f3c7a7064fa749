"""Tile configurations for the Triton W4A16 kernel, as data, and the selector that picks one.

A table is a list of M buckets, each with one `TileConfig`. The selector takes the first bucket
whose `max_m` holds M, then fits the config to the problem:

* block_k shrinks to the largest power of two dividing the group size G (K when channelwise), so
  no K-tile straddles a quant group and each tile uses one scale and one zero point per row;
* a tensor-core config whose block_k had to drop below 16 (tl.dot's minimum) becomes a GEMV
  config (block_m = 1);
* split_k (an upper bound in the table) shrinks until the (N-tile, K-split) grid reaches the
  table's `target_programs`, and so that no split is left without a K-tile.

The result depends on M only through its bucket, so every M in one bucket runs the same tile
shapes and reduction order (see the batch-invariance note in `triton_w4a16`).

The H200 table is a starting point for Hopper; `bench/triton_h200.py` sweeps candidates around
it at M = 1 and M = 16 and prints the best per bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# The name the Triton wrapper passes for CPU tensors (Triton's interpreter).
INTERPRETER = "interpreter"


@dataclass(frozen=True)
class TileConfig:
    """One launch shape. block_m: 1 for GEMV tiles (CUDA cores, one row of x) or >= 16 for
    tensor-core tiles; block_n/block_k: tile extents (powers of two); split_k: K-splits, whose
    fp32 partials a second kernel sums in a fixed order; num_warps/num_stages: Triton options."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2

    @property
    def use_dot(self) -> bool:
        return self.block_m > 1

    @property
    def id(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
                f"w{self.num_warps}p{self.num_stages}")


@dataclass(frozen=True)
class TileTable:
    """buckets: (largest M, config) in ascending M; the last bucket must take any M (max_m None).
    target_programs: how many (N-tile, K-split) programs keep the device streaming at small M."""

    name: str
    target_programs: int
    buckets: tuple[tuple[int | None, TileConfig], ...]


T = TileConfig

# Hopper (132 SMs on H200 and H100 SXM). M = 1 is a GEMV on the CUDA cores; M = 2..16 pads to a
# 16-row tensor-core tile, whose MMA work is free next to the weight traffic. Decode is
# bandwidth-bound: the widest K-tile a group allows, deep pipelining, and split-K up to about
# four programs per SM. Large M uses wgmma-sized tiles without split-K.
HOPPER = TileTable("hopper", target_programs=4 * 132, buckets=(
    (1, T(1, 128, 128, split_k=8, num_warps=4, num_stages=3)),
    (16, T(16, 64, 128, split_k=8, num_warps=4, num_stages=4)),
    (32, T(32, 64, 128, split_k=4, num_warps=4, num_stages=4)),
    (64, T(64, 64, 128, split_k=2, num_warps=4, num_stages=3)),
    (128, T(64, 128, 64, num_warps=4, num_stages=4)),
    (256, T(128, 128, 64, num_warps=8, num_stages=3)),
    (None, T(128, 128, 64, num_warps=8, num_stages=4)),
))

# Other CUDA GPUs and ROCm: the same structure with shallower pipelines (less shared memory on
# consumer parts and MI-series LDS) and a target sized for ~100-SM/CU devices.
GENERIC = TileTable("generic", target_programs=4 * 100, buckets=(
    (1, T(1, 128, 128, split_k=8, num_warps=4, num_stages=2)),
    (16, T(16, 64, 128, split_k=8, num_warps=4, num_stages=2)),
    (32, T(32, 64, 64, split_k=4, num_warps=4, num_stages=2)),
    (64, T(64, 64, 64, split_k=2, num_warps=4, num_stages=2)),
    (None, T(64, 128, 64, num_warps=4, num_stages=2)),
))

# Triton's CPU interpreter runs each program as numpy calls, so cost scales with the program
# count: the widest tiles that keep every code path the GPU tables use (GEMV and tensor-core
# tiles with split-K and its reduction kernel, plain tensor-core tiles) for tests to exercise.
INTERPRETED = TileTable("interpreter", target_programs=4, buckets=(
    (1, T(1, 128, 128, split_k=2)),
    (16, T(16, 64, 128, split_k=2)),
    (64, T(64, 64, 128)),
    (None, T(64, 128, 128)),
))

TABLES = (HOPPER, GENERIC, INTERPRETED)


def table_for(device_name: str) -> TileTable:
    """`device_name`: torch.cuda.get_device_name(), or INTERPRETER for CPU tensors."""
    if device_name == INTERPRETER:
        return INTERPRETED
    if "H200" in device_name or "H100" in device_name:
        return HOPPER
    return GENERIC


def largest_pow2_divisor(v: int) -> int:
    return v & -v


def no_straddle(block_k: int, k: int, group: int) -> bool:
    """True when K-tiles of `block_k` tile K exactly and each lies inside one quant group:
    block_k is a power of two dividing the group size, which divides K."""
    return block_k > 0 and block_k & (block_k - 1) == 0 and group % block_k == 0 and k % group == 0


def check_config(cfg: TileConfig, k: int, group: int) -> None:
    """Raise ValueError when `cfg` cannot run a problem with this K and (resolved) group size."""
    if not no_straddle(cfg.block_k, k, group):
        raise ValueError(f"tile config {cfg.id}: block_k={cfg.block_k} must be a power of two dividing "
                         f"the group size {group} (which divides K={k}), so no K-tile straddles a group")
    if cfg.block_n < 1 or cfg.block_n & (cfg.block_n - 1) or cfg.block_m & (cfg.block_m - 1):
        raise ValueError(f"tile config {cfg.id}: block_m and block_n must be powers of two")
    if cfg.block_m != 1 and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"tile config {cfg.id}: block_m is 1 (GEMV) or a tensor-core tile with "
                         f"block_m, block_n and block_k >= 16 (tl.dot's minimum)")
    if not 1 <= cfg.split_k <= k // cfg.block_k:
        raise ValueError(f"tile config {cfg.id}: split_k must be between 1 and the {k // cfg.block_k} K-tiles")


def fit_config(cfg: TileConfig, n: int, k: int, group: int, target_programs: int) -> TileConfig:
    """Shrink block_k to the group and split_k to what the (N-tile, K-split) grid needs."""
    block_k = min(cfg.block_k, largest_pow2_divisor(group))
    # A group whose largest power-of-two divisor is 8 (channelwise, K = 8 mod 16) is below
    # tl.dot's minimum: run GEMV tiles, one row of x per program. No real model has such a K.
    block_m = cfg.block_m if block_k >= 16 else 1
    k_tiles = k // block_k
    n_tiles = math.ceil(n / cfg.block_n)
    split = max(1, min(cfg.split_k, k_tiles, math.ceil(target_programs / n_tiles)))
    return replace(cfg, block_m=block_m, block_k=block_k, split_k=k_splits(k_tiles, split)[1])


def k_splits(k_tiles: int, split_k: int) -> tuple[int, int]:
    """(K-tiles per split, number of splits): split_k rounded down so that no split is empty."""
    per_split = math.ceil(k_tiles / split_k)
    return per_split, math.ceil(k_tiles / per_split)


def select_config(m: int, n: int, k: int, group: int, device_name: str) -> TileConfig:
    """The config for x [M, K] times W [N, K] with resolved group size G (K when channelwise)."""
    table = table_for(device_name)
    for max_m, cfg in table.buckets:
        if max_m is None or m <= max_m:
            return fit_config(cfg, n, k, group, table.target_programs)
    raise AssertionError(f"table {table.name} has no bucket for M={m}")
