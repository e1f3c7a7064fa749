"""Tile configurations for the Triton W4A16 kernel, as data, and the selector that picks one.

A table is a list of M buckets, each with one `TileConfig`. The selector takes the first bucket
whose `max_m` holds M, then fits the config to the problem:

* block_k shrinks (by halving) until no K-tile straddles a quant group: a tile either lies inside
  one group (block_k divides the group size G, K when channelwise) and uses one scale and zero
  point per row, or covers whole groups (block_k a multiple of G dividing K) and uses
  block_k // G of them per row;
* a tensor-core config whose block_k had to drop below 16 (tl.dot's minimum) becomes a GEMV
  config (block_m = 1);
* split_k (an upper bound in the table) shrinks until the (N-tile, K-split) grid reaches the
  table's `target_programs`, and so that no split is left without a K-tile; with `split_below`
  N-tiles or more there is no split at all.

The config also picks the kernel's code path (`TileConfig.path`, `TileConfig.dequant`): data,
not branches in the wrapper.

The result depends on M only through its bucket, so every M in one bucket runs the same tile
shapes and reduction order (see the batch-invariance note in `triton_w4a16`).

The tables themselves are measured data: the "triton" section of each device's policy file
(optimized/policy.py, optimized/policies/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# TileConfig.path values and the kernel's PATH codes.
PATHS = {"gemv": 0, "dot": 1, "dot_swap": 2}
# TileConfig.dequant values, the kernel's DQ codes, and their suffix in a tile id.
DEQUANTS = {"f32": 0, "half": 1}
DEQUANT_TAGS = {"f32": "", "half": "-h"}
# Most rows of x one GEMV program multiplies by each dequantized weight tile.
MAX_GEMV_ROWS = 8


@dataclass(frozen=True)
class TileConfig:
    """One launch shape. block_m: rows of x per program: 1..8 for GEMV tiles (CUDA cores, each
    dequantized weight used for every row), >= 16 for tensor-core tiles; block_n/block_k: tile
    extents (powers of two; block_k divides the group size or is a multiple of it, see
    `no_straddle`); split_k: K-splits, whose fp32 partials a second kernel sums in a fixed order;
    num_warps/num_stages: Triton options.
    path: "gemv", "dot" (x is tl.dot's A operand), "dot_swap" (the weight tile is the A operand,
    x^T the B operand), or "auto" (gemv when block_m == 1, else dot).
    dequant: how tensor-core paths form (q - z) * s, rounded once to x.dtype (the same values every
    way): "f32" (in fp32, the planes interleaved into K order), or "half" (in x.dtype arithmetic,
    interleaved). The GEMV never rounds weights."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    path: str = "auto"
    dequant: str = "f32"

    @property
    def kernel_path(self) -> str:
        if self.path == "auto":
            return "gemv" if self.block_m == 1 else "dot"
        return self.path

    @property
    def path_code(self) -> int:
        return PATHS[self.kernel_path]

    @property
    def use_dot(self) -> bool:
        return self.kernel_path != "gemv"

    @property
    def dequant_code(self) -> int:
        return DEQUANTS[self.dequant]

    @property
    def id(self) -> str:
        tag = "" if self.path == "auto" else {"gemv": "-gemv", "dot": "-dot", "dot_swap": "-swap"}.get(
            self.path, f"-{self.path}")
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
                f"w{self.num_warps}p{self.num_stages}{tag}{DEQUANT_TAGS[self.dequant]}")


@dataclass(frozen=True)
class TileTable:
    """buckets: (largest M, config) in ascending M; the last bucket must take any M (max_m None).
    target_programs: how many (N-tile, K-split) programs keep the device streaming at small M.
    split_below: K is split only while the N-tiles number fewer than this (0: no such limit);
    with enough N-tiles the split's second kernel and fp32 round trip cost more than they give."""

    name: str
    target_programs: int
    buckets: tuple[tuple[int | None, TileConfig], ...]
    split_below: int = 0


def largest_pow2_divisor(v: int) -> int:
    return v & -v


def is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def no_straddle(block_k: int, k: int, group: int) -> bool:
    """True when K-tiles of `block_k` tile K exactly and none straddles a quant group: block_k is
    a power of two that either divides the group size (a tile inside one group) or is a multiple
    of it dividing K (a tile of whole groups), and the group size divides K."""
    if not is_pow2(block_k) or k % group:
        return False
    return group % block_k == 0 or (block_k % group == 0 and k % block_k == 0)


def groups_per_tile(block_k: int, group: int) -> int:
    """Quant groups one K-tile covers (1 when the tile lies inside one group)."""
    return max(1, block_k // group)


def check_config(cfg: TileConfig, k: int, group: int) -> None:
    """Raise ValueError when `cfg` cannot run a problem with this K and (resolved) group size."""
    if not no_straddle(cfg.block_k, k, group):
        raise ValueError(f"tile config {cfg.id}: block_k={cfg.block_k} must be a power of two that divides "
                         f"the group size {group} or is a multiple of it dividing K={k} (the group size "
                         f"dividing K), so no K-tile straddles a group")
    if cfg.path not in ("auto", *PATHS) or cfg.dequant not in DEQUANTS:
        raise ValueError(f"tile config {cfg.id}: path must be auto or one of {list(PATHS)}, dequant one of "
                         f"{list(DEQUANTS)}")
    if not is_pow2(cfg.block_n) or not is_pow2(cfg.block_m):
        raise ValueError(f"tile config {cfg.id}: block_m and block_n must be powers of two")
    if cfg.use_dot and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"tile config {cfg.id}: a tensor-core tile needs block_m, block_n and block_k "
                         f">= 16 (tl.dot's minimum)")
    if not cfg.use_dot and cfg.block_m > MAX_GEMV_ROWS:
        raise ValueError(f"tile config {cfg.id}: a GEMV tile takes 1..{MAX_GEMV_ROWS} rows of x")
    if not 1 <= cfg.split_k <= k // cfg.block_k:
        raise ValueError(f"tile config {cfg.id}: split_k must be between 1 and the {k // cfg.block_k} K-tiles")


def fit_block_k(block_k: int, k: int, group: int) -> int:
    """The largest power of two up to `block_k` whose K-tiles straddle no group."""
    b = 1 << (max(block_k, 1).bit_length() - 1)
    while b > 1 and not no_straddle(b, k, group):
        b //= 2
    return b


def fit_config(cfg: TileConfig, n: int, k: int, group: int, target_programs: int,
               split_below: int = 0) -> TileConfig:
    """Shrink block_k until no K-tile straddles a group, and split_k to what the (N-tile, K-split)
    grid needs (no split at all once there are `split_below` N-tiles, when that is non-zero)."""
    block_k = fit_block_k(cfg.block_k, k, group)
    if cfg.use_dot and block_k < 16:
        # A group whose largest power-of-two divisor is 8 (channelwise, K = 8 mod 16) is below
        # tl.dot's minimum: run GEMV tiles, one row of x per program. No real model has such a K.
        cfg = replace(cfg, block_m=1, path="gemv", dequant="f32")
    k_tiles = k // block_k
    n_tiles = math.ceil(n / cfg.block_n)
    if split_below and n_tiles >= split_below:
        split = 1
    else:
        split = max(1, min(cfg.split_k, k_tiles, math.ceil(target_programs / n_tiles)))
    return replace(cfg, block_k=block_k, split_k=k_splits(k_tiles, split)[1])


def k_splits(k_tiles: int, split_k: int) -> tuple[int, int]:
    """(K-tiles per split, number of splits): split_k rounded down so that no split is empty."""
    per_split = math.ceil(k_tiles / split_k)
    return per_split, math.ceil(k_tiles / per_split)


def select_config(m: int, n: int, k: int, group: int, table: TileTable) -> TileConfig:
    """The config for x [M, K] times W [N, K] with resolved group size G (K when channelwise)."""
    for max_m, cfg in table.buckets:
        if max_m is None or m <= max_m:
            return fit_config(cfg, n, k, group, table.target_programs, table.split_below)
    raise AssertionError(f"table {table.name} has no bucket for M={m}")
