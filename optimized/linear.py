"""`W4A16Linear`: a drop-in `nn.Linear` that runs the hybrid W4A16 op.

    layer = W4A16Linear.from_linear(linear, group_size=128)            # RTN-quantize a dense layer
    layer = W4A16Linear.from_weight(weight, torch.bfloat16, bias)      # a canonical oracle weight
    layer = W4A16Linear(optimized.prepare(weight, torch.bfloat16))     # an existing PreparedWeight
    y = layer(x)                                                       # x [..., K] -> y [..., N]

The PreparedWeight's tensors are the module's buffers, so `.to(device)` moves them, `state_dict`
saves them and `load_state_dict` restores them bit for bit. The forward calls the op
`torch.ops.w4a16.matmul` on the buffers directly (its fake implementation lets
`torch.compile(fullgraph=True)` trace it), which also makes it capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import nn

from oracle.canonical import QuantizedWeight
from oracle.quantize import quantize_rtn

from . import dispatch, skinny
from .contract import ACTIVATION_DTYPES, GROUP_SIZES, ContractError, _desc
from .dispatch import ImplementationUnavailable
from .hybrid import choose
from .prepared import ROW_PAD, PreparedWeight, dequantize_dense, prepare

# Bumped when the meaning of the buffers changes; a state_dict of another version is refused.
LAYOUT_VERSION = 1
# The M that `repr` always asks the dispatcher about (decode, small batch, prefill chunk, long prefill).
REPR_MS = (1, 16, 256, 4096)
# Buffers saved in the state_dict, in order; "dense" is rebuilt from them instead of saved.
STATE_BUFFERS = ("qweight", "scales", "zeros", "perm", "layout")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class W4A16Linear(nn.Module):
    """y = x @ W^T + bias with a 4-bit weight W [N, K], through `optimized.matmul`.

    Buffers (one PreparedWeight, optimized/prepared.py; `prepared` rebuilds it):
      qweight: int32 [N_pad, K/8], packed along K (N_pad = N rounded up to a multiple of 8).
      scales:  float16/bfloat16 [N_pad, K/G]; their dtype is the activation dtype calls must use.
      zeros:   int32 [N_pad/8, K/G], packed along N; None for symmetric weights (z = 8).
      perm:    int64 [K], the act-order channel permutation; None when channels are in order.
      dense:   scales.dtype [N, K], the dense prefill cache; None without one. Not saved in the
               state_dict: rebuilt from the other buffers when one is loaded.
      layout:  int64 [4] = (LAYOUT_VERSION, N, K, group_size), so that loading a state_dict of
               another shape fails even where the tensors' shapes agree (N = 60 and N = 64 both
               pad to 64 rows).
    bias: nn.Parameter scales.dtype [N] (requires_grad False) or None, as nn.Linear has it.
    impl: None (the dispatcher chooses per call, or $W4A16_IMPL forces one) or an implementation
          name of `optimized.dispatch.IMPLEMENTATIONS` forced for every call.

    Inference only: the op has no backward.
    """

    def __init__(self, prepared: PreparedWeight, bias: torch.Tensor | None = None, *, impl: str | None = None) -> None:
        super().__init__()
        if not isinstance(prepared, PreparedWeight):
            raise ContractError(f"prepared must be a PreparedWeight from optimized.prepare(...), got "
                                f"{type(prepared).__name__}")
        if impl is not None:
            dispatch.requested(impl)  # raises ContractError naming the valid names
        self.in_features = prepared.k
        self.out_features = prepared.n
        self.group_size = prepared.group_size
        self.impl = impl
        self.register_buffer("qweight", prepared.qweight)
        self.register_buffer("scales", prepared.scales)
        self.register_buffer("zeros", prepared.zeros)
        self.register_buffer("perm", prepared.perm)
        self.register_buffer("dense", prepared.dense, persistent=False)
        self.register_buffer("layout", torch.tensor([LAYOUT_VERSION, prepared.n, prepared.k, prepared.group_size],
                                                    dtype=torch.int64, device=prepared.device))
        if bias is None:
            self.register_parameter("bias", None)
        else:
            if not isinstance(bias, torch.Tensor) or not bias.is_floating_point() or tuple(bias.shape) != (prepared.n,):
                raise ContractError(f"bias must be a floating-point tensor [N] = [{prepared.n}] or None, "
                                    f"got {_desc(bias)}")
            self.bias = nn.Parameter(bias.detach().to(prepared.device, prepared.dtype).clone(), requires_grad=False)

    # ------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def from_weight(cls, weight: QuantizedWeight, dtype: torch.dtype, bias: torch.Tensor | None = None, *,
                    device: torch.device | str | None = None, dense_cache: bool = False,
                    impl: str | None = None) -> "W4A16Linear":
        """A module computing with `weight` (canonical, act-order allowed), scales rounded into
        `dtype` (float16 or bfloat16, the activation dtype). bias: float [N] or None, stored in
        `dtype`. device: default where `weight` is. dense_cache: as `optimized.prepare`."""
        return cls(prepare(weight, dtype, device, dense_cache=dense_cache), bias, impl=impl)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128, symmetric: bool = False, *,
                    dtype: torch.dtype | None = None, dense_cache: bool = False,
                    impl: str | None = None) -> "W4A16Linear":
        """Quantize `linear.weight` [N, K] with the oracle's round-to-nearest quantizer
        (`oracle.quantize_rtn`, scales rounded into `dtype`) on the device it is on.

        dtype: the activation dtype, float16 or bfloat16 (default: linear.weight's dtype, which
        must then be one of them). The bias, if any, is kept (rounded into dtype).
        """
        if not isinstance(linear, nn.Linear):
            raise ContractError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        dtype = linear.weight.dtype if dtype is None else dtype
        if dtype not in ACTIVATION_DTYPES:
            raise ContractError(f"dtype must be float16 or bfloat16 (the activation dtype); linear.weight is "
                                f"{_dtype_name(linear.weight.dtype)}, so pass dtype=, got {dtype!r}")
        check_quantizable(linear.in_features, group_size)
        w = quantize_rtn(linear.weight.detach(), group_size, symmetric, scale_dtype=dtype)
        return cls.from_weight(w, dtype, linear.bias, dense_cache=dense_cache, impl=impl)

    @classmethod
    def empty(cls, in_features: int, out_features: int, *, group_size: int = 128, symmetric: bool = False,
              act_order: bool = False, bias: bool = False, dtype: torch.dtype = torch.bfloat16,
              device: torch.device | str | None = None, dense_cache: bool = False,
              impl: str | None = None) -> "W4A16Linear":
        """A module of this shape and layout holding zeros, to `load_state_dict` into."""
        if dtype not in ACTIVATION_DTYPES:
            raise ContractError(f"dtype must be float16 or bfloat16 (the activation dtype), got {dtype!r}")
        check_quantizable(in_features, group_size)
        if not isinstance(out_features, int) or out_features < 1:
            raise ContractError(f"out_features must be a positive int, got {out_features!r}")
        n_pad = -(-out_features // ROW_PAD) * ROW_PAD
        groups = 1 if group_size == -1 else in_features // group_size
        qweight = torch.zeros(n_pad, in_features // 8, dtype=torch.int32, device=device)
        scales = torch.zeros(n_pad, groups, dtype=dtype, device=device)
        zeros = None if symmetric else torch.zeros(n_pad // 8, groups, dtype=torch.int32, device=device)
        perm = torch.arange(in_features, device=device) if act_order else None
        dense = torch.zeros(out_features, in_features, dtype=dtype, device=device) if dense_cache else None
        pw = PreparedWeight(qweight, scales, zeros, group_size, out_features, perm, dense)
        return cls(pw, torch.zeros(out_features, dtype=dtype, device=device) if bias else None, impl=impl)

    # ------------------------------------------------------------------------------------------
    # what it holds

    @property
    def prepared(self) -> PreparedWeight:
        """The buffers as a PreparedWeight (validated: a cast by `.float()` fails here, naming it)."""
        return PreparedWeight(self.qweight, self.scales, self.zeros, self.group_size, self.out_features, self.perm,
                              self.dense)

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype calls must use."""
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def act_order(self) -> bool:
        return self.perm is not None

    def canonical(self) -> QuantizedWeight:
        """The weight this computes with, in the oracle's canonical form (for judging)."""
        return self.prepared.canonical()

    # ------------------------------------------------------------------------------------------
    # forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: self.dtype [..., K] (any strides) -> self.dtype [..., N]."""
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ContractError(f"x must be a tensor [..., K] with K={self.in_features}, got {_desc(x)}")
        if x.device != self.qweight.device:
            # Checked here as well as in the op: a meta x would reach the fake implementation.
            raise ContractError(f"x must be on the module's device {self.qweight.device}, got {x.device}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = torch.ops.w4a16.matmul(x2, self.qweight, self.scales, self.zeros, self.group_size, self.out_features,
                                   self.perm, self.dense, self.bias, dispatch.requested(self.impl))
        return y.reshape(*lead, self.out_features)

    # ------------------------------------------------------------------------------------------
    # repr

    def implementation_ranges(self) -> list[tuple[int, int | None, str]]:
        """[(first M, last M or None for no limit, implementation)] the dispatcher takes on this
        module's device. Exact: the choice depends on M only through the policy's thresholds and
        the skinny kernel's limit, and both sides of each are asked. On a GPU the first call loads
        the skinny kernel (building it once), as the first matmul would."""
        pw = self.prepared
        platform = dispatch.detect_platform(pw.device)
        t = dispatch.thresholds_for(platform.name)
        edges = {m for e in (t.skinny_max_m, t.transient_min_m - 1, t.dense_min_m - 1, skinny.MAX_M) for m in (e, e + 1)}
        probes = sorted({m for m in (*REPR_MS, *edges) if m >= 1})
        names = []
        for m in probes:
            try:
                names.append(choose(m, pw, impl=self.impl).name)
            except ImplementationUnavailable:
                names.append(f"nothing ({self.impl or dispatch.requested(None)} is forced and cannot run)")
        ranges: list[list] = []
        for m, name in zip(probes, names):
            if ranges and ranges[-1][2] == name:
                ranges[-1][1] = m
            else:
                if ranges:
                    ranges[-1][1] = m - 1
                ranges.append([m, m, name])
        ranges[-1][1] = None
        return [tuple(r) for r in ranges]

    def _dispatch_summary(self) -> str:
        try:
            ranges = self.implementation_ranges()
        except ContractError as e:  # an invalid $W4A16_IMPL, or buffers cast to a dtype no kernel takes
            return f"impl: none ({e})"
        forced = dispatch.requested(self.impl) != dispatch.AUTO
        parts = []
        for lo, hi, name in ranges:
            span = "all M" if lo == 1 and hi is None else f"M>={lo}" if hi is None else f"M={lo}" if lo == hi \
                else f"M={lo}-{hi}"
            parts.append(f"{span}: {name}")
        return ("impl (forced): " if forced else "impl: ") + ", ".join(parts)

    def extra_repr(self) -> str:
        group = "per-channel (G=K)" if self.group_size == -1 else f"group_size={self.group_size}"
        layout = ["symmetric (z=8)" if self.symmetric else "asymmetric"]
        if self.act_order:
            layout.append("act-order")
        if self.dense is not None:
            layout.append("dense cache")
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={_dtype_name(self.dtype)}, {group}, {', '.join(layout)}, kernel layout "
                f"(int32 packed along K), {self._dispatch_summary()}")

    # ------------------------------------------------------------------------------------------
    # state_dict and device moves

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        present = [name for name in (*STATE_BUFFERS, "bias", "weight") if prefix + name in state_dict]
        if present:
            problem = self._state_problem(state_dict, prefix)
            if problem:
                error_msgs.append(f"{prefix.rstrip('.') or type(self).__name__}: {problem}")
                return  # copy nothing into a module the state does not fit
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if present:
            self._refresh()

    def _state_problem(self, state_dict, prefix: str) -> str | None:
        """Why the state_dict's tensors under `prefix` cannot load into this module, or None."""
        me = f"W4A16Linear(N={self.out_features}, K={self.in_features}, group_size={self.group_size})"
        if prefix + "weight" in state_dict:
            return (f"the state_dict holds a dense 'weight' {_desc(state_dict[prefix + 'weight'])} (an nn.Linear's); "
                    f"{me} loads its kernel layout (qweight, scales, ...): quantize the dense layer with "
                    "W4A16Linear.from_linear instead")
        layout = state_dict.get(prefix + "layout")
        if not isinstance(layout, torch.Tensor) or layout.dtype != torch.int64 or tuple(layout.shape) != (4,):
            return (f"expected '{prefix}layout' int64 [4] (version, N, K, group_size) as W4A16Linear saves it, "
                    f"got {_desc(layout) if layout is not None else 'none'}")
        version, n, k, group_size = layout.tolist()
        if version != LAYOUT_VERSION:
            return f"expected layout version {LAYOUT_VERSION}, got {version} (saved by another W4A16Linear format)"
        if (n, k, group_size) != (self.out_features, self.in_features, self.group_size):
            return f"expected a state_dict of {me}, got one of N={n}, K={k}, group_size={group_size}"
        for name, has, what in (("zeros", not self.symmetric, "asymmetric (packed zero points)"),
                                ("perm", self.act_order, "act-order (a channel permutation)"),
                                ("bias", self.bias is not None, "with a bias")):
            if (prefix + name in state_dict) != has:
                held = "holds" if prefix + name in state_dict else "lacks"
                return (f"the state_dict {held} '{name}' but this module is {'' if has else 'not '}{what}: build "
                        f"the module with the same layout (W4A16Linear.empty(..., symmetric=, act_order=, bias=))")
        for name in ("qweight", "scales", "zeros", "perm", "bias"):
            mine = getattr(self, name)
            theirs = state_dict.get(prefix + name)
            if mine is None:
                continue
            if not isinstance(theirs, torch.Tensor) or theirs.dtype != mine.dtype or theirs.shape != mine.shape:
                return (f"expected '{name}' {_desc(mine)} (loading never converts a dtype: a scale rounded to "
                        f"another dtype is another weight), got {_desc(theirs)}")
        return None

    def _refresh(self) -> None:
        """After the buffers were written: rebuild the dense cache from them, and on a GPU wait for
        the writes (the skinny kernel starts reading weights before the previous kernel ends)."""
        if self.dense is not None:
            without = PreparedWeight(self.qweight, self.scales, self.zeros, self.group_size, self.out_features,
                                     self.perm)
            with torch.no_grad():
                self.dense.copy_(dequantize_dense(without.canonical(), self.scales.dtype))
        if self.qweight.device.type == "cuda":
            torch.cuda.synchronize(self.qweight.device)

    def _apply(self, fn, recurse: bool = True):
        dtype = self.scales.dtype
        out = super()._apply(fn, recurse)
        if self.scales.dtype != dtype and self.scales.dtype in ACTIVATION_DTYPES:
            self._refresh()  # a cast dense cache would be rounded twice
        elif self.qweight.device.type == "cuda":
            torch.cuda.synchronize(self.qweight.device)
        return out


def check_quantizable(in_features: int, group_size: int) -> None:
    """Raise ContractError unless a Linear with `in_features` inputs fits the kernels at `group_size`."""
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise ContractError(f"group_size must be one of {GROUP_SIZES} for the kernels, got {group_size!r}")
    if not isinstance(in_features, int) or in_features < 8 or in_features % 8:
        raise ContractError(f"in_features (K) must be a positive multiple of 8 (packed int32 words along K), "
                            f"got {in_features!r}")
    if group_size != -1 and in_features % group_size:
        raise ContractError(f"in_features (K) must be a multiple of group_size, got K={in_features}, "
                            f"group_size={group_size}")
