#!/usr/bin/env python
"""Per-GPU training-memory *estimates* for GAU-α base and a ~1B entropy-invariant decoder.

Everything here is computed from parameter and activation counts; nothing is measured on a GPU. Parameters are
counted exactly on the meta device (``with torch.device("meta")``); the activation formulas below were derived
from the models' forward code and are checked against a *trace* of what autograd really saves, taken by
running one layer on the meta device under ``torch.autograd.graph.saved_tensors_hooks`` (see ``trace_layer``).

Per GPU, with P_loc the parameters a GPU holds after tensor parallelism (TP) and FSDP sharding::

    P_tp   = P_tp_sharded / tp + P_tp_replicated (what one TP rank owns before FSDP)
    P_loc  = P_tp / fsdp                         (FSDP2 shards everything it wraps; HSDP: fsdp = shard group)
    params = 4 B · P_loc      (fp32 master weights; bf16 compute copies: FSDP2's MixedPrecisionPolicy)
    grads  = 4 B · P_loc      (fp32 sharded gradients, reduce_dtype = fp32)
    AdamW  = 8 B · P_loc      (exp_avg + exp_avg_sq in fp32)
    FSDP2 working buffers ≈ 4 B · P_root,tp + 10 B · P_layer,tp
        (bf16 root/tail unit kept unsharded + its bf16 gradient; two bf16 all-gathered layers, current and
        prefetched; one layer's bf16 gradient and its fp32 reduce-scatter input)

Activations, for micro-batch b and sequence length n (bytes; per-token coefficients in
``*_bytes_per_token``)::

    no checkpointing : L · b·n·(A_repl + A_tp / tp + Q(n))            saved by every layer until its backward
    checkpointing    : L · b·n·2d  +  one layer recomputed in backward  (the bf16 input of each layer)
    other            : b·n·(embedding indices, embedding/final norm, LM-head input, RoPE tables, nᵢ)
    logits + loss    : peak 12 B · b·n_t·V at the start of backward (fp32 log-probabilities saved by
                       log_softmax, their gradient, the fp32 gradient of the logits); n_t = n (CLM) or 0.15·n
                       (this repo's target-only MLM loss). Not divided by TP: the LM head's plan gathers the
                       logits.

Under ``torch.autocast`` with fp32 weights instead (``estimate_autocast``) FSDP2 all-gathers fp32 and
autocast's bf16 weight copies are saved for backward; the per-layer bytes are then traced on CPU
(``trace_layer_autocast``).

Peak per GPU (the start of backward, when every saved activation and the loss buffers are alive)::

    peak (no ckpt) = states + buffers + layers_full + other + logits_peak
    peak (ckpt)    = states + buffers + L·b·n·2d + other + max(logits_peak, one recomputed layer)

Run::

    .venv/bin/python scripts/memory_estimates.py && .venv/bin/python tools/render_docs.py
    .venv/bin/python scripts/memory_estimates.py --seq-lens 2048 8192 32768 --micro-batch 2 --output est.json

The first writes ``docs/results/memory-estimates.json`` (kind ``memory_estimates``), which ``render-docs``
renders into docs/scaling_memory.md and docs/scaling.md (``tools.docs_results.memory_estimates``); the second
writes every component of other settings to a JSON file of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import json
import math
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.loss.loss_utils import ForCausalLMLoss

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
)
from hf_attn_variants.models.layers import visible_key_counts
from hf_attn_variants.models.modeling_common import AttentionGeometry
from hf_attn_variants.models.modeling_gau import gau_attention_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

GiB = 1024**3
GB = 1000**3
FP32, BF16, BOOL, INT64 = 4, 2, 1, 8
MASTER_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8
"""fp32 master weight, fp32 gradient, AdamW's two fp32 moments — per parameter."""
LOSS_PEAK_BYTES = 3 * FP32
"""Per logit at the start of backward: fp32 log-probabilities (saved), their gradient, the fp32 logit
gradient."""
LOSS_SAVED_BYTES = FP32
"""Per logit kept from the end of forward to the loss's backward: the fp32 log-probabilities."""
MLM_TARGET_FRACTION = 0.15
"""The share of positions the MLM head sees (BERT masking at 15 %, ``TargetOnlyMLMLoss``)."""
DEFAULT_BUDGET_GIB = 76.0
"""Memory assumed usable on an 80 GB H100 (79.6 GiB) after CUDA context, NCCL buffers and fragmentation."""

# Sharding styles of Transformers / hf_attn_variants TP plans that split a module's weight across TP ranks.
SHARDING_STYLES = {
    "colwise", "rowwise", "colwise_rep", "rowwise_rep", "colwise_gather_output", "rowwise_split_input",
    "colwise_gather_partial", "packed_colwise", "packed_rowwise", "embedding_rowwise", "embedding_colwise",
}
ROWWISE_STYLES = {"rowwise", "rowwise_rep", "rowwise_split_input", "packed_rowwise"}
"""Rowwise linears keep their bias whole on every rank."""
GAU_QUADRATIC_PATHS = ("softmax_sdpa", "softmax", "softmax_blocked", "relu2", "relu2_blocked", "relu2_triton")
"""The quadratic GAU kernels (``modeling_gau.GAU_ATTENTION_PATHS``) that ``gau_layer_bytes`` has formulas
for."""



# --------------------------------------------------------------------------------------------------
# Layouts and models
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """A parallel layout: ``tp`` ranks split each layer, ``fsdp`` ranks shard the states, ``replicate``
    copies.

    GPUs = tp · fsdp · replicate. A TP group works on one micro-batch, so sequences per optimizer step
    (without gradient accumulation) = b · fsdp · replicate.
    """

    key: str
    title: str
    tp: int = 1
    fsdp: int = 1
    replicate: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.fsdp * self.replicate

    def sequences_per_step(self, micro_batch: int) -> int:
        """b · (data-parallel ranks) = b · fsdp · replicate."""
        return micro_batch * self.fsdp * self.replicate


LAYOUTS: tuple[Layout, ...] = (
    Layout("single", "1 GPU, no sharding"),
    Layout("fsdp8", "FSDP2 × 8 (1 node)", fsdp=8),
    Layout("tp8", "TP = 8 (1 node)", tp=8),
    Layout("tp2_fsdp4", "TP = 2 × FSDP = 4 (1 node)", tp=2, fsdp=4),
    Layout("hsdp2x8", "HSDP 2 nodes × 8 (shard 8, replicate 2)", fsdp=8, replicate=2),
)


@dataclass
class ModelSpec:
    """A model to estimate: its config, head class, objective and the fraction of positions that get
    logits."""

    key: str
    title: str
    config: Any
    model_class: type[nn.Module]
    objective: str  # "clm" or "mlm"
    logit_fraction: float
    note: str = ""


def ei_1b_config() -> EntropyInvariantConfig:
    """Llama-3.2-1B-like entropy-invariant decoder: d = 2048, 16 layers, 32 heads × 64, FFN 8192, vocab
    128256.

    Differences from Llama-3.2-1B: full multi-head attention (no grouped KV heads) and this package's single
    activation FeedForward ``down(silu(up(x)))``; a width-8192 single-activation FFN has the parameters of a
    SwiGLU of width 5461 (Llama's 5632). Tied embeddings as Llama-3.2-1B. Dropout 0 (LLM pretraining).
    """
    config = EntropyInvariantConfig(
        vocab_size=128256,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        head_dim=64,
        intermediate_size=8192,
        hidden_act="silu",
        norm_type="rmsnorm",
        norm_position="pre",
        layer_norm_eps=1e-5,
        use_bias=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        attention_scale="entropy_invariant",
        base_length=2048,
    )
    config._attn_implementation = "sdpa"
    return config


def gau_alpha_config(**overrides: Any) -> GAUConfig:
    """GAU-α base as the repo defines it: ``GAUConfig.gau_alpha_base()`` (24 layers, d 768, e 1536, s 128, V
    12000)."""
    return GAUConfig.gau_alpha_base(**overrides)


def model_specs() -> list[ModelSpec]:
    """The two models of docs/scaling.md."""
    return [
        ModelSpec(
            "gau-alpha", "GAU-α base (GAUForMaskedLM, MLM)", gau_alpha_config(), GAUForMaskedLM, "mlm",
            MLM_TARGET_FRACTION,
            "softmax_plus attention, dropout 0.1 (hidden and attention), post-norm parameter-free RMSNorm; "
            "LM head on the 15 % masked positions only (this repo's `TargetOnlyMLMLoss`).",
        ),
        ModelSpec(
            "ei-1b", "Entropy-invariant ~1B decoder (EntropyInvariantForCausalLM, CLM)", ei_1b_config(),
            EntropyInvariantForCausalLM, "clm", 1.0,
            "SDPA (flash / memory-efficient kernel), dropout 0, pre-norm RMSNorm with gain; logits at every "
            "position.",
        ),
    ]


def build_meta_model(spec: ModelSpec) -> nn.Module:
    """``spec.model_class(spec.config)`` on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        return spec.model_class(spec.config)


# --------------------------------------------------------------------------------------------------
# Parameters and the TP plan
# --------------------------------------------------------------------------------------------------
@dataclass
class ParamCounts:
    """Exact parameter counts (tied weights once), split into per-layer and root (embeddings, head, final
    norm), and each into what the TP plan shards and what it replicates."""

    total: int
    num_layers: int
    layer_sharded: int  # summed over all layers
    layer_replicated: int
    root_sharded: int
    root_replicated: int
    plan_source: str
    plan: dict[str, str] = field(default_factory=dict)

    def per_layer(self, tp: int) -> float:
        """Parameters of one layer on one TP rank: sharded / tp + replicated."""
        return (self.layer_sharded / tp + self.layer_replicated) / self.num_layers

    def root(self, tp: int) -> float:
        """Root-unit parameters on one TP rank (embeddings are vocab-sharded, norms replicated)."""
        return self.root_sharded / tp + self.root_replicated

    def tp_local(self, tp: int) -> float:
        """P_tp = P_sharded / tp + P_replicated."""
        return self.per_layer(tp) * self.num_layers + self.root(tp)


def tp_plan(model: nn.Module) -> tuple[dict[str, str], str]:
    """The model's TP plan with full module paths, and where it came from.

    Base-model entries (``config.base_model_tp_plan``, relative to ``model.``) + the head's ``_tp_plan``; the
    input embedding gets ``embedding_rowwise`` as Transformers adds it (``transformers.distributed.mixin``).
    """
    config = model.config
    source = f"`{type(config).__name__}.base_model_tp_plan` in the package"
    prefix = model.base_model_prefix
    plan = {f"{prefix}.{key}": style for key, style in config.base_model_tp_plan.items()}
    plan.setdefault(f"{prefix}.embed_tokens", "embedding_rowwise")
    plan.update(type(model)._tp_plan)
    return plan, source


def module_style(plan: dict[str, str], module_path: str) -> str | None:
    """The plan's style for ``module_path`` (``*`` matches a layer index)."""
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module_path, pattern) and pattern.count(".") == module_path.count("."):
            return style
    return None


def is_tp_sharded(model: nn.Module, plan: dict[str, str], name: str) -> bool:
    """Whether parameter ``name`` is split across TP ranks by ``plan``.

    A linear / embedding with a sharding style is split (a rowwise linear's bias stays whole); a module with
    ``local_shard`` splits the parameters it lists in ``tp_sharded_parameters`` (per-head tensors) and keeps
    the others (e.g. GAU's ``qk_scale``/``qk_offset``) whole.
    """
    owner, _, leaf = name.rpartition(".")
    style = module_style(plan, owner)
    if style in SHARDING_STYLES:
        return not (style in ROWWISE_STYLES and leaf == "bias")
    parts = owner.split(".")
    for depth in range(len(parts), 0, -1):
        ancestor = ".".join(parts[:depth])
        if module_style(plan, ancestor) == "local_shard":
            relative = name[len(ancestor) + 1 :]
            sharded = getattr(model.get_submodule(ancestor), "tp_sharded_parameters", ())
            return relative in sharded
    return False


def count_parameters(spec: ModelSpec) -> ParamCounts:
    """Exact counts from the meta-device model; ``named_parameters`` lists a tied weight once."""
    model = build_meta_model(spec)
    plan, source = tp_plan(model)
    layer_prefix = f"{model.base_model_prefix}.layers."
    counts = {"layer_sharded": 0, "layer_replicated": 0, "root_sharded": 0, "root_replicated": 0}
    for name, parameter in model.named_parameters():
        where = "layer" if name.startswith(layer_prefix) else "root"
        how = "sharded" if is_tp_sharded(model, plan, name) else "replicated"
        counts[f"{where}_{how}"] += parameter.numel()
    total = sum(p.numel() for p in model.parameters())
    return ParamCounts(total, spec.config.num_hidden_layers, plan_source=source, plan=plan, **counts)


# --------------------------------------------------------------------------------------------------
# Activation formulas (bytes per token; derived from the forward code, checked by ``trace_layer``)
# --------------------------------------------------------------------------------------------------
@dataclass
class LayerBytes:
    """Bytes saved for backward by one layer, per token of one sequence.

    ``replicated``: identical on every TP rank (residual stream, norms, inputs of column-parallel linears);
    ``sharded``: divided by tp (per-head / per-unit tensors); ``quadratic``: terms ∝ n (an n×n map per
    sequence, i.e. n bytes-coefficient per token), replicated under TP.
    """

    replicated: float
    sharded: float
    quadratic: float = 0.0
    path: str = ""

    def per_token(self, tp: int = 1) -> float:
        return self.replicated + self.sharded / tp + self.quadratic


def rmsnorm_bytes_per_token(d: int, gain: bool) -> float:
    """``layers.RMSNorm`` in bf16: the fp32 upcast x (4d, saved by pow and mul), rsqrt (4), and with a gain
    the fp32 x̂ saved by the multiplication with g (4d): 8d + 4 with gain, 4d + 4 without."""
    return (8 if gain else 4) * d + FP32


def ei_layer_bytes(config: EntropyInvariantConfig) -> LayerBytes:
    """``EntropyInvariantLayer`` (pre-norm, bf16 compute, SDPA fused kernel), per token.

    inner = h·hd, I = intermediate_size::

        replicated = 2·norm(d) + 2d (q/k/v input) + 2d (up_proj input) + 4 (log-n factor)
                     [+ 2·1d dropout masks]
        sharded    = 3·2·inner (q after RoPE and factor, k after RoPE, v)
                     + 2·inner (attention output = o_proj input)
                     + 4h (log-sum-exp) + 2I (activation input) + 2I (down_proj input)

    The flash / memory-efficient kernels keep no n×n map (they recompute it in backward).
    """
    if config.norm_type != "rmsnorm" or config.norm_position != "pre":
        raise NotImplementedError("ei_layer_bytes models pre-norm RMSNorm layers.")
    d, heads = config.hidden_size, config.num_attention_heads
    inner = heads * config.head_dim
    masks = 2 * BOOL * d if config.hidden_dropout_prob > 0 else 0
    replicated = 2 * rmsnorm_bytes_per_token(d, config.norm_elementwise_affine) + 2 * BF16 * d + FP32 + masks
    if config.attention_scale == "standard":
        replicated -= FP32
    sharded = 4 * BF16 * inner + FP32 * heads + 2 * BF16 * config.intermediate_size
    return LayerBytes(replicated, sharded, 0.0, "SDPA flash / memory-efficient")


def gau_layer_bytes(config: GAUConfig, n: int) -> LayerBytes:
    """``GAULayer`` (bf16 compute; the attention runs in fp32) in training on a GPU, per token, TP split as
    the GAU plan does it. The attention's terms follow the path the unit says it takes
    (``gau_attention_path``).

    The plan (``colwise_gather_partial``) gathers ``in_proj``'s output on every rank, so the SiLU input and
    output (width 2e + s) and z, q, k stay whole; only u, v and what follows are split over e. With d, e, s::

        replicated = 2d (in_proj input) + 2·2(2e+s) (SiLU input and output; u, v, z are views of it)
                     + 4s + 4s (fp32 q with its scale, fp32 k) + 4 (per-row log-n factor or 1/√L)
                     + 1d (residual dropout mask, p > 0) + norm(d)
        sharded    = 4e (fp32 v) + 2e (attention output in bf16) + 2e (u ⊙ A v = out_proj input) + path terms
        path terms : softmax_sdpa / softmax_blocked: + 4e (fp32 output, saved by the kernel) + 4
        (log-sum-exp);
                     with fp32 q/k (s) and v (e ≠ s) CUDA's SDPA takes its memory-efficient kernel (flash
                     needs bf16/fp16 and equal head sizes), which saves the same;
                     softmax: + 4n quadratic (the probabilities); relu2_blocked / relu2_triton: nothing;
                     relu2: + 8n (relu(a) and relu(a)²); attention_map of relu² (attention dropout or
                     ``gau_kernel="reference"``): + 8n (relu(a), the map) + 1n (the dropout mask, p > 0), all
                     n×n per sequence, i.e. per token a multiple of n.
    """
    d, e, s = config.hidden_size, config.intermediate_width, config.attention_key_size
    # the quadratic unit hands its kernels float32 q, k, v (it upcasts them), whatever the model's dtype
    path = gau_attention_path(config, n, n, causal=config.is_decoder, device="cuda", dtype=torch.float32,
                              dropout=config.attention_probs_dropout_prob > 0)  # training
    relu2_map = path == "attention_map" and config.attention_normalization == "relu2"
    if not (path in GAU_QUADRATIC_PATHS or relu2_map) or config.norm_type != "rmsnorm":
        raise NotImplementedError(f"gau_layer_bytes has no formula for {path!r}; use trace_layer.")
    row_factor = config.attention_normalization in ("softmax_plus", "relu2")  # log-n factor or 1/√L, saved
    replicated = BF16 * d + 2 * BF16 * (2 * e + s) + 2 * FP32 * s + (FP32 if row_factor else 0)
    replicated += (BOOL * d if config.hidden_dropout_prob > 0 else 0) + rmsnorm_bytes_per_token(
        d, config.norm_elementwise_affine
    )
    sharded = FP32 * e + 2 * BF16 * e
    quadratic = 0.0
    if path in ("softmax_sdpa", "softmax_blocked"):
        sharded += FP32 * e
        replicated += FP32
    elif path == "softmax":
        quadratic = FP32 * n
    elif path == "relu2":
        quadratic = 2 * FP32 * n
    elif relu2_map:
        quadratic = (2 * FP32 + (BOOL if config.attention_probs_dropout_prob > 0 else 0)) * n
    return LayerBytes(replicated, sharded, quadratic, path)


def layer_bytes(spec: ModelSpec, n: int) -> LayerBytes:
    """Per-token saved bytes of one layer of ``spec`` at length n."""
    if isinstance(spec.config, GAUConfig):
        return gau_layer_bytes(spec.config, n)
    return ei_layer_bytes(spec.config)


def other_bytes_per_token(spec: ModelSpec) -> float:
    """Saved activations outside the layers, per token (replicated under TP).

    Embedding indices (8) + RoPE cos and sin shared by all layers (2·2·rot) + nᵢ (4), and
    - pre-norm decoder: final norm(d) + its bf16 output, the LM head input (2d);
    - post-norm GAU-α: embedding norm(d) + embedding dropout mask (1d), and the gathered LM-head input of the
      masked positions (2d · 0.15).
    """
    config = spec.config
    d = config.hidden_size
    rot = config.attention_key_size if isinstance(config, GAUConfig) else config.head_dim
    total = INT64 + 2 * BF16 * rot + FP32
    norm = rmsnorm_bytes_per_token(d, config.norm_elementwise_affine)
    if config.norm_position == "pre":
        total += norm + BF16 * d
    else:
        total += norm + (BOOL * d if config.hidden_dropout_prob > 0 else 0) + BF16 * d * spec.logit_fraction
    return total


def checkpoint_bytes_per_token(config: Any) -> float:
    """Gradient checkpointing keeps each layer's bf16 input: 2d per token per layer (replicated under TP)."""
    return BF16 * config.hidden_size


# --------------------------------------------------------------------------------------------------
# Trace: what autograd really saves, one layer on the meta device
# --------------------------------------------------------------------------------------------------
class _FusedAttentionStandIn(torch.autograd.Function):
    """What CUDA's flash / memory-efficient SDPA saves: q, k, v, the output (in (b, n, h, e) memory, returned
    as a (b, h, n, e) view) and the fp32 log-sum-exp — no n×n map (the kernels recompute it; dropout is
    replayed from the RNG state). On the meta device it allocates nothing (the autocast trace runs it on
    uninitialised CPU tensors)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        batch, heads, length = query.shape[:3]
        output = query.new_empty(batch, length, heads, value.shape[-1]).transpose(1, 2)
        lse = query.new_empty(batch, heads, length, dtype=torch.float32)
        ctx.save_for_backward(query, key, value, output, lse)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        raise NotImplementedError("trace only")


def _sdpa_stand_in(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    if attn_mask is not None:
        raise NotImplementedError("the trace models unpadded training batches (no attention mask)")
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu"):  # CUDA autocast casts SDPA's inputs
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    return _FusedAttentionStandIn.apply(query, key, value)


def _cuda_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True,
                  inplace: bool = False) -> torch.Tensor:
    """CUDA's fused dropout (``native_dropout``), which saves a bool mask; CPU's would save a mask in x's
    dtype."""
    if not training or p == 0:
        return x
    return torch.native_dropout(x, p, True)[0]


@contextlib.contextmanager
def cuda_like_kernels() -> Iterator[None]:
    """Swap SDPA and dropout for stand-ins that save what their CUDA kernels save (the meta device has
    neither)."""
    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _sdpa_stand_in, _cuda_dropout
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def saved_bytes(run: Callable[[], Any], exclude: set[int]) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` executes (views of one storage count
    once), leaving out the storages in ``exclude`` (parameters: FSDP frees their unsharded copies after
    forward)."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in exclude:
            seen.setdefault(storage._cdata, storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(seen.values())


def trace_layer(spec: ModelSpec, n: int, model_class: type[nn.Module] | None = None,
                **overrides: Any) -> float:
    """Saved bytes per token of layer 0 of ``spec`` (with config ``overrides``) for one sequence of length n.

    Runs the real ``forward`` of the layer in bf16 on the meta device under ``cuda_like_kernels``; parameters
    and the shared RoPE tables are excluded (counted elsewhere).
    """
    attn_implementation = overrides.pop("_attn_implementation", spec.config._attn_implementation)
    config = type(spec.config).from_dict({**spec.config.to_dict(), **overrides, "num_hidden_layers": 1})
    config._attn_implementation = attn_implementation
    with torch.device("meta"):
        model = (model_class or spec.model_class)(config).to(torch.bfloat16)
    model.train()
    backbone, layer = model.model, model.model.layers[0]
    exclude = {p.untyped_storage()._cdata for p in model.parameters()}
    hidden = torch.empty(1, n, config.hidden_size, device="meta", dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(n, device="meta")[None]
    cos, sin = backbone.rotary_emb(positions, torch.bfloat16)
    exclude |= {cos.untyped_storage()._cdata, sin.untyped_storage()._cdata}
    geometry = AttentionGeometry(1, n, 0, config.is_decoder, hidden.device, None, positions)
    if isinstance(config, EntropyInvariantConfig):  # unpadded causal batch: SDPA runs with is_causal, no mask
        counts = visible_key_counts(None, batch_size=1, query_length=n, key_length=n, causal=True,
                                    device="meta")
        inputs = {"geometry": geometry, "attention_mask": None,
                  "key_counts": counts if config.attention_scale != "standard" else None}
    else:
        inputs = backbone.layer_inputs(geometry, hidden)
    with cuda_like_kernels():
        total = saved_bytes(lambda: layer(hidden, position_embeddings=(cos, sin), **inputs), exclude)
    return total / n


class LiveBytes(TorchDispatchMode):
    """Tracks the bytes of live storages created by ops (meta tensors included) and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage._cdata not in self._seen:
                    self._seen.add(storage._cdata)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, storage._cdata, storage.nbytes())
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)


def trace_loss_peak(tokens: int = 2048, vocab: int = 8192, hidden: int = 64) -> tuple[float, float]:
    """(bytes per logit kept after forward, peak bytes per logit during backward) of bf16 logits from a linear
    LM head through Transformers' ``ForCausalLMLoss``, traced on the meta device with ``LiveBytes``."""
    states = torch.empty(1, tokens, hidden, device="meta", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.empty(vocab, hidden, device="meta", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    mode = LiveBytes()
    with mode:
        loss = ForCausalLMLoss(F.linear(states, weight), labels, vocab)
        kept, mode.peak = mode.live, mode.live
        loss.backward()
    logits = tokens * vocab
    return kept / logits, mode.peak / logits


# --------------------------------------------------------------------------------------------------
# Estimates
# --------------------------------------------------------------------------------------------------
@dataclass
class Estimate:
    """One model × layout × length × micro-batch, every component in bytes per GPU."""

    model: str
    layout: str
    layout_title: str
    seq_len: int
    micro_batch: int
    gpus: int
    sequences_per_step: int
    params: float
    grads: float
    adam: float
    fsdp_buffers: float
    layers_full: float
    layers_ckpt: float
    one_layer: float
    other: float
    logits_peak: float
    logits_saved: float
    total_full: float
    total_ckpt: float
    per_sample_full: float
    per_sample_ckpt: float
    max_micro_batch_full: int
    max_micro_batch_ckpt: int
    attention_path: str


def states_bytes(counts: ParamCounts, layout: Layout) -> tuple[float, float, float]:
    """(params, grads, AdamW) per GPU = (4, 4, 8) B · P_tp / fsdp."""
    local = counts.tp_local(layout.tp) / layout.fsdp
    return MASTER_BYTES * local, GRAD_BYTES * local, ADAM_BYTES * local


def fsdp_buffer_bytes(counts: ParamCounts, layout: Layout) -> float:
    """FSDP2 working memory, approx.: 2·P_root (bf16 root unit kept unsharded, ``keep_full_weight``)
    + 2·P_root (its bf16 gradient, alive through backward when the embedding is tied) + 2·2·P_layer (current
    and prefetched all-gathered bf16 layers) + (2 + 4)·P_layer (one layer's bf16 gradient and fp32 reduce
    input)."""
    root, layer = counts.root(layout.tp), counts.per_layer(layout.tp)
    return 2 * BF16 * root + 2 * BF16 * layer + (BF16 + FP32) * layer


def max_micro_batch(fixed: float, per_sample: float, budget: float) -> int:
    """Largest b with fixed + b · per_sample ≤ budget (0 if not even b = 1 fits)."""
    return max(0, math.floor((budget - fixed) / per_sample)) if per_sample > 0 else 0


def estimate(spec: ModelSpec, counts: ParamCounts, layout: Layout, n: int, b: int, budget: float) -> Estimate:
    """Assemble every component; see the module docstring for the peak formulas."""
    params, grads, adam = states_bytes(counts, layout)
    buffers = fsdp_buffer_bytes(counts, layout)
    per_layer = layer_bytes(spec, n).per_token(layout.tp)
    layers = counts.num_layers
    vocab = spec.config.vocab_size
    tokens = b * n
    layers_full = layers * per_layer * tokens
    ckpt_inputs = layers * checkpoint_bytes_per_token(spec.config) * tokens
    one_layer = per_layer * tokens
    other = other_bytes_per_token(spec) * tokens
    logit_elements = tokens * spec.logit_fraction * vocab
    logits_peak, logits_saved = LOSS_PEAK_BYTES * logit_elements, LOSS_SAVED_BYTES * logit_elements
    fixed = params + grads + adam + buffers
    total_full = fixed + layers_full + other + logits_peak
    total_ckpt = fixed + ckpt_inputs + other + max(logits_peak, one_layer)
    per_sample_full = (total_full - fixed) / b
    per_sample_ckpt = (total_ckpt - fixed) / b
    return Estimate(
        spec.key, layout.key, layout.title, n, b, layout.gpus, layout.sequences_per_step(b), params, grads,
        adam,
        buffers, layers_full, ckpt_inputs, one_layer, other, logits_peak, logits_saved, total_full,
        total_ckpt,
        per_sample_full, per_sample_ckpt, max_micro_batch(fixed, per_sample_full, budget),
        max_micro_batch(fixed, per_sample_ckpt, budget), layer_bytes(spec, n).path,
    )


# --------------------------------------------------------------------------------------------------
# The torch.autocast alternative (what training/sharded.py and accelerate's bf16 run)
# --------------------------------------------------------------------------------------------------
@dataclass
class AutocastLayer:
    """Saved bytes of one layer under ``torch.autocast(bf16)`` with fp32 weights: ``per_token`` (fp32 residual
    stream and norms, bf16 copies of every linear's input) and ``per_layer`` (the bf16 copies of the layer's
    weights, saved for backward and held by autocast's cast cache until the autocast region ends)."""

    per_token: float
    per_layer: float


def trace_layer_autocast(spec: ModelSpec, lengths: tuple[int, int] = (32, 64)) -> AutocastLayer:
    """Fit bytes(n) = per_token · n + per_layer from two traces of layer 0 under CPU autocast.

    Real CPU tensors (autocast does not act on meta tensors), uninitialised fp32 weights (``to_empty``),
    vocabulary cut to 256 (the layer does not see it), SDPA and dropout stand-ins as in ``trace_layer`` (the
    SDPA stand-in casts its inputs to bf16 as CUDA autocast does). CPU and CUDA autocast cast the same ops
    used here (linear, matmul, SDPA).
    """
    config = type(spec.config).from_dict({**spec.config.to_dict(), "num_hidden_layers": 1, "vocab_size": 256})
    config._attn_implementation = spec.config._attn_implementation
    with torch.device("meta"):
        model = spec.model_class(config)
    model = model.to_empty(device="cpu").train()
    backbone, layer = model.model, model.model.layers[0]
    exclude = {p.untyped_storage()._cdata for p in model.parameters()}
    totals = []
    for n in lengths:
        hidden = torch.zeros(1, n, config.hidden_size, requires_grad=True)
        positions = torch.arange(n)[None]
        cos, sin = backbone.rotary_emb(positions, torch.float32)
        shared = exclude | {cos.untyped_storage()._cdata, sin.untyped_storage()._cdata}
        geometry = AttentionGeometry(1, n, 0, config.is_decoder, hidden.device, None, positions)
        if isinstance(config, EntropyInvariantConfig):
            counts = visible_key_counts(None, batch_size=1, query_length=n, key_length=n, causal=True,
                                        device="cpu")
            inputs = {"geometry": geometry, "attention_mask": None, "key_counts": counts}
        else:
            inputs = backbone.layer_inputs(geometry, hidden)
        with cuda_like_kernels(), torch.autocast("cpu", dtype=torch.bfloat16):
            run = functools.partial(layer, hidden, position_embeddings=(cos, sin), **inputs)
            totals.append(saved_bytes(run, shared))
    per_token = (totals[1] - totals[0]) / (lengths[1] - lengths[0])
    return AutocastLayer(per_token, totals[0] - per_token * lengths[0])


@dataclass
class AutocastEstimate:
    """Per-GPU bytes of one layout (TP = 1 only) under autocast, next to the MixedPrecisionPolicy estimate."""

    model: str
    layout_title: str
    seq_len: int
    fsdp_buffers: float
    weight_casts: float
    layers_full: float
    layers_ckpt: float
    total_full: float
    total_ckpt: float
    policy_total_full: float
    policy_total_ckpt: float


def estimate_autocast(
    spec: ModelSpec, counts: ParamCounts, layout: Layout, n: int, b: int, layer: AutocastLayer,
    policy: Estimate
) -> AutocastEstimate:
    """Autocast variant of ``estimate`` (no TP):

    - FSDP2 all-gathers fp32: buffers ≈ 4·P_root (kept unsharded) + 4·P_root (fp32 gradient) + 2·4·P_layer
      (current + prefetch) + 4·P_layer (one layer's gradient) = 8·P_root + 12·P_layer;
    - bf16 weight copies: L · per_layer (traced) + 2·V·d for the LM head — not divided by FSDP, held from
      forward to backward without checkpointing; with checkpointing only until autocast's cache is cleared at
      the end of forward + loss (the forward peak, with the 10 B/logit loss forward);
    - fp32 residual stream: checkpoints of 4d per token per layer.
    """
    config = spec.config
    tokens = b * n
    fixed = policy.params + policy.grads + policy.adam + 8 * counts.root(1) + 12 * counts.per_layer(1)
    casts = counts.num_layers * layer.per_layer + BF16 * config.vocab_size * config.hidden_size
    layers_full = counts.num_layers * layer.per_token * tokens
    ckpt = counts.num_layers * FP32 * config.hidden_size * tokens
    one_layer = layer.per_token * tokens
    logits_forward = (BF16 + 2 * FP32) * tokens * spec.logit_fraction * config.vocab_size
    total_full = fixed + casts + layers_full + policy.other + policy.logits_peak
    total_ckpt = fixed + ckpt + policy.other + max(
        casts + logits_forward, policy.logits_peak, one_layer + layer.per_layer
    )
    return AutocastEstimate(
        spec.key, layout.title, n, fixed - policy.params - policy.grads - policy.adam, casts, layers_full,
        ckpt,
        total_full, total_ckpt, policy.total_full, policy.total_ckpt,
    )


# --------------------------------------------------------------------------------------------------
# Checks and variant tables (traced)
# --------------------------------------------------------------------------------------------------
@dataclass
class TraceCheck:
    """Formula vs trace, bytes per token of one layer (TP = 1)."""

    model: str
    seq_len: int
    formula: float
    traced: float

    @property
    def relative_error(self) -> float:
        return abs(self.formula - self.traced) / self.traced


def trace_checks(specs: Sequence[ModelSpec], seq_lens: Sequence[int]) -> list[TraceCheck]:
    """The formula of each model's layer against its trace, at every length."""
    return [
        TraceCheck(spec.key, n, layer_bytes(spec, n).per_token(1), trace_layer(spec, n))
        for spec in specs
        for n in seq_lens
    ]


GAU_VARIANTS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("softmax_plus, attention dropout 0.1 — GAU-α as configured (SDPA memory-efficient kernel)", {}, "trace"),
    ("softmax_plus, no attention dropout (`softmax_attention`: one expression ≤ 2²² scores, blocked above)",
     {"attention_probs_dropout_prob": 0.0}, "trace"),
    ("relu², no attention dropout, torch kernel (`relu2_attention`)",
     {"attention_normalization": "relu2", "attention_probs_dropout_prob": 0.0, "gau_kernel": "torch"},
     "trace"),
    # "triton" whether or not triton is installed here ("auto" takes the torch kernels: the unit hands
    # quadratic attention float32 inputs, and the Triton kernels use the tensor cores for bf16/fp16 only).
    ("relu², no attention dropout, Triton kernel (`gau_kernel=\"triton\"`)",
     {"attention_normalization": "relu2", "attention_probs_dropout_prob": 0.0, "gau_kernel": "triton"},
     "formula"),
    ("relu², attention dropout 0.1 (any kernel: dropout needs the map A)",
     {"attention_normalization": "relu2"}, "trace"),
    ("FLASH mixed-chunk, chunk_size 256, relu², no attention dropout, bidirectional (torch kernels)",
     {"attention_normalization": "relu2", "chunk_size": 256, "attention_probs_dropout_prob": 0.0,
      "gau_kernel": "torch"}, "trace"),
    ("FLASH mixed-chunk, chunk_size 256, relu², no attention dropout, causal (`GAUForCausalLM`)",
     {"attention_normalization": "relu2", "chunk_size": 256, "attention_probs_dropout_prob": 0.0,
      "gau_kernel": "torch"}, "trace-causal"),
)
"""GAU-α's shape with other attention settings (hidden dropout stays 0.1)."""

EI_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("SDPA (flash / memory-efficient) — as estimated", {}),
    ("eager attention (`attn_implementation=\"eager\"`)", {"_attn_implementation": "eager"}),
)


def variant_rows(spec: ModelSpec, seq_lens: Sequence[int], kind: str) -> list[dict[str, Any]]:
    """Per-layer saved MiB per sequence for each attention variant, at every length."""
    rows = []
    variants = GAU_VARIANTS if kind == "gau" else tuple((name, over, "trace") for name, over in EI_VARIANTS)
    for name, overrides, source in variants:
        cells = {}
        for n in seq_lens:
            if source == "formula":
                config = type(spec.config).from_dict({**spec.config.to_dict(), **overrides})
                per_token = gau_layer_bytes(config, n).per_token(1)
            else:
                model_class = GAUForCausalLM if source == "trace-causal" else None
                per_token = trace_layer(spec, n, model_class, **overrides)
            cells[n] = per_token * n / 2**20
        rows.append({"variant": name, "source": source.replace("-causal", ""), "mib_per_layer": cells})
    return rows


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------
@dataclass
class Report:
    """Everything one run computes, in bytes (``results_data``: the results file; ``render_json``: every
    detail)."""

    specs: list[ModelSpec]
    counts: dict[str, ParamCounts]
    estimates: list[Estimate]
    seq_lens: list[int]
    budget_gib: float
    command: str
    checks: list[TraceCheck] = field(default_factory=list)
    loss_trace: tuple[float, float] | None = None
    variants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    autocast_layers: dict[str, AutocastLayer] = field(default_factory=dict)
    autocast_estimates: list[AutocastEstimate] = field(default_factory=list)


def build_report(
    specs: list[ModelSpec], layouts: list[Layout], seq_lens: list[int], micro_batch: int, budget_gib: float,
    command: str, trace: bool = True,
) -> Report:
    """Count, estimate and (with ``trace``) check the formulas against traces, trace the variants and
    autocast."""
    counts = {spec.key: count_parameters(spec) for spec in specs}
    estimates = [
        estimate(spec, counts[spec.key], layout, n, micro_batch, budget_gib * GiB)
        for spec in specs
        for n in seq_lens
        for layout in layouts
    ]
    report = Report(specs, counts, estimates, list(seq_lens), budget_gib, command)
    if not trace:
        return report
    report.checks = trace_checks(specs, seq_lens)
    bad = [c for c in report.checks if c.relative_error > 0.01]
    if bad:
        raise SystemExit(f"formula and trace disagree by more than 1 %: {bad}")
    report.loss_trace = trace_loss_peak()
    if abs(report.loss_trace[1] - LOSS_PEAK_BYTES) > 0.05 * LOSS_PEAK_BYTES:
        raise SystemExit(f"loss buffers traced at {report.loss_trace} B/logit, the formula says "
                         f"{LOSS_PEAK_BYTES}")
    by_key = {layout.key: layout for layout in layouts}
    for spec in specs:
        kind = "gau" if isinstance(spec.config, GAUConfig) else "ei"
        report.variants[spec.title] = variant_rows(spec, seq_lens, kind)
        layer = report.autocast_layers[spec.key] = trace_layer_autocast(spec)
        report.autocast_estimates += [
            estimate_autocast(spec, counts[spec.key], by_key[e.layout], e.seq_len, e.micro_batch, layer, e)
            for e in estimates
            if e.model == spec.key and by_key[e.layout].tp == 1
        ]
    return report


# --------------------------------------------------------------------------------------------------
# The results file (rendered into docs/scaling_memory.md and docs/scaling.md by tools.docs_results)
# --------------------------------------------------------------------------------------------------
RESULTS_NAME = "memory-estimates"
"""``docs/results/memory-estimates.json``: what ``python tools/render_docs.py`` renders (kind
``memory_estimates``)."""


def shape_text(spec: ModelSpec) -> str:
    """The exact shape of ``spec``, one sentence."""
    c = spec.config
    if isinstance(c, GAUConfig):
        return (
            f"`GAUConfig.gau_alpha_base()`: hidden d = {c.hidden_size}, {c.num_hidden_layers} GAU layers, "
            f"expansion e = {c.intermediate_width}, key size s = {c.attention_key_size}, vocab "
            f"{c.vocab_size} (tied LM head), `{c.attention_normalization}` (base_length {c.base_length}), "
            f"norm {c.norm_type}/{c.norm_position} (affine={c.norm_elementwise_affine}), dropout hidden "
            f"{c.hidden_dropout_prob} / attention {c.attention_probs_dropout_prob}, RoPE on s, no biases"
        )
    return (
        f"`EntropyInvariantConfig`: hidden d = {c.hidden_size}, {c.num_hidden_layers} layers, "
        f"{c.num_attention_heads} heads × head_dim {c.head_dim}, intermediate_size {c.intermediate_size} "
        f"(`up_proj`/`down_proj`, {c.hidden_act}), vocab {c.vocab_size} "
        f"(tie_word_embeddings={c.tie_word_embeddings}), norm {c.norm_type}/{c.norm_position}, no biases, "
        f"attention_scale `{c.attention_scale}` (base_length {c.base_length}), RoPE θ {c.rope_theta:g}, "
        f"dropout 0, `attn_implementation=\"{c._attn_implementation}\"`"
    )


def summary_text(spec: ModelSpec) -> str:
    """The shape in a few words, for docs/scaling.md (``"hidden 768, 24 layers, e = 1536, s = 128, vocab 12
    000"``)."""
    c = spec.config
    vocab = f"{c.vocab_size:,}".replace(",", " ")
    if isinstance(c, GAUConfig):
        return (f"hidden {c.hidden_size}, {c.num_hidden_layers} layers, e = {c.intermediate_width}, "
                f"s = {c.attention_key_size}, vocab {vocab}")
    return (f"hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads × "
            f"{c.head_dim}, FFN {c.intermediate_size}, vocab "
            f"{vocab}{', tied' if c.tie_word_embeddings else ''}")


def results_data(report: Report) -> dict[str, Any]:
    """The compact results file: every number the docs show, in bytes (or MiB where the docs show MiB)."""
    from tools.docs_results._common import run_metadata

    data = run_metadata("memory_estimates", report.command)
    data["note"] = ("estimates computed from parameter and activation counts on the meta device; not "
                    "measurements")
    data["seq_lens"] = list(report.seq_lens)
    data["budget_gib"] = report.budget_gib
    data["models"] = []
    for spec in report.specs:
        counts = report.counts[spec.key]
        data["models"].append({
            "key": spec.key, "title": spec.title, "class": spec.model_class.__name__,
            "shape": shape_text(spec),
            "summary": summary_text(spec),
            "training_setting": spec.note, "hidden_size": spec.config.hidden_size,
            "vocab_size": spec.config.vocab_size, "num_layers": counts.num_layers, "parameters": counts.total,
            "parameters_per_layer": (counts.layer_sharded + counts.layer_replicated) // counts.num_layers,
            "parameters_root": counts.root_sharded + counts.root_replicated,
            "parameters_tp_split": counts.layer_sharded + counts.root_sharded,
            "parameters_tp_replicated": counts.layer_replicated + counts.root_replicated,
            "tp_plan_source": counts.plan_source,
        })
    traced = {(c.model, c.seq_len): c for c in report.checks}
    data["layer_activations"] = []
    for spec in report.specs:
        for n in report.seq_lens:
            parts = layer_bytes(spec, n)
            check = traced.get((spec.key, n))
            data["layer_activations"].append({
                "model": spec.key, "seq_len": n, "path": parts.path, "replicated": parts.replicated,
                "sharded": parts.sharded, "quadratic": parts.quadratic, "formula": parts.per_token(1),
                "traced": check.traced if check else None,
                "relative_error": check.relative_error if check else None,
                "mib_per_layer_tp": [[tp, parts.per_token(tp) * n / 2**20] for tp in (1, 2, 8)],
            })
    data["loss_trace"] = (
        {"kept_after_forward": report.loss_trace[0], "peak_in_backward": report.loss_trace[1],
         "formula_kept": LOSS_SAVED_BYTES, "formula_peak": LOSS_PEAK_BYTES} if report.loss_trace else None
    )
    data["estimates_bytes"] = [asdict(e) for e in report.estimates]
    by_key = {spec.key: spec for spec in report.specs}
    data["autocast_layers"] = [
        {"model": key, "per_token": layer.per_token, "per_layer": layer.per_layer,
         "policy_per_token": layer_bytes(by_key[key], report.seq_lens[0]).per_token(1)}
        for key, layer in report.autocast_layers.items()
    ]
    data["autocast_estimates_bytes"] = [asdict(a) for a in report.autocast_estimates]
    data["attention_variants"] = [
        {"model": title, "rows": [{"variant": row["variant"], "source": row["source"],
                                   "mib_per_layer": [[n, row["mib_per_layer"][n]] for n in report.seq_lens]}
                                  for row in rows]}
        for title, rows in report.variants.items()
    ]
    return data


def render_json(report: Report) -> str:
    """Everything in bytes (and per-token bytes), machine-readable."""
    specs, counts = report.specs, report.counts
    document = {
        "note": "estimates computed from parameter and activation counts; not measurements",
        "assumptions": "docs/scaling_memory.md",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "models": {
            spec.key: {
                "title": spec.title,
                "class": spec.model_class.__name__,
                "config": {k: v for k, v in spec.config.to_diff_dict().items() if not k.startswith("_")},
                "parameters": {k: v for k, v in asdict(counts[spec.key]).items()},
            }
            for spec in specs
        },
        "command": report.command,
        "trace_checks": [asdict(c) | {"relative_error": c.relative_error} for c in report.checks],
        "loss_trace_bytes_per_logit": (
            dict(zip(("kept_after_forward", "peak_in_backward"), report.loss_trace)) if report.loss_trace
            else None
        ),
        "estimates_bytes": [asdict(e) for e in report.estimates],
        "attention_variants_mib_per_layer": report.variants,
        "autocast_layers": {key: asdict(layer) for key, layer in report.autocast_layers.items()},
        "autocast_estimates_bytes": [asdict(a) for a in report.autocast_estimates],
    }
    return json.dumps(document, indent=2, default=str)

# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192], help="sequence lengths n")
    parser.add_argument("--micro-batch", type=int, default=1, help="per-device micro-batch b (default 1)")
    parser.add_argument("--models", nargs="+", default=None, choices=["gau-alpha", "ei-1b"],
                        help="default: both")
    parser.add_argument(
        "--layouts", nargs="+", default=None, choices=[layout.key for layout in LAYOUTS], help="default: all"
    )
    parser.add_argument("--budget-gib", type=float, default=DEFAULT_BUDGET_GIB,
                        help="usable GiB per GPU for the max-micro-batch column (default "
                             f"{DEFAULT_BUDGET_GIB:g})")
    parser.add_argument("--no-trace", action="store_true",
                        help="skip the meta-device trace checks and variant tables")
    parser.add_argument("--results", default=RESULTS_NAME,
                        help=f"write docs/results/<RESULTS>.json under --root (default {RESULTS_NAME!r}, "
                             "which docs/scaling_memory.md and docs/scaling.md render; then run `python "
                             "tools/render_docs.py`)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="repository root (default: this script's repository)")
    parser.add_argument("--output", type=Path, default=None,
                        help="write the detailed JSON (every component, config, TP plan) here instead of the "
                             "results file")
    args = parser.parse_args(argv)
    if args.micro_batch < 1 or any(n < 1 for n in args.seq_lens):
        parser.error("--micro-batch and --seq-lens must be positive")
    if not (math.isfinite(args.budget_gib) and args.budget_gib > 0):
        parser.error(f"--budget-gib must be a positive number of GiB, got {args.budget_gib}")
    if not args.root.is_dir():  # its docs/results/ is created, not the root itself
        parser.error(f"--root: {str(args.root)!r} is not an existing folder (a checkout of this repository)")
    from scripts.script_paths import output_file_problem, results_name_problem

    problem = None if args.output is None else output_file_problem(args.output)
    if problem:
        parser.error(f"--output: {problem}")
    problem = results_name_problem(args.root, args.results)
    if problem:
        parser.error(f"--results: {problem}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    specs = [s for s in model_specs() if args.models is None or s.key in args.models]
    layouts = [layout for layout in LAYOUTS if args.layouts is None or layout.key in args.layouts]
    command = " ".join(["python scripts/memory_estimates.py", *argv])
    report = build_report(
        specs, layouts, args.seq_lens, args.micro_batch, args.budget_gib, command, trace=not args.no_trace
    )
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(render_json(report) + "\n", encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    from tools.docs_results import write_results

    path = write_results(args.root, args.results, results_data(report))
    print(f"wrote {path}; now run `python tools/render_docs.py`", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
