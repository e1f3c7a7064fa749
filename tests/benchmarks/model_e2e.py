"""End to end on one GPU: a Llama-3.1-8B-architecture model (random bf16 weights) decoding at batch
1, 8 and 32, and a 2048-token prefill, for bf16, our W4A16 (the hybrid op, with and without its
dense prefill cache), torch's tinygemm int4 kernel on the same W4 weights, and torchao's int4
weight-only when it is importable.

    python3 -m tests.benchmarks.model_e2e --out DIR          # GPU: DIR/model_e2e.json, ~5 minutes
    python3 -m oracle report DIR/model_e2e.json [bench.json] --out DIR/report
    python3 -m tests.benchmarks.model_e2e --smoke --out DIR  # anywhere: a tiny config, eager, same pipeline

transformers must be importable (`pip install 'w4a16-oracle[model]'`; offline, its wheels in .whl/
and `bash tools/gpu_checklist.sh model`, which installs them under $OUT/site).

How it measures (DESIGN.md section 5, for a whole model):
* The model: transformers' LlamaForCausalLM from the Llama-3.1-8B config, random bf16 weights, built
  on the GPU. W4: every Linear but lm_head quantized on the GPU by `optimized.quantize_model`
  (oracle RTN, G=128, asymmetric); tinygemm is packed from those same W4 weights.
* Decode: `StaticLlama` (static KV cache of DECODE_LEN positions) with one CUDA graph per step
  (greedy next token and position update inside it); STEPS replays back to back per round, the
  per-step time is round time / STEPS, median over ROUNDS rounds; tokens/s = batch / step time.
* Prefill: one graph of a PREFILL-token forward (logits of the last position only, as generate
  computes them), median of ROUNDS replays.
* Floor: the weight bytes one decode step reads (each Linear in the form its implementation reads
  at that batch, the norms and lm_head; the embedding's few rows left out) / the HBM bandwidth
  measured in the run (tests/benchmarks/timing.py).
* Correctness first: each quantized provider's logits for the first decoded token after a 40-token
  prompt are judged against the dense twins as tests/support/model_check.py derives it (every W4
  layer by oracle.judge on what it was fed, in the prompt's prefill and in the step, so both the
  large-M and the decode implementations are judged; ||Lq - L*|| <= 6 ||Ld - L*||). L* comes from a float32
  twin here (float64 would need 64 GB; float32's own rounding is 2^15 below bf16's). A provider of
  ours that fails is not timed; torchao, which quantizes with its own algorithm, is timed and its
  verdict recorded.
The exit code is 1 when a provider failed its check or raised.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

LLAMA_31_8B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
# The same architecture at toy size, for --smoke (and the CPU test of this command).
TINY = {**LLAMA_31_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
        "rope_parameters": {**LLAMA_31_8B["rope_parameters"], "original_max_position_embeddings": 64}}
PROVIDERS = ("bf16", "w4a16", "w4a16-dense", "tinygemm", "torchao")
GROUP_SIZE = 128
# Tokens before the judged decode step: at least dense_min_m (32 on every device's policy), so the
# prompt's prefill runs each provider's large-M path (Triton, the dense cache) and the step the
# decode path (skinny), and both are judged layer by layer.
CHECK_PROMPT = 40
CHECK_LEN = 48             # its cache: a multiple of 16, as the memory-efficient attention kernel's mask wants
DEFAULT_BUDGET_S = 330.0   # no provider starts after this; the JSON is written either way
TRANSFORMERS_MISSING = (
    "model_e2e needs transformers: pip install 'w4a16-oracle[model]'. Offline (the GPU image), put its wheels "
    "in .whl/ (transformers, huggingface_hub, and those of their dependencies the image lacks; "
    "docs/model.md lists them) and run `bash tools/gpu_checklist.sh model`, which installs .whl/*.whl under "
    "$OUT/site. ({error})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m tests.benchmarks.model_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for model_e2e.json")
    p.add_argument("--providers", default=",".join(PROVIDERS), help=f"comma-separated of {list(PROVIDERS)}")
    p.add_argument("--smoke", action="store_true", help="tiny config, eager (no CUDA graphs): checks the pipeline")
    p.add_argument("--batches", default=None, help="decode batch sizes (default 1,8,32; smoke 1,2)")
    p.add_argument("--prefill", type=int, default=None, help="prefill tokens (default 2048; smoke 16)")
    p.add_argument("--steps", type=int, default=None, help="decode steps a round (default 32; smoke 2)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds / replays (default 5; smoke 1)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"start no provider after this many seconds (default {DEFAULT_BUDGET_S:.0f}; 0: no limit)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.providers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown or not names:
        p.error(f"--providers {args.providers!r}: unknown {unknown}, choose from {list(PROVIDERS)}")
    args.providers = names
    smoke = args.smoke
    args.batches = [int(b) for b in (args.batches or ("1,2" if smoke else "1,8,32")).split(",")]
    args.prefill = args.prefill or (16 if smoke else 2048)
    args.steps = args.steps or (2 if smoke else 32)
    args.rounds = args.rounds or (1 if smoke else 5)
    args.decode_len = max(64 if smoke else 256, CHECK_PROMPT + 2 + args.steps)
    return args


def require_transformers():
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401
    except ImportError as e:
        raise SystemExit(TRANSFORMERS_MISSING.format(error=e)) from None
    return transformers


# ----------------------------------------------------------------------------------------------
# models


def build_base(config: dict, device: torch.device) -> nn.Module:
    """LlamaForCausalLM with transformers' random initialization, built in bf16 on `device`."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config), dtype=torch.bfloat16)
    return model.eval()


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every tensor with `model` (replacing a module in the
    copy leaves `model` as it is)."""
    return copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())})


def linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)


class CanonicalWeights(Mapping):
    """{layer name: its canonical weight}, unpacked from the W4 model when asked (all of them at once
    would take a byte per weight)."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        self.model, self.names = model, names

    def __getitem__(self, name: str):
        return self.model.get_submodule(name).canonical()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


class TinygemmLinear(nn.Module):
    """torch's int4 tinygemm kernel (aten._weight_int4pack_mm; CUDA, bf16) on a canonical W4 weight,
    packed as the per-layer benchmark's "tinygemm" provider packs it (oracle.peers.tinygemm_weight):
    W = (q - 8) * s + zero with a bf16 float zero, two roundings."""

    def __init__(self, w, bias: torch.Tensor | None) -> None:
        from oracle.peers import tinygemm_weight

        super().__init__()
        packed, scales_and_zeros = tinygemm_weight(w)
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.in_features, self.out_features, self.group = w.k, w.n, w.group
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, self.in_features), self.packed, self.group,
                                               self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor, through the inner tensors of a wrapper subclass (torchao's)."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def step_bytes(model: nn.Module, m: int) -> int:
    """Weight bytes a forward of m rows reads: every module's own tensors, a W4A16Linear's in the
    form the dispatcher runs at m (its dense cache only where it takes the dense GEMM), the
    embedding's full table left out (a step reads m rows of it)."""
    from optimized import W4A16Linear, choose

    total = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            continue
        if isinstance(module, W4A16Linear):
            dense = choose(m, module.prepared).name == "dense"
            tensors = [module.dense] if dense else [module.qweight, module.scales, module.zeros, module.perm]
            tensors.append(module.bias)
        else:
            tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        total += sum(tensor_bytes(t) for t in tensors if t is not None)
    return total


# ----------------------------------------------------------------------------------------------
# correctness


def check_logits(model: nn.Module, prompt: torch.Tensor, names: list[str] | None = None):
    """The logits [1, vocab] of the decode step after `prompt` ([1, CHECK_PROMPT + 1]: the prompt and
    the token decoded next), float; with names, also what those layers saw and returned in the
    prompt's prefill and in that step."""
    from contextlib import nullcontext

    from tests.support.model_check import record_io

    from .static_llama import StaticLlama

    engine = StaticLlama(model, 1, CHECK_LEN)
    pos = torch.tensor([CHECK_PROMPT], device=prompt.device)
    with record_io(model, names) if names else nullcontext() as records:
        engine.prefill(prompt[:, :CHECK_PROMPT])
        logits = engine.decode(prompt[:, CHECK_PROMPT:], pos).float()
    return logits, records


def judge_provider(model: nn.Module, prompt: torch.Tensor, refs: dict, weights: Mapping | None,
                   roundings: int) -> tuple[bool, str]:
    """(passed, summary): the per-layer verdicts (when `weights` says what each layer holds) and the
    logits verdict against the twins' logits in `refs`."""
    from tests.support.model_check import judge_layers, judge_logits

    names = list(weights) if weights is not None else None
    logits, records = check_logits(model, prompt, names)
    lines, passed = [], True
    if records is not None:
        verdicts = judge_layers(records, weights, {}, roundings=roundings)
        bad = [name for name, v in verdicts.items() if not v.passed]
        worst = max(verdicts.items(), key=lambda item: item[1].worst_ratio)
        lines.append(f"layers: {len(verdicts) - len(bad)} of {len(verdicts)} within the oracle's bound, worst "
                     f"error/bound {worst[1].worst_ratio:.3g} ({worst[0]})")
        lines += [f"  {name}: {verdicts[name].summary()}" for name in bad[:5]]
        passed = not bad
    v = judge_logits(logits, refs["dense"], refs["exact"])
    lines.append(f"logits: {v.summary()}")
    return passed and v.passed, "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decode(model: nn.Module, batch: int, args, device: torch.device) -> float:
    """Seconds per decode step at `batch` (median over rounds of STEPS back-to-back steps)."""
    from .static_llama import DecodeGraph, StaticLlama

    engine = StaticLlama(model, batch, args.decode_len)
    start = args.decode_len - args.steps
    times = []
    if device.type == "cuda":
        graph = DecodeGraph(engine)
        for _ in range(args.rounds + 1):  # the first round pays for the graph upload
            graph.pos.fill_(start)
            graph.ids.random_(0, model.config.vocab_size)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(args.steps):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) * 1e-3 / args.steps)
        del graph
    else:
        ids = torch.zeros(batch, 1, dtype=torch.long)
        for _ in range(args.rounds + 1):
            begin = time.perf_counter()
            for step in range(args.steps):
                ids = engine.decode(ids, torch.tensor([start + step])).argmax(-1, keepdim=True)
            times.append((time.perf_counter() - begin) / args.steps)
    del engine
    return statistics.median(times[1:])


def time_prefill(model: nn.Module, args, device: torch.device) -> float:
    """Seconds of one PREFILL-token prefill at batch 1 (median of ROUNDS replays)."""
    from .static_llama import PrefillGraph, StaticLlama

    engine = StaticLlama(model, 1, args.prefill)
    times = []
    if device.type == "cuda":
        graph = PrefillGraph(engine, args.prefill)
        for _ in range(args.rounds + 1):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) * 1e-3)
        del graph
    else:
        ids = torch.randint(0, model.config.vocab_size, (1, args.prefill), generator=torch.Generator().manual_seed(0))
        for _ in range(args.rounds + 1):
            begin = time.perf_counter()
            engine.prefill(ids)
            times.append(time.perf_counter() - begin)
    del engine
    return statistics.median(times[1:])


def chosen(model: nn.Module, m: int) -> dict | None:
    """{projection: implementation} of the first block's W4A16Linear layers at m rows."""
    from optimized import W4A16Linear, choose

    out = {}
    for name, module in model.model.layers[0].named_modules():
        if isinstance(module, W4A16Linear):
            out[name.rpartition(".")[2]] = choose(m, module.prepared).name
    return out or None


# ----------------------------------------------------------------------------------------------
# the run


class Run:
    def __init__(self, args) -> None:
        self.args = args
        self.start = time.perf_counter()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.config = TINY if args.smoke else LLAMA_31_8B
        self.model_name = "llama3.1-8b" + ("-tiny" if args.smoke else "")
        self.rows: list[dict] = []
        self.checks: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.failed: list[str] = []
        self.roofline = None

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f} s] {text}", flush=True)

    def over_budget(self) -> bool:
        budget = self.args.budget_s
        return bool(budget) and time.perf_counter() - self.start > budget

    def record(self, provider: str, model: nn.Module, check: str | None) -> None:
        """Time every workload of `provider` and append its rows."""
        args, device = self.args, self.device
        for batch in args.batches:
            seconds = time_decode(model, batch, args, device)
            self.add_row(provider, "decode", batch, seconds, batch / seconds, model, check)
            self.log(f"{provider} decode batch {batch}: {seconds * 1e3:.3f} ms a step, {batch / seconds:,.1f} tokens/s")
        seconds = time_prefill(model, args, device)
        self.add_row(provider, "prefill", args.prefill, seconds, args.prefill / seconds, model, check)
        self.log(f"{provider} prefill {args.prefill}: {seconds * 1e3:.2f} ms, {args.prefill / seconds:,.0f} tokens/s")
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def add_row(self, provider: str, workload: str, m: int, seconds: float, tokens_per_s: float, model: nn.Module,
                check: str | None) -> None:
        info = {"kind": "model", "model": self.model_name, "workload": workload, "m": m, "dtype": "bf16",
                "sym": "asym", "provider": provider, "median_us": seconds * 1e6, "tokens_per_s": tokens_per_s,
                "steps": self.args.steps if workload == "decode" else None, "check": check,
                "hybrid_impl": chosen(model, m)}
        if workload == "decode":
            nbytes = step_bytes(model, m)
            info["weight_bytes"] = nbytes
            if self.roofline is not None:
                floor = nbytes / self.roofline.bytes_per_s
                info.update(floor_us=floor * 1e6, pct_of_floor=100 * floor / seconds)
        self.rows.append({"name": f"model_e2e[{self.model_name}-{workload}-M{m}-{provider}]",
                          "extra_info": info, "stats": {"median": seconds}})

    def guarded(self, provider: str, fn) -> None:
        """Run one provider's part: skipped past the budget, its exception recorded (and the run failed)."""
        if provider not in self.args.providers:
            return
        if self.over_budget():
            self.skipped[provider] = f"time budget of {self.args.budget_s:.0f} s spent (--budget-s)"
            self.log(f"{provider}: skipped, {self.skipped[provider]}")
            return
        try:
            fn()
        except Exception as e:  # one provider's failure must not lose the others' numbers
            self.failed.append(provider)
            self.checks.setdefault(provider, f"raised {type(e).__name__}: {e}")
            self.log(f"{provider}: raised\n{traceback.format_exc()}")

    def main(self) -> int:
        args, device = self.args, self.device
        transformers = require_transformers()
        from optimized import W4A16Linear, quantize_model, skinny
        from tests.support.model_check import dense_twin

        from .measure import Roofline

        if device.type == "cuda" and not args.smoke:
            self.roofline = Roofline.measure()
            self.log(f"HBM {self.roofline.bytes_per_s / 1e12:.2f} TB/s, dense bf16 "
                     f"{self.roofline.dense_flops / 1e12:.0f} TFLOP/s")
            torch.cuda.empty_cache()
        if device.type == "cuda":
            began = time.perf_counter()
            ok, why = skinny.is_available()  # builds the extension once, before any timing
            self.log(f"skinny kernel: {'available' if ok else why} ({time.perf_counter() - began:.0f} s)")
        base = build_base(self.config, device)
        names = linear_names(base)
        self.log(f"built {self.model_name}: {sum(p.numel() for p in base.parameters()) / 1e9:.2f} B parameters, "
                 f"{len(names)} Linear layers to quantize")
        self.guarded("bf16", lambda: self.record("bf16", base, None))
        if not set(args.providers) - {"bf16"}:
            self.write(transformers)
            return 1 if self.failed else 0

        # The W4 weights every quantized provider uses; `base` becomes the dense twin.
        w4 = shared_copy(base)
        quantize_model(w4, GROUP_SIZE, symmetric=False)
        if device.type != "cuda":
            for module in w4.modules():
                if isinstance(module, W4A16Linear):
                    module.impl = "torch"  # the interpreter would take minutes here
        weights = CanonicalWeights(w4, names)
        with torch.no_grad():
            for name in names:
                w = weights[name]
                base.get_submodule(name).weight.copy_(w.dequantize(torch.float32).to(torch.bfloat16))
        prompt = torch.randint(0, self.config["vocab_size"], (1, CHECK_PROMPT + 1), device=device,
                               generator=torch.Generator(device).manual_seed(1))
        refs = {"dense": check_logits(base, prompt)[0]}
        matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference is float32, not TF32
        exact = dense_twin(w4, weights, {}, torch.float32, share=False)
        refs["exact"] = check_logits(exact, prompt)[0]
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        del exact
        if device.type == "cuda":
            torch.cuda.empty_cache()
        self.log("twins' reference logits computed")

        def ours(provider: str, model: nn.Module, w, roundings: int, gate: bool = True) -> None:
            passed, summary = judge_provider(model, prompt, refs, w, roundings)
            self.checks[provider] = ("PASS" if passed else "FAIL") + "\n" + summary
            self.log(f"{provider} check: {'PASS' if passed else 'FAIL'}\n{summary}")
            if not passed and gate:
                self.failed.append(provider)
                return
            self.record(provider, model, summary.splitlines()[-1])

        self.guarded("w4a16", lambda: ours("w4a16", w4, weights, 1))

        def with_dense_cache() -> None:
            model = shared_copy(w4)
            for name in names:
                module = w4.get_submodule(name)
                replace(model, name, W4A16Linear.from_weight(weights[name], torch.bfloat16, module.bias,
                                                             dense_cache=True, impl=module.impl))
            ours("w4a16-dense", model, weights, 1)

        self.guarded("w4a16-dense", with_dense_cache)

        def tinygemm() -> None:
            if device.type != "cuda":
                self.skipped["tinygemm"] = "aten._weight_int4pack_mm runs on CUDA only"
                return
            model = shared_copy(w4)
            for name in names:
                replace(model, name, TinygemmLinear(weights[name], w4.get_submodule(name).bias))
            ours("tinygemm", model, weights, 2)

        self.guarded("tinygemm", tinygemm)

        def torchao() -> None:
            if importlib.util.find_spec("torchao") is None:
                self.skipped["torchao"] = "torchao is not installed"
                return
            if device.type != "cuda":
                self.skipped["torchao"] = "torchao's int4 tinygemm layout runs on CUDA only"
                return
            model, how = torchao_model(base)
            self.log(f"torchao: {how}")
            ours("torchao", model, None, 2, gate=False)

        self.guarded("torchao", torchao)
        for provider, why in self.skipped.items():
            self.log(f"{provider}: skipped, {why}")
        self.write(transformers)
        return 1 if self.failed else 0

    def write(self, transformers) -> None:
        from .conftest import commit

        env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
               "transformers": transformers.__version__}
        if importlib.util.find_spec("triton") is not None:
            import triton

            env["triton"] = triton.__version__
        if self.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name()
        if "torchao" in sys.modules:
            env["torchao"] = getattr(sys.modules["torchao"], "__version__", "unknown")
        if self.roofline is not None:
            env["roofline"] = self.roofline.as_dict()
        env.update(command=" ".join(["python3", "-m", "tests.benchmarks.model_e2e", *sys.argv[1:]])
                   if __name__ == "__main__" else "tests.benchmarks.model_e2e.main", commit=commit())
        self.args.out.mkdir(parents=True, exist_ok=True)
        path = self.args.out / "model_e2e.json"
        path.write_text(json.dumps({"machine_info": {"w4a16": env}, "benchmarks": self.rows, "checks": self.checks,
                                    "skipped": self.skipped, "failed": self.failed}, indent=1))
        self.log(f"wrote {path} ({len(self.rows)} rows)")


def torchao_model(dense: nn.Module) -> tuple[nn.Module, str]:
    """A copy of `dense` with its Linears (lm_head excepted) in torchao's int4 weight-only tinygemm
    layout, G=128, whichever of its configuration APIs this torchao version has."""
    import torchao
    from torchao.quantization import quantize_

    try:
        from torchao.quantization import Int4WeightOnlyConfig
    except ImportError:
        from torchao.quantization import int4_weight_only

        config, how = int4_weight_only(group_size=GROUP_SIZE), "int4_weight_only"
    else:
        try:
            config, how = Int4WeightOnlyConfig(group_size=GROUP_SIZE, int4_packing_format="tile_packed_to_4d"), \
                "Int4WeightOnlyConfig(int4_packing_format='tile_packed_to_4d')"
        except TypeError:
            config, how = Int4WeightOnlyConfig(group_size=GROUP_SIZE), "Int4WeightOnlyConfig()"
    model = copy.deepcopy(dense)
    quantize_(model, config, filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and fqn != "lm_head")
    return model, f"torchao {torchao.__version__}, {how}, G={GROUP_SIZE}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("model_e2e times on a GPU; without one, run it with --smoke (a tiny config, eager)")
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
