"""The peers ``make bench`` times our GAU against: lucidrains' FLASH-pytorch 0.1.9 (``pip install
flash-pytorch``, in the lock with einops and rotary-embedding-torch).

Each peer is wrapped as a bare backbone like ours (token ids in, ``last_hidden_state`` out, no vocabulary
projection): its token embedding, scaled sinusoidal positions, its layers and the LayerNorm of its output
head. Shapes follow the preset (width d, ``gau_layers`` layers, key size s, e = 2d, chunk g); token shift is
off, as in our units. The peer keeps its own conventions — scale-norm, a T5 relative-position bias, partial
rotary embeddings on 32 dimensions, relu² scores divided by the chunk (FLASH) or the padded length (its
quadratic ``GAU``); how they map onto ours is tested in ``tests/test_peers.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

INSTALL = ("flash-pytorch is not installed: `make install` (locks/requirements.txt has it, with einops and "
           "rotary-embedding-torch, installed --no-deps)")


def _flash_pytorch() -> Any:
    """The ``flash_pytorch.flash_pytorch`` module; ``ModuleNotFoundError`` naming the install command."""
    try:
        from flash_pytorch import flash_pytorch
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(INSTALL) from error
    return flash_pytorch


class PeerBackbone(nn.Module):
    """A peer's embedding, layers and output norm as a bare backbone: ``forward(input_ids)`` →
    ``last_hidden_state``."""

    def __init__(self, embedding: nn.Embedding, positions: nn.Module, layers: nn.ModuleList,
                 norm: nn.Module) -> None:
        super().__init__()
        self.embedding, self.positions, self.layers, self.norm = embedding, positions, layers, norm

    def forward(self, input_ids: torch.Tensor, **_: Any) -> BaseModelOutput:
        hidden = self.embedding(input_ids)
        hidden = hidden + self.positions(hidden).to(hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden)
        return BaseModelOutput(last_hidden_state=self.norm(hidden))


def keep_positions_float32(backbone: PeerBackbone) -> None:
    """Put ``backbone``'s absolute position table back in float32 after a cast of the whole model.

    FLASH-pytorch's ``ScaledSinuEmbedding`` builds its positions as ``arange(n)`` in its ``inv_freq``'s
    dtype, so a model cast with ``.to(torch.bfloat16)`` rounds every position above 256 (bf16 keeps 8
    significant bits: 4,097 becomes 4,096). Under autocast, as its author trains it, the buffer stays
    float32; this restores that. Its rotary embedding builds positions in the activations' dtype whatever
    the cast, under autocast too, so that rounding is the peer's own and stays. ``forward`` adds the table
    in the activations' dtype.
    """
    backbone.positions.float()


def flash_pytorch_model(p: Any, length: int, *, causal: bool) -> nn.Module:
    """FLASH-pytorch's ``FLASHTransformer`` (FLASH layers, scale-norm, chunks of ``gau_chunk_size``) at the
    preset's shapes, token shift off, without its vocabulary projection."""
    peer = _flash_pytorch().FLASHTransformer(
        dim=p.hidden_size, num_tokens=p.vocab_size, depth=p.gau_layers or p.num_layers,
        group_size=p.gau_chunk_size,
        query_key_dim=p.gau_key_size, expansion_factor=2.0, causal=causal, shift_tokens=False,
    )
    return PeerBackbone(peer.token_emb, peer.abs_pos_emb, peer.layers, peer.to_logits[0])


def flash_pytorch_lm(*, dim: int, vocab_size: int, depth: int, group_size: int, query_key_dim: int,
                     causal: bool = True) -> tuple[PeerBackbone, nn.Linear]:
    """FLASH-pytorch's ``FLASHTransformer`` as a causal LM split at its logits: (the backbone up to the
    LayerNorm of its output head, its vocabulary projection ``to_logits[1]``, a ``Linear`` with bias), token
    shift off; expansion factor 2 (``bench/side_by_side.py``)."""
    peer = _flash_pytorch().FLASHTransformer(
        dim=dim, num_tokens=vocab_size, depth=depth, group_size=group_size, query_key_dim=query_key_dim,
        expansion_factor=2.0, causal=causal, shift_tokens=False,
    )
    return PeerBackbone(peer.token_emb, peer.abs_pos_emb, peer.layers, peer.to_logits[0]), peer.to_logits[1]


def gau_pytorch_model(p: Any, length: int, *, causal: bool) -> nn.Module:
    """FLASH-pytorch's quadratic ``GAU`` layers (LayerNorm, T5 bias, relu²(q·k / n)) at the preset's shapes,
    with the ``FLASHTransformer``'s embedding and output norm around them."""
    module = _flash_pytorch()
    layers = nn.ModuleList(
        module.GAU(dim=p.hidden_size, query_key_dim=p.gau_key_size, expansion_factor=2.0, causal=causal)
        for _ in range(p.gau_layers or p.num_layers)
    )
    return PeerBackbone(nn.Embedding(p.vocab_size, p.hidden_size), module.ScaledSinuEmbedding(p.hidden_size),
                        layers,
                        nn.LayerNorm(p.hidden_size))


__all__ = ["INSTALL", "PeerBackbone", "flash_pytorch_lm", "flash_pytorch_model", "gau_pytorch_model",
           "keep_positions_float32"]
