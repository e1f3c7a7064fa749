"""A Llama forward with a static KV cache over a transformers Llama model's own modules, for the
end-to-end benchmark (tests/benchmarks/model_e2e.py).

Why not transformers' own generate(): its eager forward builds masks and cache bookkeeping with
host-side decisions that cannot be captured in a CUDA graph, and its compiled path recompiles
for every batch size (minutes per shape for 32 layers). This forward is the gpt-fast recipe:
every tensor has a fixed shape, positions live on the device, and a decode step is one CUDA
graph. It calls the model's own embedding, norms, projections (nn.Linear, W4A16Linear or any
peer's module), MLP and lm_head, so what is timed is the model's layers; only attention and
the cache are written here. tests/benchmarks/test_model_e2e.py checks it against the model's
own forward.

    engine = StaticLlama(model, batch=8, max_len=256)
    logits = engine.prefill(ids)                  # ids int64 [B, T], positions 0..T-1
    logits = engine.decode(next_ids, pos)         # next_ids int64 [B, 1], pos int64 [1] on the device
"""

from __future__ import annotations

import torch
from torch import nn


class StaticLlama:
    """Prefill and decode over `model` (a transformers LlamaForCausalLM) with a KV cache of
    `max_len` positions for `batch` sequences, in the dtype and on the device of its embedding.

    Cache: per layer k, v of dtype [batch, kv heads, max_len, head_dim]. Decode attends over the
    whole cache under a mask of the positions written so far (its cost is that of a max_len
    context, as in gpt-fast); prefill attends causally over the new tokens only, so it must start
    at position 0.
    """

    def __init__(self, model: nn.Module, batch: int, max_len: int) -> None:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

        self._rotate, self._repeat_kv = apply_rotary_pos_emb, repeat_kv
        cfg = model.config
        self.model, self.inner = model, model.model
        embed = self.inner.embed_tokens.weight
        self.dtype, self.device = embed.dtype, embed.device
        self.batch, self.max_len = batch, max_len
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (batch, self.n_kv, max_len, self.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.inner.layers]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.inner.layers]
        positions = torch.arange(max_len, device=self.device)
        # The model's own rotary table (llama3 scaling included), one row per position.
        cos, sin = self.inner.rotary_emb(embed[:1], positions[None])
        self.cos, self.sin = cos[0], sin[0]
        self.mask = torch.ones(max_len, max_len, dtype=torch.bool, device=self.device).tril()

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: int64 [batch, T] at positions 0..T-1 (T <= max_len). Returns the last position's
        logits [batch, vocab] in the model's dtype, and leaves the cache filled for decode."""
        pos = torch.arange(ids.shape[1], device=self.device)
        return self._forward(ids, pos, prefill=True)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids: int64 [batch, 1], the token at position pos; pos: int64 [1] on the device (read on
        the device, so a captured step can advance it). Returns logits [batch, vocab]."""
        return self._forward(ids, pos, prefill=False)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, prefill: bool) -> torch.Tensor:
        b, t = ids.shape
        h = self.inner.embed_tokens(ids)
        cos, sin = self.cos[pos][None], self.sin[pos][None]
        for i, layer in enumerate(self.inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, k, cos, sin)
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v)
            o = self._prefill_attention(q, k, v, attn.scaling) if prefill else \
                self._decode_attention(q, i, pos, attn.scaling)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.inner.norm(h[:, -1:])
        return self.model.lm_head(h)[:, 0]

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Causal over the new tokens; kv heads repeated so that the flash kernel takes it."""
        groups = self.n_heads // self.n_kv
        k, v = self._repeat_kv(k, groups), self._repeat_kv(v, groups)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def _decode_attention(self, q: torch.Tensor, layer: int, pos: torch.Tensor, scale: float) -> torch.Tensor:
        """One new token over the cache: the query heads sharing a kv head become rows of one
        [n_rep, head_dim] query (query head h reads kv head h // n_rep, as repeat_kv has it), so
        the cache is read once, not repeated."""
        b = q.shape[0]
        groups = self.n_heads // self.n_kv
        qg = q.reshape(b, self.n_kv, groups, self.head_dim)
        mask = self.mask[pos][None, None]  # [1, 1, 1, max_len]: positions 0..pos
        o = torch.nn.functional.scaled_dot_product_attention(qg, self.k[layer], self.v[layer], attn_mask=mask,
                                                             scale=scale)
        return o.reshape(b, self.n_heads, 1, self.head_dim)


class DecodeGraph:
    """One decode step captured in a CUDA graph: logits for (ids, pos), then ids <- greedy next
    tokens and pos <- pos + 1, so back-to-back replays generate. Set `pos` and `ids` before the
    first replay."""

    def __init__(self, engine: StaticLlama, warmup: int = 2) -> None:
        self.engine = engine
        self.ids = torch.zeros(engine.batch, 1, dtype=torch.long, device=engine.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=engine.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # Triton compilation and kernel loading stay out of the capture
            for _ in range(warmup):
                self.step()
        torch.cuda.current_stream().wait_stream(stream)
        self.pos.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step()

    def step(self) -> torch.Tensor:
        logits = self.engine.decode(self.ids, self.pos)
        self.ids.copy_(logits.argmax(-1, keepdim=True))
        self.pos.add_(1)
        return logits

    def replay(self) -> None:
        self.graph.replay()


class PrefillGraph:
    """A prefill of `tokens` positions for the engine's batch, captured in a CUDA graph."""

    def __init__(self, engine: StaticLlama, tokens: int, warmup: int = 2) -> None:
        self.ids = torch.randint(0, engine.model.config.vocab_size, (engine.batch, tokens), device=engine.device,
                                 generator=torch.Generator(engine.device).manual_seed(0))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                engine.prefill(self.ids)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = engine.prefill(self.ids)

    def replay(self) -> None:
        self.graph.replay()
