"""Every implementation the benchmarks time, behind one calling convention.

A provider builds one cold copy of a weight: `build(weight, dtype)` returns `call(x) -> y` with
its own tensors, so building it R times gives R copies that do not share cache lines.

    weight: oracle.canonical.QuantizedWeight on the benchmark device, scales already in `dtype`.
    x:      `dtype` (float16/bfloat16) [M, K], contiguous.
    y:      `dtype` [M, N].

PROVIDERS holds the named ones; `resolve(name)` also makes the forced-choice providers of tuning
sweeps: `triton@<tile id>` runs the Triton kernel with one tile (tests/benchmarks/candidates.py;
`triton@decode`, `@mid`, `@prefill`, `@all` name a candidate group) and `skinny@<kernel>` runs the
skinny kernel forced to one of `optimized.skinny.KERNELS` (`skinny@all`: every one).

Peers follow DESIGN.md section 5; gemlite and the hybrid op are imported only when a cell of
theirs runs (gemlite touches the GPU at import).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from optimized.policy import INTERPRETER, policy_for
from optimized.tile_configs import TileConfig, check_config, fit_config
from oracle.canonical import QuantizedWeight
from oracle.layouts import to_kernel_layout
from oracle.peers import TINYGEMM_GROUPS, gemlite_layer, tinygemm_weight
from oracle.reference import reference_matmul
from oracle.shapes import LinearShape

from . import candidates

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SHIFTS = tuple(range(0, 32, 4))  # nibble i of an int32 word sits at bits 4i..4i+3 (natural order)

Call = Callable[[torch.Tensor], torch.Tensor]


def w4_weight_bytes(k: int, n: int, group: int, symmetric: bool) -> int:
    """Packed 4-bit weight, 16-bit scales and (asymmetric) packed 4-bit zero points."""
    groups = k // group
    return k * n // 2 + 2 * n * groups + (0 if symmetric else n * groups // 2)


@dataclass(frozen=True)
class Provider:
    """name:           the parametrize id and the report's column.
    build:           (weight, dtype) -> call, one cold copy.
    weight_bytes:    (k, n, group, symmetric) -> bytes of one copy: what a call must read besides x.
    dequant_dtype:   True when the implementation rounds W into the activation dtype (the judge's
                     u_w); False when its dequantization is exact (fp32).
    roundings:       c_w, roundings in its dequant chain (2 for q * s + (-z * s) and float zeros).
    dtypes, groups:  what it accepts (None: any); min_m, max_m: the M range it is timed over
                     (max_m None: any); k_multiple: K must be a multiple of it.
    cpu:             runs on CPU tensors (the smoke run without a GPU).
    kernel:          an inference path, so part of the decode-block proxy (the oracle is not).
    module:          an optional module it needs: cells skip with the reason when it is absent.
    available:       () -> (ok, why): whether it can run in this process (cells skip with the reason).
    accepts:         (shape, m) -> bool: a further condition on the call (None: every call).
    info:            recorded in every cell's extra_info (which tile or kernel a forced provider runs).
    """

    name: str
    build: Callable[[QuantizedWeight, torch.dtype], Call]
    weight_bytes: Callable[[int, int, int, bool], int]
    dequant_dtype: bool = True
    roundings: int = 1
    dtypes: tuple[str, ...] = tuple(DTYPES)
    groups: tuple[int, ...] | None = None
    min_m: int = 1
    max_m: int | None = None
    k_multiple: int = 8
    cpu: bool = True
    kernel: bool = True
    module: str | None = None
    available: Callable[[], tuple[bool, str]] | None = None
    accepts: Callable[[LinearShape, int], bool] | None = None
    info: dict = field(default_factory=dict, hash=False)

    def valid(self, shape: LinearShape, m: int, dtype: str) -> bool:
        """Whether (shape, M, dtype) is a combination this provider is defined for."""
        group = shape.k if shape.group_size == -1 else shape.group_size
        return (dtype in self.dtypes and m >= self.min_m and (self.max_m is None or m <= self.max_m)
                and (self.groups is None or group in self.groups) and shape.k % self.k_multiple == 0
                and (self.accepts is None or self.accepts(shape, m)))

    def missing(self) -> str | None:
        """Why the provider cannot run here, or None."""
        if self.module and importlib.util.find_spec(self.module) is None:
            return f"{self.module} is not installed"
        if self.available is not None:
            ok, why = self.available()
            if not ok:
                return why
        return None


# ---------------------------------------------------------------------------------------------
# Builders


def build_oracle(w: QuantizedWeight, dtype: torch.dtype) -> Call:
    """The oracle's reference in its fast fp32 mode (oracle.reference, accumulate=float32): what
    judging a cell costs, not an inference path."""
    copy = QuantizedWeight(w.q.clone(), w.scales.clone(), None if w.zeros is None else w.zeros.clone(), w.group_size)
    return lambda x: reference_matmul(x, copy, accumulate=torch.float32).y_out


def build_triton(w: QuantizedWeight, dtype: torch.dtype, package: str = "optimized",
                 tile: TileConfig | None = None) -> Call:
    """package: where `triton_w4a16` comes from (control.py passes a baseline tree's alias).
    tile: force this tile, fitted to the weight as the device's policy fits its table's tiles
    (None: the kernel's own choice)."""
    module = importlib.import_module(f"{package}.triton_w4a16")
    kw = to_kernel_layout(w, dtype)
    if tile is None:
        return lambda x: module.w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size)
    config = fitted_tile(tile, w.n, w.k, w.group, module.device_name(w.q.device))
    return lambda x: module.w4a16_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, config=config)


def fitted_tile(tile: TileConfig, n: int, k: int, group: int, device_name: str) -> TileConfig:
    """`tile` fitted to an [N, K] weight of group size `group` (resolved) with the table of
    `device_name`'s policy; raises ValueError when it cannot run that shape."""
    table = policy_for(device_name).triton
    cfg = fit_config(tile, n, k, group, table.target_programs, table.split_below)
    check_config(cfg, k, group)
    return cfg


def build_skinny(w: QuantizedWeight, dtype: torch.dtype, package: str = "optimized", **forced) -> Call:
    """The skinny kernel as a decode step runs it (overlap="weights": the copy is read-only once
    built). package: as for build_triton; forced: e.g. kernel="ring" (skinny@ring)."""
    skinny = importlib.import_module(f"{package}.skinny")
    kw = to_kernel_layout(w, dtype)
    torch.cuda.synchronize()  # the copy is read-only from here on, as the "weights" overlap needs
    return lambda x: skinny.skinny_matmul(x, kw.qweight, kw.scales, kw.zeros, kw.group_size, overlap="weights",
                                          **forced)


def _skinny_takes(shape: LinearShape, m: int) -> bool:
    from optimized import skinny

    return not skinny.unfit(m, shape.k, rocm=torch.version.hip is not None)


def skinny_available() -> tuple[bool, str]:
    from optimized import skinny

    return skinny.is_available()


class HybridCall:
    """One prepared copy for the hybrid op; `chosen(m)` says which implementation it runs at M."""

    def __init__(self, w: QuantizedWeight, dtype: torch.dtype, package: str = "optimized",
                 dense_cache: bool = False, impl: str | None = None) -> None:
        self.hybrid = importlib.import_module(f"{package}.hybrid")
        self.prepared = self.hybrid.prepare(w, dtype, dense_cache=dense_cache)
        self.impl = impl

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.hybrid.matmul(x, self.prepared, impl=self.impl)

    def chosen(self, m: int) -> dict:
        c = self.hybrid.choose(m, self.prepared)
        return {"hybrid_impl": c.name, "hybrid_rejected": [f"{name}: {reason}" for name, reason in c.rejected]}


def build_dense(w: QuantizedWeight, dtype: torch.dtype) -> Call:
    """cuBLAS on the weight W already in the activation dtype (the unquantized model's cost)."""
    dense = w.dequantize(torch.float32).to(dtype)
    return lambda x: torch.nn.functional.linear(x, dense)


def dequantize_packed(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group: int,
                      shifts: torch.Tensor) -> torch.Tensor:
    """The kernel layout back to W in scales.dtype, in plain torch ops (graph-capturable).

    qweight: int32 [N, K/8], packed along K, natural nibble order.
    scales:  float16/bfloat16 [N, K/G].
    zeros:   int32 [N/8, K/G], packed along N, or None (z = 8).
    group:   G, a divisor of K.
    shifts:  int32 [8] = 0, 4, ..., 28 on the weight's device.
    Returns scales.dtype [N, K]: (q - z) * s, rounded once.
    """
    n, groups = scales.shape
    q = ((qweight.unsqueeze(-1) >> shifts) & 0xF).reshape(n, groups, group)
    z = 8 if zeros is None else ((zeros.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF).reshape(n, groups, 1)
    return ((q - z).to(scales.dtype) * scales.unsqueeze(-1)).reshape(n, groups * group)


def build_dequant_dense(w: QuantizedWeight, dtype: torch.dtype) -> Call:
    """What a user without a W4 kernel runs: unpack and dequantize into `dtype`, then cuBLAS."""
    kw = to_kernel_layout(w, dtype)
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=w.q.device)
    return lambda x: torch.nn.functional.linear(x, dequantize_packed(kw.qweight, kw.scales, kw.zeros, w.group, shifts))


def build_tinygemm(w: QuantizedWeight, dtype: torch.dtype) -> Call:
    packed, scales_and_zeros = tinygemm_weight(w)
    group = w.group
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, group, scales_and_zeros)


def build_gemlite(w: QuantizedWeight, dtype: torch.dtype) -> Call:
    layer = gemlite_layer(w, dtype, autotune=True)
    return lambda x: layer(x)


PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Provider("oracle", build_oracle, lambda k, n, g, sym: n * k + 2 * n * (k // g) + (0 if sym else n * (k // g)),
             dequant_dtype=False, kernel=False),
    Provider("triton", build_triton, w4_weight_bytes),
    Provider("skinny", build_skinny, w4_weight_bytes, groups=(32, 64, 128), cpu=False, available=skinny_available,
             accepts=_skinny_takes),
    Provider("hybrid", HybridCall, w4_weight_bytes, module="optimized.hybrid"),
    # prepare(..., dense_cache=True): the dense GEMM from dense_min_m on. Below skinny's M limit it
    # runs what "hybrid" runs, so it is timed above it only; its copies are sized (and its GB/s
    # counted) by the dense weight, which its prefill calls read.
    Provider("hybrid_dense", partial(HybridCall, dense_cache=True), lambda k, n, g, sym: 2 * k * n, min_m=17,
             module="optimized.hybrid"),
    # The hybrid op forced onto its transient path (W dequantized into a shared workspace, then
    # cuBLAS): the crossover transient_min_m is fitted from it. It reads the packed weight and
    # writes and reads W once a call.
    Provider("transient", partial(HybridCall, impl="transient"), w4_weight_bytes, min_m=17, cpu=False,
             module="optimized.hybrid"),
    Provider("dense", build_dense, lambda k, n, g, sym: 2 * k * n),
    Provider("dequant_dense", build_dequant_dense, w4_weight_bytes),
    # Float zero in the weight domain: q * s + zero, two roundings.
    Provider("tinygemm", build_tinygemm, lambda k, n, g, sym: k * n // 2 + 4 * n * (k // g), roundings=2,
             dtypes=("bf16",), groups=TINYGEMM_GROUPS, k_multiple=64, cpu=False),
    # Folds zeros as q * s + (-z * s) by default: two roundings; partial sums added atomically.
    Provider("gemlite", build_gemlite, w4_weight_bytes, roundings=2, cpu=False, module="gemlite"),
)}
FORCED = ("triton", "skinny")  # the providers `name@choice` forces to one tile or kernel


def expand(name: str) -> list[str]:
    """The provider names one --bench-providers item stands for: itself, or for triton@<group>
    and skinny@all every tile of the group or every kernel. Raises ValueError for a name that is
    not a provider."""
    base, at, choice = name.partition("@")
    if not at:
        if name not in PROVIDERS:
            raise ValueError(f"unknown provider {name!r}")
        return [name]
    if base == "triton":
        try:
            return [f"triton@{candidates.parse(choice).id}"]
        except ValueError:
            return [f"triton@{tile}" for tile in candidates.group_ids(choice)]
    if base == "skinny":
        from optimized.skinny import KERNELS as kernels

        if choice == "all":
            return [f"skinny@{k}" for k in kernels]
        if choice not in kernels:
            raise ValueError(f"{name!r}: the skinny kernels are {list(kernels)} (or all)")
        return [name]
    raise ValueError(f"{name!r}: only {list(FORCED)} take @<choice>")


@functools.cache
def resolve(name: str) -> Provider:
    """The provider called `name`: one of PROVIDERS, or a forced choice (see `expand`)."""
    base, at, choice = name.partition("@")
    if not at:
        return PROVIDERS[name]
    if base == "triton":
        tile = candidates.parse(choice)
        lo, hi = candidates.m_range(tile)
        return Provider(name, partial(build_triton, tile=tile), w4_weight_bytes, min_m=lo, max_m=hi, kernel=False,
                        accepts=partial(_tile_runs, tile), info={"tile": tile.id})
    if base == "skinny":
        return Provider(name, partial(build_skinny, kernel=choice), w4_weight_bytes, groups=(32, 64, 128),
                        min_m=17 if choice == "wgmma" else 1, max_m=None if choice in ("tile", "wgmma") else 16,
                        cpu=False, kernel=False, available=skinny_available,
                        accepts=_skinny_takes, info={"skinny_kernel": choice})
    raise KeyError(name)


def _tile_runs(tile: TileConfig, shape: LinearShape, m: int) -> bool:
    """Whether the tile, fitted to the shape, is a valid config (the interpreter's table stands
    in for the device's: the fit only clamps split_k by it)."""
    group = shape.k if shape.group_size == -1 else shape.group_size
    try:
        fitted_tile(tile, shape.n, shape.k, group, INTERPRETER)
    except ValueError:
        return False
    return True

