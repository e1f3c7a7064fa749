"""Triton tile candidates for tuning sweeps, timed as `triton@<tile id>` providers.

    pytest tests/benchmarks/test_matmul.py --benchmark-only --bench-m decode \
        --bench-providers triton,triton@decode --benchmark-json=out/sweep.json
    python3 -m tools.fit_policy out/sweep.json        # the winner of each M bucket

Each group holds the tiles worth timing over one M range; a group's first tiles are the ones the
device tables use now, so a sweep always measures them beside the alternatives. split_k is an
upper bound: the provider fits every tile to the shape with the device's policy
(`tile_configs.fit_config` with its table's target_programs and split_below), as `select_config`
fits a table's tile. tests/optimized/test_triton_kernel.py compiles every candidate for sm_90.
"""

from __future__ import annotations

from optimized.policy import tile_from_id
from optimized.tile_configs import TileConfig

T = TileConfig
# group -> (smallest M, largest M or None) the group's tiles are timed at, and the tiles.
GROUPS: dict[str, tuple[tuple[int, int | None], tuple[TileConfig, ...]]] = {
    "decode": ((1, 16), (
        # GEMV (CUDA cores), one row of x: the M = 1 table tile, taller N-tiles (each x value reused
        # over more rows of a thread), more K-splits (more loads in flight).
        T(1, 128, 128, 8, 4, 1),
        T(1, 256, 128, 8, 4, 1),
        T(1, 128, 128, 16, 4, 1),
        T(1, 64, 256, 8, 4, 1),
        # Tensor cores with the weight tile as the A operand (wgmma from registers on Hopper): the
        # M = 2..16 table tile and a wider one (fewer programs re-reading x).
        T(16, 64, 128, 32, 4, 4, path="dot_swap", dequant="half"),
        T(16, 128, 128, 16, 4, 4, path="dot_swap", dequant="half"),
    )),
    "mid": ((17, 256), (
        # The 17..32, 33..64 and 65..256 table tiles first (swapped, half dequant), then 128-wide
        # N-tiles (each x tile used for more weights) with 4 or 8 warps.
        T(32, 64, 128, 4, 4, 4, path="dot_swap", dequant="half"),
        T(64, 64, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        T(128, 64, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        T(64, 128, 128, 2, 4, 3, path="dot_swap", dequant="half"),
        T(128, 128, 128, 1, 8, 3, path="dot_swap", dequant="half"),
    )),
    "prefill": ((257, None), (
        # The table tile first, then a deeper pipeline, a 128 x 128 tile and x as the A operand.
        T(256, 128, 64, 1, 8, 3, path="dot_swap", dequant="half"),
        T(256, 128, 64, 1, 8, 4, path="dot_swap", dequant="half"),
        T(128, 128, 128, 1, 8, 3, path="dot_swap", dequant="half"),
        T(128, 256, 64, 1, 8, 3, path="dot", dequant="half"),
    )),
}


def candidates() -> list[TileConfig]:
    """Every candidate of every group, once, in group order."""
    return list(dict.fromkeys(cfg for _, tiles in GROUPS.values() for cfg in tiles))


def group_ids(group: str) -> list[str]:
    """The tile ids of one group, or of every group for "all"; raises ValueError for another name."""
    if group == "all":
        return [cfg.id for cfg in candidates()]
    if group not in GROUPS:
        raise ValueError(f"{group!r} is neither a tile id nor a candidate group ({[*GROUPS, 'all']})")
    return [cfg.id for cfg in GROUPS[group][1]]


def m_range(cfg: TileConfig) -> tuple[int, int | None]:
    """The M a tile is timed at: the range its groups span, else up to 16 rows for a GEMV tile
    and any M for a tensor-core tile."""
    ranges = [r for r, tiles in GROUPS.values() if cfg in tiles]
    if not ranges:
        return (1, 16) if not cfg.use_dot else (1, None)
    his = [hi for _, hi in ranges]
    return min(lo for lo, _ in ranges), None if None in his else max(his)


def parse(text: str) -> TileConfig:
    """A tile id (as `TileConfig.id` writes it); raises ValueError."""
    return tile_from_id(text)
