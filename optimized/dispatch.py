"""Which implementation runs one hybrid call: a priority list, capability gates, measured thresholds.

Each implementation answers two questions about a call:

* `can_implement(call, platform) -> (ok, reason)`: can it compute this call correctly here at all:
  `available(platform)` (device, compiler, build) and `fits(call)` (M limit, group size, cache).
  A forced choice only asks this one.
* `prefers(call, thresholds) -> (ok, reason)`: is it the fast choice for this call, by the
  device's measured crossovers (the "hybrid" section of its policy file, optimized/policy.py).

The automatic choice walks PRIORITY and takes the first implementation that can and prefers;
the last one ("torch") can always run. An implementation unavailable on this machine (no GPU, no
compiler, failed build) is logged once at WARNING; routine routing (M above a limit) at DEBUG.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import skinny
from .contract import ContractError
from .policy import INTERPRETER, policy_for

log = logging.getLogger("optimized.hybrid")

ENV_VAR = "W4A16_IMPL"  # forces an implementation for every call that does not name one
AUTO = "auto"


class ImplementationUnavailable(RuntimeError):
    """A forced implementation cannot run this call; the message says why."""


@dataclass(frozen=True)
class Call:
    """What the gates see of one call (x is [m, k], the weight [n, k])."""

    m: int
    n: int
    k: int
    group_size: int  # 32, 64, 128 or -1
    dtype: torch.dtype
    symmetric: bool
    has_dense: bool  # the PreparedWeight carries the dense prefill cache


@dataclass(frozen=True)
class Platform:
    """The machine facts the gates depend on, for one device.

    kind:   "cuda", "rocm" or "cpu".
    name:   the device name the thresholds are keyed by ("interpreter" for CPU).
    skinny: (built and loadable, why not).
    triton: (Triton can run on this device, why not); on CPU only under TRITON_INTERPRET=1.
    """

    kind: str
    name: str
    skinny: tuple[bool, str]
    triton: tuple[bool, str]


@dataclass(frozen=True)
class Thresholds:
    """The measured crossovers the gates read, and the policy file they come from."""

    source: str
    skinny_max_m: int
    transient_min_m: int
    dense_min_m: int


@dataclass(frozen=True)
class Choice:
    name: str
    forced: bool
    rejected: tuple[tuple[str, str], ...]  # (implementation, reason) for each one passed over


@dataclass(frozen=True)
class Implementation:
    """available: the machine facts it needs; fits: the calls it computes; prefers: when it is fastest."""

    name: str
    available: Callable[[Platform], tuple[bool, str]]
    fits: Callable[[Call, Platform], tuple[bool, str]]
    prefers: Callable[[Call, Thresholds], tuple[bool, str]]

    def can_implement(self, call: Call, platform: Platform) -> tuple[bool, str]:
        ok, why = self.available(platform)
        return self.fits(call, platform) if ok else (ok, why)


OK = (True, "")


def _always(*_: object) -> tuple[bool, str]:
    return OK


def _dense_fits(call: Call, platform: Platform) -> tuple[bool, str]:
    if not call.has_dense:
        return False, "no dense cache (prepare(..., dense_cache=True) builds one)"
    return OK


def _dense_prefers(call: Call, t: Thresholds) -> tuple[bool, str]:
    if call.m < t.dense_min_m:
        return False, f"M={call.m} below dense_min_m={t.dense_min_m} ({t.source})"
    return OK


def _skinny_available(platform: Platform) -> tuple[bool, str]:
    if platform.kind not in ("cuda", "rocm"):
        return False, f"the skinny kernel needs a CUDA or ROCm device, the call is on {platform.kind}"
    return platform.skinny


def _skinny_fits(call: Call, platform: Platform) -> tuple[bool, str]:
    why = skinny.unfit(call.m, call.k, platform.kind == "rocm")
    if why:
        return False, why
    if call.group_size not in skinny.GROUP_SIZES:
        return False, f"group_size={call.group_size} not in the skinny kernel's {skinny.GROUP_SIZES}"
    return OK


def _skinny_prefers(call: Call, t: Thresholds) -> tuple[bool, str]:
    if call.m > t.skinny_max_m:
        return False, f"M={call.m} above skinny_max_m={t.skinny_max_m} ({t.source})"
    return OK


def _transient_available(platform: Platform) -> tuple[bool, str]:
    if platform.kind not in ("cuda", "rocm"):
        return False, f"the transient path dequantizes with a GPU kernel, the call is on {platform.kind}"
    return platform.triton


def _transient_prefers(call: Call, t: Thresholds) -> tuple[bool, str]:
    if call.m < t.transient_min_m:
        return False, f"M={call.m} below transient_min_m={t.transient_min_m} ({t.source})"
    return OK


IMPLEMENTATIONS = {
    "dense": Implementation("dense", _always, _dense_fits, _dense_prefers),
    "skinny": Implementation("skinny", _skinny_available, _skinny_fits, _skinny_prefers),
    # W dequantized into a workspace shared by every call (optimized/dequant.py), then cuBLAS.
    "transient": Implementation("transient", _transient_available, _always, _transient_prefers),
    "triton": Implementation("triton", lambda platform: platform.triton, _always, _always),
    # Dequantize to x.dtype and multiply in fp32 with torch: slow, but runs anywhere.
    "torch": Implementation("torch", _always, _always, _always),
}
PRIORITY = ("dense", "skinny", "transient", "triton", "torch")


def requested(impl: str | None) -> str:
    """The implementation a call asks for: its `impl` argument, else $W4A16_IMPL, else "auto"."""
    name = impl or os.environ.get(ENV_VAR) or AUTO
    if name != AUTO and name not in IMPLEMENTATIONS:
        source = "impl" if impl else f"${ENV_VAR}"
        raise ContractError(f"{source} must be 'auto' or one of {list(IMPLEMENTATIONS)}, got {name!r}")
    return name


def choose(call: Call, platform: Platform, thresholds: Thresholds, impl: str | None = None) -> Choice:
    """The implementation for `call`. A forced one that cannot run raises ImplementationUnavailable."""
    name = requested(impl)
    if name != AUTO:
        ok, why = IMPLEMENTATIONS[name].can_implement(call, platform)
        if not ok:
            raise ImplementationUnavailable(f"implementation {name!r} was forced but cannot run this call "
                                            f"(M={call.m}, N={call.n}, K={call.k}, G={call.group_size}, "
                                            f"{str(call.dtype).removeprefix('torch.')}, on {platform.name}): {why}")
        return Choice(name, True, ())
    rejected = []
    for candidate in PRIORITY:
        impl_ = IMPLEMENTATIONS[candidate]
        ok, why = impl_.available(platform)
        if not ok:
            _warn_unavailable(candidate, why)
        else:
            ok, why = impl_.fits(call, platform)
            if ok:
                ok, why = impl_.prefers(call, thresholds)
            if not ok:
                log.debug("w4a16 hybrid: not using %s: %s", candidate, why)
        if ok:
            return Choice(candidate, False, tuple(rejected))
        rejected.append((candidate, why))
    raise AssertionError("the last implementation in PRIORITY must accept every call")


@functools.cache
def _warn_unavailable(name: str, why: str) -> None:
    """Once per process and reason: a missing compiler or GPU costs speed on every call."""
    log.warning("w4a16 hybrid: %s cannot run here, falling back: %s", name, why)


def device_name(device: torch.device) -> str:
    return INTERPRETER if device.type == "cpu" else torch.cuda.get_device_name(device)


@functools.cache
def detect_platform(device: torch.device) -> Platform:
    """The facts of this process for `device` (cached: building the skinny kernel happens once)."""
    if device.type == "cuda":
        kind = "rocm" if torch.version.hip is not None else "cuda"
        return Platform(kind, device_name(device), skinny.is_available(), _triton_importable())
    if device.type == "cpu":
        ok, why = _triton_importable()
        if ok and os.environ.get("TRITON_INTERPRET") != "1":
            ok, why = False, "Triton runs on CPU only under its interpreter (TRITON_INTERPRET=1)"
        return Platform("cpu", INTERPRETER, (False, "the skinny kernel needs a CUDA or ROCm device"), (ok, why))
    no = (False, f"no kernel runs on {device.type} tensors")
    return Platform(device.type, device.type, no, no)


def _triton_importable() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return False, f"triton is not installed ({e})"
    return OK


@functools.cache
def thresholds_for(name: str) -> Thresholds:
    """The crossovers of the device called `name` (its policy file's "hybrid" section)."""
    policy = policy_for(name)
    h = policy.hybrid
    return Thresholds(policy.source, h.skinny_max_m, h.transient_min_m, h.dense_min_m)
