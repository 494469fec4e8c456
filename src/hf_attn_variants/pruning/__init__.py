"""Head-importance pruning (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?").

For this package's multi-head families (``entropy_invariant``, ``synthesizer``) and for stock
Transformers v5 models — BERT/RoBERTa-style encoders and Llama/Qwen2/Mistral-style decoders with
grouped-query attention — which lost ``head_mask``/``prune_heads``/``config.pruned_heads`` in v5.

- ``compute_head_importance(model, dataloader)`` — Iₕ = Σₓ |∂L(x)/∂ξₕ| per head.
- ``head_mask(model, mask)`` — context manager gating each head's output.
- ``prune_heads(model, {layer: [heads]})`` — physical removal, recorded in ``config.pruned_heads``.
- ``load_pruned(path, **kwargs)`` — reload any pruned checkpoint (stock or ours).
- ``iterative_head_pruning(model, data, metric)`` — the paper's score → prune → evaluate loop
  (``uniform=True``: the same number of heads from every layer, Torch-Pruning's uniform mode).
- ``restate_uniform_heads(model)`` — a model with k heads in every layer gets a plain config
  (``num_attention_heads=k``, ``head_dim``), loadable and servable like an unpruned one.

GAU models have one attention unit per layer and raise ``NoAttentionHeadsError`` (a ``ValueError``).
See docs/pruning.md.
"""

from __future__ import annotations

from .adapters import HeadAdapter, NoAttentionHeadsError, get_adapter
from .importance import compute_head_importance, normalize_importance
from .iterative import PruningStep, iterative_head_pruning, read_curve, write_curve
from .masking import head_mask
from .prune import count_heads, load_pruned, prune_heads, restate_uniform_heads

__all__ = [
    "HeadAdapter",
    "NoAttentionHeadsError",
    "PruningStep",
    "compute_head_importance",
    "count_heads",
    "get_adapter",
    "head_mask",
    "iterative_head_pruning",
    "load_pruned",
    "normalize_importance",
    "prune_heads",
    "read_curve",
    "restate_uniform_heads",
    "write_curve",
]
