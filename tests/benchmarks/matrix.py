"""The benchmark matrix: which (shape, M, dtype, symmetry, provider) cells run, with readable ids.

Selection comes from pytest options (`--bench-shapes` etc., when tests/benchmarks is on the
command line) or the matching environment variables (`W4A16_BENCH_SHAPES` etc., always), and
`-k` on top. When nothing will be timed (no GPU, or pytest-benchmark off under xdist or
--benchmark-disable) the matrix is a fixed smoke set instead: tiny shapes, the providers that
run on the device at hand, each body run once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from oracle.shapes import BOUNDARY_SHAPES, MODEL_SHAPES, LinearShape, unique_shapes

from .providers import DTYPES, PROVIDERS, expand, resolve

ALL_M = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
M_SETS = {"all": ALL_M, "decode": (1, 2, 3, 4, 8, 16), "prefill": (32, 64, 128, 256, 512, 1024, 2048, 4096),
          "default": (1, 4, 16, 128, 1024, 4096)}
LLAMA = ("llama3.1-8b", "llama3.3-70b")
SYMMETRY = {"sym": True, "asym": False}
# Defaults sized for one H200 command (< 9 minutes with --bench-budget-s 480): the Llama shapes
# in bf16 with asymmetric weights, every provider.
DEFAULTS = {"shapes": "default", "m": "default", "dtypes": "bf16", "sym": "asym", "providers": "all"}
OPTIONS = {  # selection key -> (pytest option, environment variable, help)
    "shapes": ("--bench-shapes", "W4A16_BENCH_SHAPES",
               "default (Llama-3.1-8B and 3.3-70B), models, boundary, all, or comma-separated parts of shape ids"),
    "m": ("--bench-m", "W4A16_BENCH_M", f"default, decode, prefill, all ({ALL_M}) or comma-separated M"),
    "dtypes": ("--bench-dtypes", "W4A16_BENCH_DTYPES", "comma-separated fp16, bf16, or all"),
    "sym": ("--bench-sym", "W4A16_BENCH_SYM", "comma-separated sym, asym, or all"),
    "providers": ("--bench-providers", "W4A16_BENCH_PROVIDERS",
                  f"comma-separated of {list(PROVIDERS)}, all, triton@<tile id or candidate group: decode, mid, "
                  "prefill, all> and skinny@<kernel or all>"),
}
BLOCK_M = (1, 16)
# Without a GPU: K spans two groups, N one tile; M = 1 (GEMV), 5 (multi-row, split K), 33
# (tensor-core tiles) keep the Triton interpreter under a second a cell.
SMOKE_SHAPES = (LinearShape("smoke", "tiny", 256, 64),)
SMOKE_M = (1, 5, 33)
SMOKE_BLOCK = (LinearShape("smoke", "qkv", 128, 192), LinearShape("smoke", "o", 128, 128),
               LinearShape("smoke", "gate_up", 128, 512), LinearShape("smoke", "down", 256, 128))


class SelectionError(ValueError):
    pass


@dataclass(frozen=True)
class Selection:
    shapes: tuple[LinearShape, ...]
    ms: tuple[int, ...]
    dtypes: tuple[str, ...]
    symmetric: tuple[bool, ...]
    providers: tuple[str, ...]


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_shapes(text: str) -> tuple[LinearShape, ...]:
    named = {"default": [s for s in unique_shapes() if s.model in LLAMA], "all": unique_shapes(),
             "models": [s for s in unique_shapes() if s in MODEL_SHAPES], "boundary": list(BOUNDARY_SHAPES)}
    if text in named:
        return tuple(named[text])
    parts = _items(text)
    out = tuple(s for s in unique_shapes() if any(p in s.id for p in parts))
    if not out:
        raise SelectionError(f"--bench-shapes {text!r} matches no shape id, e.g. {unique_shapes()[0].id}")
    return out


def parse_m(text: str) -> tuple[int, ...]:
    if text in M_SETS:
        return M_SETS[text]
    try:
        ms = tuple(int(t) for t in _items(text))
    except ValueError:
        raise SelectionError(f"--bench-m {text!r}: expected {list(M_SETS)} or comma-separated integers") from None
    if not ms or min(ms) < 1:
        raise SelectionError(f"--bench-m {text!r}: expected positive integers")
    return ms


def parse_names(text: str, known: list[str], what: str) -> tuple[str, ...]:
    names = known if text == "all" else _items(text)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SelectionError(f"{what} {text!r}: unknown {unknown}, choose from {known} or all")
    return tuple(names)


def parse_providers(text: str) -> tuple[str, ...]:
    """"all" (every named provider) or comma-separated names, each a provider of PROVIDERS or a
    forced choice (providers.expand), in the order given, each once."""
    if text == "all":
        return tuple(PROVIDERS)
    names: list[str] = []
    for item in _items(text):
        try:
            names += expand(item)
        except ValueError as e:
            raise SelectionError(f"--bench-providers {text!r}: {e}; choose from {list(PROVIDERS)}, all, "
                                 "triton@<tile id or group> or skinny@<kernel>") from None
    if not names:
        raise SelectionError(f"--bench-providers {text!r}: no provider named")
    return tuple(dict.fromkeys(names))


def selection(values: dict[str, str]) -> Selection:
    """values: selection key -> text, as the options and environment give them."""
    return Selection(
        shapes=parse_shapes(values["shapes"]),
        ms=parse_m(values["m"]),
        dtypes=parse_names(values["dtypes"], list(DTYPES), "--bench-dtypes"),
        symmetric=tuple(SYMMETRY[s] for s in parse_names(values["sym"], list(SYMMETRY), "--bench-sym")),
        providers=parse_providers(values["providers"]),
    )


def selection_values(getoption) -> dict[str, str]:
    """getoption(name) -> the option's value or None. Option beats environment beats default."""
    out = {}
    for key, (option, env, _) in OPTIONS.items():
        out[key] = getoption(option.lstrip("-").replace("-", "_")) or os.environ.get(env) or DEFAULTS[key]
    return out


@dataclass(frozen=True)
class Cell:
    """One timed matmul: a weight (shape, dtype, symmetry) at M rows through one provider."""

    shape: LinearShape
    m: int
    dtype: str
    symmetric: bool
    provider: str

    @property
    def sym(self) -> str:
        return "sym" if self.symmetric else "asym"

    @property
    def id(self) -> str:
        return f"{self.shape.id}-M{self.m}-{self.dtype}-{self.sym}-{self.provider}"

    @property
    def weight_key(self) -> tuple:
        return (self.shape, self.dtype, self.symmetric)


def matrix(sel: Selection) -> list[Cell]:
    """Cells ordered weight by weight, then M, then provider: one weight and one M's reference
    are live at a time. Combinations a provider is not defined for are left out."""
    cells = []
    for shape in sel.shapes:
        for dtype in sel.dtypes:
            for symmetric in sel.symmetric:
                for m in sel.ms:
                    for name in sel.providers:
                        if resolve(name).valid(shape, m, dtype):
                            cells.append(Cell(shape, m, dtype, symmetric, name))
    return cells


def smoke_matrix(providers: tuple[str, ...], gpu: bool) -> list[Cell]:
    """When nothing is timed: tiny shapes, every dtype and symmetry, the providers that run on
    the device at hand."""
    runnable = tuple(p for p in providers if gpu or resolve(p).cpu)
    return matrix(Selection(SMOKE_SHAPES, SMOKE_M, tuple(DTYPES), (True, False), runnable))


@dataclass(frozen=True)
class BlockCell:
    """The linear layers of one transformer block (qkv, o, gate_up, down), M rows each, bf16,
    asymmetric, through one provider."""

    model: str
    layers: tuple[LinearShape, ...]
    m: int
    provider: str
    dtype: str = "bf16"
    symmetric: bool = False

    @property
    def id(self) -> str:
        return f"{self.model}-block-M{self.m}-{self.provider}"


def block_matrix(providers: tuple[str, ...], timing: bool, gpu: bool) -> list[BlockCell]:
    """The Llama blocks when timing, else a tiny stand-in block (the smoke run)."""
    models = [(model, tuple(s for s in MODEL_SHAPES if s.model == model)) for model in LLAMA] if timing \
        else [("smoke", SMOKE_BLOCK)]
    cells = []
    for model, layers in models:
        for m in BLOCK_M:
            for name in providers:
                p = resolve(name)
                if p.kernel and (gpu or p.cpu) and all(p.valid(s, m, "bf16") for s in layers):
                    cells.append(BlockCell(model, layers, m, name))
    return cells
