"""The ExLlama shuffle: int32 [N, K/8], packed along K with the AWQ nibble interleave.

Unpacking nibble p means shifting word right by [0, 16, 4, 20, 8, 24, 12, 28][e] for element e
of the 8-group, which lets a kernel convert two nibbles at once with one 16-bit shift apart.
"""

from __future__ import annotations

import torch

from . import nibbles
from .common import require_multiple

NAME = "ExLlama shuffle"


def pack_exllama(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] values 0..15 -> int32 [N, K/8]."""
    require_multiple(q.shape[-1], 8, "K", NAME)
    return nibbles.pack(q, 1, nibbles.AWQ_ORDER)


def unpack_exllama(words: torch.Tensor) -> torch.Tensor:
    """int32 [N, K/8] -> uint8 [N, K]."""
    return nibbles.unpack(words, 1, nibbles.AWQ_ORDER)
