"""Real model linear-layer shapes and the batch sizes the parity matrix runs them at.

Each layer is (K, N): x is [M, K], W is [N, K]. Fused projections (qkv, gate_up) appear as the
single matmul inference engines run. Group size 128 is what these models ship with in AWQ/GPTQ.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearShape:
    model: str
    layer: str
    k: int
    n: int
    group_size: int = 128

    @property
    def id(self) -> str:
        return f"{self.model}.{self.layer}-K{self.k}xN{self.n}"


def _model(name: str, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> list[LinearShape]:
    q, kv = heads * head_dim, kv_heads * head_dim
    return [
        LinearShape(name, "qkv", hidden, q + 2 * kv),
        LinearShape(name, "o", q, hidden),
        LinearShape(name, "gate_up", hidden, 2 * intermediate),
        LinearShape(name, "down", intermediate, hidden),
    ]


MODEL_SHAPES: list[LinearShape] = [
    *_model("llama3.1-8b", 4096, 14336, 32, 8, 128),
    *_model("llama3.3-70b", 8192, 28672, 64, 8, 128),
    *_model("mistral-7b", 4096, 14336, 32, 8, 128),
    *_model("qwen2.5-7b", 3584, 18944, 28, 4, 128),
    *_model("qwen3-4b", 2560, 9728, 32, 8, 128),
    *_model("qwen3-8b", 4096, 12288, 32, 8, 128),
    *_model("smollm2-1.7b", 2048, 8192, 32, 32, 64),
    *_model("gemma-2b", 2048, 16384, 8, 1, 256),
]

BOUNDARY_SHAPES: list[LinearShape] = [
    LinearShape("boundary", "n8", 4096, 8),
    LinearShape("boundary", "k_eq_g", 128, 4096),
    # K * M crosses 32768 at M = 4: kernels that switch strategy on K * M must be right on both sides.
    LinearShape("boundary", "km_8192", 8192, 1024),
    LinearShape("boundary", "km_9728", 9728, 1024),
    LinearShape("boundary", "km_9856", 9856, 1024),
    LinearShape("boundary", "k38912", 38912, 1024),
    LinearShape("boundary", "k49152", 49152, 1024),
    # N a multiple of 64 but not of 128: the 64-wide remainder of 128-wide tiles.
    LinearShape("boundary", "n_4160", 4096, 4160),
]

DECODE_BATCHES = (1, 2, 3, 4, 5, 6, 8, 16)
PREFILL_BATCHES = (17, 32, 33, 64, 128, 129, 256, 1024, 2048, 4096)


def unique_shapes() -> list[LinearShape]:
    """Model and boundary shapes with duplicate (K, N, G) dropped (Mistral-7B repeats Llama-3.1-8B)."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for s in MODEL_SHAPES + BOUNDARY_SHAPES:
        key = (s.k, s.n, s.group_size)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out
