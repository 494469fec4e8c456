"""FLASH as people train it, side by side with its peers: causal LMs over a 32k vocabulary, fwd+bwd with the
causal-LM loss, 65,536 tokens a step (issue 47).

Models (``MODELS``), all bf16 weights on the GPU:

- ``ours_triton``, ``ours_torch``: ``GAUForCausalLM``, FLASH (relu², ``chunk_size`` 256, key size 128,
  expansion 2, causal), 8 layers of width 512, with ``gau_kernel="triton"`` / ``"torch"``;
- ``flash_pytorch``: lucidrains' FLASH-pytorch 0.1.9 ``FLASHTransformer`` at the same shapes (token shift off,
  as in ``bench/peers.py``), split at its logits: its backbone and its vocabulary projection; its absolute
  position table stays float32, as under autocast (``peers.keep_positions_float32``);
- ``llama_sdpa``: a stock ``LlamaForCausalLM`` (SDPA) with 4 layers, one per two GAU layers (FLASH's
  Transformer++ baseline), and the MLP width (a multiple of 64) that gives it the non-embedding parameters of
  our FLASH (13.2M against 13.1M at the GPU shape; each run records both counts).

The loss is the same computation on every side: ``chunked_cross_entropy`` of the final hidden states and the
LM head's weight (and FLASH-pytorch's bias), the input ids as labels; so the comparison is the models'.
A row: median wall time of ``repeats`` steps after ``warmups`` (``torch.cuda.synchronize`` around each),
tokens/s, FLOPs from ``step_flops`` and MFU against the GPU's dense bf16 peak, and the peak of
``torch.cuda.max_memory_allocated`` over the timed steps (weights and gradients included) in GiB.

FLOPs come from a formula, not a counter (``torch.utils.flop_counter`` cannot see Triton's products), over
T = batch × n tokens, width d, vocabulary V, times 3 for forward and backward (backward = 2 × forward):

- a GAU layer: projections 2·T·d·(2e + s) + 2·T·e·d; quadratic attention inside chunks of g, causal (half
  of each g×g map): T·g·(s + e); linear attention across chunks (each chunk's kᵀv, then q times the state):
  4·T·s·e;
- a Llama layer: q, k, v, o 2·T·4d²; the gated MLP 2·T·3·d·i; causal attention 4·n²·d/2 per sequence, i.e.
  2·T·n·d;
- the LM head: 2·T·d·V.

FLASH-pytorch counts as our FLASH (the same products at the same shapes). Norms, RoPE and the elementwise
work are left out.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from ..models.losses import chunked_cross_entropy
from .measure import triton_skip_reason
from .peers import PeerBackbone, keep_positions_float32

MODELS = ("llama_sdpa", "flash_pytorch", "ours_torch", "ours_triton")
"""In the order each shape measures them: the baseline first, so a budget cut keeps it."""

GAU_KERNELS = {"ours_triton": "triton", "ours_torch": "torch"}

TARGETS = {"llama_sdpa": {4096: 1.0, 16384: 0.7, 65536: 0.4}, "flash_pytorch": 0.8,
           "peak_memory_vs_llama_at": 65536}
"""Issue 47's done-when: our FLASH's time ≤ these multiples of Llama's (per length n) and of FLASH-pytorch's,
and its peak memory at n = 65,536 ≤ Llama's."""


@dataclass(frozen=True)
class SideBySideShape:
    """The models' sizes and the (batch, n) rows of one run."""

    hidden_size: int = 512
    gau_layers: int = 8
    key_size: int = 128
    expansion: int = 2
    chunk_size: int = 256
    vocab_size: int = 32000
    llama_heads: int = 8
    llama_width_multiple: int = 64
    rows: tuple[tuple[int, int], ...] = ((1, 65536), (4, 16384), (16, 4096))
    warmups: int = 2
    repeats: int = 5

    @property
    def llama_layers(self) -> int:
        return max(1, self.gau_layers // 2)

    @property
    def width(self) -> int:
        """e, the GAU's expanded width."""
        return self.expansion * self.hidden_size


GPU_SHAPE = SideBySideShape()
SMOKE_SHAPE = SideBySideShape(hidden_size=32, gau_layers=2, key_size=16, chunk_size=16, vocab_size=300,
                              llama_heads=4, llama_width_multiple=8, rows=((1, 64), (2, 32)), warmups=1,
                              repeats=2)
"""The CPU dry run's: tiny models, two rows, seconds."""


@dataclass
class Side:
    """One model split at its logits: ``backbone(input_ids).last_hidden_state`` → ``head`` (an
    ``nn.Linear``); ``model`` owns every parameter."""

    name: str
    model: nn.Module
    backbone: nn.Module
    head: nn.Linear
    embedding: nn.Embedding


def gau_config(shape: SideBySideShape, kernel: str) -> Any:
    from ..models.configuration_gau import GAUConfig

    return GAUConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                     num_hidden_layers=shape.gau_layers, attention_key_size=shape.key_size,
                     expansion_factor=shape.expansion, attention_normalization="relu2",
                     chunk_size=shape.chunk_size, gau_kernel=kernel,
                     max_position_embeddings=max(n for _, n in shape.rows), hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)


def gau_non_embedding_parameters(shape: SideBySideShape) -> int:
    """Parameters of our FLASH outside the token embedding (its head is tied to it), built on the meta
    device."""
    from ..models.modeling_gau import GAUModel

    with torch.device("meta"):
        model = GAUModel(gau_config(shape, "torch"))
    return sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()


def equal_llama_width(parameters: int, hidden_size: int, layers: int, multiple: int) -> int:
    """The Llama MLP width i, the multiple of ``multiple`` (at least one) nearest to giving ``layers`` Llama
    layers (4d² + 3di + 2d each, d = ``hidden_size``) and a final norm d ``parameters`` parameters outside
    the embeddings.

    Args:
        parameters (int): the target count, another model's parameters outside its embeddings.
        hidden_size (int): d.
        layers (int): the Llama's layers.
        multiple (int): what i is rounded to (1: the nearest integer).

    Returns:
        int: i.
    """
    d = hidden_size
    exact = (parameters - d - layers * (4 * d * d + 2 * d)) / (3 * d * layers)
    return max(multiple, round(exact / multiple) * multiple)


def llama_intermediate(shape: SideBySideShape) -> int:
    """The Llama MLP width, a multiple of ``llama_width_multiple``, of equal non-embedding parameters with
    our FLASH (``equal_llama_width``)."""
    return equal_llama_width(gau_non_embedding_parameters(shape), shape.hidden_size, shape.llama_layers,
                             shape.llama_width_multiple)


def build_side(name: str, shape: SideBySideShape, device: str, dtype: torch.dtype) -> Side:
    """Model ``name`` of ``MODELS`` at ``shape`` on ``device`` in ``dtype``, in training mode."""
    with torch.device(device):
        if name in GAU_KERNELS:
            from ..models.modeling_gau import GAUForCausalLM

            model: nn.Module = GAUForCausalLM(gau_config(shape, GAU_KERNELS[name]))
            side = Side(name, model, model.model, model.lm_head, model.model.embed_tokens)
        elif name == "flash_pytorch":
            from .peers import flash_pytorch_lm

            backbone, head = flash_pytorch_lm(dim=shape.hidden_size, vocab_size=shape.vocab_size,
                                              depth=shape.gau_layers, group_size=shape.chunk_size,
                                              query_key_dim=shape.key_size)
            model = nn.ModuleDict({"backbone": backbone, "head": head})
            side = Side(name, model, backbone, head, backbone.embedding)
        elif name == "llama_sdpa":
            from transformers import LlamaConfig, LlamaForCausalLM

            config = LlamaConfig(
                vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                num_hidden_layers=shape.llama_layers, num_attention_heads=shape.llama_heads,
                num_key_value_heads=shape.llama_heads, intermediate_size=llama_intermediate(shape),
                max_position_embeddings=max(n for _, n in shape.rows), attention_dropout=0.0,
                attn_implementation="sdpa", tie_word_embeddings=False)
            model = LlamaForCausalLM(config)
            side = Side(name, model, model.model, model.lm_head, model.model.embed_tokens)
        else:
            raise ValueError(f"name: expected one of {', '.join(MODELS)}, got {name!r}")
    side.model.to(dtype).train()
    if isinstance(side.backbone, PeerBackbone):
        keep_positions_float32(side.backbone)
    return side


def parameter_counts(side: Side) -> dict[str, int]:
    """``total`` and ``non_embedding`` (all but the token embedding and an untied LM head's weight and
    bias)."""
    total = sum(p.numel() for p in side.model.parameters())
    embedded = side.embedding.weight.numel()
    if side.head.weight is not side.embedding.weight:
        embedded += side.head.weight.numel() + (0 if side.head.bias is None else side.head.bias.numel())
    return {"total": total, "non_embedding": total - embedded}


def gau_forward_flops(shape: SideBySideShape, tokens: int) -> int:
    """One forward of the GAU layers (module docstring): projections, quadratic in-chunk, linear state."""
    d, e, s, g = shape.hidden_size, shape.width, shape.key_size, shape.chunk_size
    per_layer = 2 * tokens * d * (2 * e + s) + 2 * tokens * e * d + tokens * g * (s + e) + 4 * tokens * s * e
    return shape.gau_layers * per_layer


def llama_forward_flops(shape: SideBySideShape, batch: int, length: int, intermediate: int) -> int:
    """One forward of the Llama layers (module docstring): projections, MLP, causal attention."""
    d, tokens = shape.hidden_size, batch * length
    per_layer = 2 * tokens * 4 * d * d + 2 * tokens * 3 * d * intermediate + 2 * tokens * length * d
    return shape.llama_layers * per_layer


def step_flops(name: str, shape: SideBySideShape, batch: int, length: int,
               intermediate: int | None = None) -> int:
    """FLOPs of one fwd+bwd step of model ``name``: 3 × (its layers' forward + the LM head's 2·T·d·V)."""
    tokens = batch * length
    head = 2 * tokens * shape.hidden_size * shape.vocab_size
    if name == "llama_sdpa":
        body = llama_forward_flops(shape, batch, length, intermediate or llama_intermediate(shape))
    else:
        body = gau_forward_flops(shape, tokens)
    return 3 * (body + head)


def train_step(side: Side, input_ids: torch.Tensor) -> torch.Tensor:
    """Gradients dropped, forward, the chunked loss on the final hidden states, backward; the loss."""
    side.model.zero_grad(set_to_none=True)
    hidden = side.backbone(input_ids=input_ids).last_hidden_state
    loss = chunked_cross_entropy(hidden, side.head.weight, input_ids, bias=side.head.bias)
    loss.backward()
    return loss.detach()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(side: Side, shape: SideBySideShape, batch: int, length: int, device: str) -> dict[str, Any]:
    """``warmups`` then ``repeats`` timed steps of ``side``: the row's times, loss and peak memory."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, shape.vocab_size, (batch, length), generator=generator).to(device)
    for _ in range(shape.warmups):
        train_step(side, input_ids)
    synchronize(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(shape.repeats):
        synchronize(device)
        start = time.perf_counter()
        loss = train_step(side, input_ids)
        synchronize(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"times_ms": [round(t * 1e3, 3) for t in times], "loss": round(float(loss), 4),
            "peak_gib": None if peak is None else round(peak, 3)}


def row_numbers(measured: dict[str, Any], flops: int, tokens: int,
                peak_tflops: float | None) -> dict[str, Any]:
    """Median ms, tokens/s, FLOPs a step, achieved TFLOP/s and MFU of a measured row."""
    seconds = statistics.median(measured["times_ms"]) / 1e3
    achieved = flops / seconds / 1e12
    return {"ms": round(seconds * 1e3, 3), "tokens_per_s": round(tokens / seconds), "flops": flops,
            "achieved_tflops": round(achieved, 6),
            "mfu": None if not peak_tflops else round(achieved / peak_tflops, 4)}


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


@dataclass
class SideBySideRun:
    """What ``run_side_by_side`` has so far, as the results file's ``settings``, ``models`` and ``rows``."""

    settings: dict[str, Any]
    models: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]]

    def as_results(self) -> dict[str, Any]:
        return {"settings": self.settings, "models": self.models, "rows": self.rows, "targets": TARGETS}


def settings_of(shape: SideBySideShape, device: str, dtype: torch.dtype, peak_tflops: float | None,
                peak_source: str) -> dict[str, Any]:
    return {**asdict(shape), "rows": [list(row) for row in shape.rows], "llama_layers": shape.llama_layers,
            "llama_intermediate": llama_intermediate(shape), "device": device,
            "dtype": str(dtype).removeprefix("torch."), "peak_tflops": peak_tflops,
            "peak_source": peak_source,
            "loss": "chunked_cross_entropy of the final hidden states and the LM head (hf_attn_variants."
                    "models.losses), input ids as labels, on every side",
            "flops": "formula (bench/side_by_side.py): 3 × forward; GAU layer 2Td(2e+s) + 2Ted + Tg(s+e) + "
                     "4Tse; Llama layer 8Td² + 6Tdi + 2Tnd; LM head 2TdV"}


def measure_row(name: str, shape: SideBySideShape, batch: int, length: int, device: str,
                dtype: torch.dtype, peak_tflops: float | None, run: SideBySideRun) -> dict[str, Any]:
    """Build model ``name``, record its parameters in ``run.models`` (once), measure one row; a failure
    (out of memory, a missing peer) is a row with status ``failed`` and the reason."""
    row: dict[str, Any] = {"model": name, "gau_kernel": GAU_KERNELS.get(name), "batch": batch,
                           "length": length, "tokens": batch * length}
    if name == "ours_triton" and (reason := triton_skip_reason()) is not None:
        return {**row, "status": "skipped", "reason": reason}
    side = None
    try:
        side = build_side(name, shape, device, dtype)
        run.models.setdefault(name, {"gau_kernel": GAU_KERNELS.get(name),
                                     "parameters": parameter_counts(side)})
        measured = measure(side, shape, batch, length, device)
        flops = step_flops(name, shape, batch, length, run.settings["llama_intermediate"])
        row.update(status="ok", **row_numbers(measured, flops, batch * length, peak_tflops), **measured)
    except Exception as error:  # noqa: BLE001 - recorded in the row; the other rows still run
        row.update(status="failed", reason=f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
    finally:
        del side
        free_memory(device)
    return row


BUDGET_REASON = "the stage's time budget would be exceeded"
"""The reason of a row ``run_side_by_side`` skipped for its caller's budget."""


def run_side_by_side(shape: SideBySideShape, device: str, dtype: torch.dtype, *,
                     peak_tflops: float | None = None, peak_source: str = "",
                     fits: Callable[[float], bool] | None = None,
                     on_row: Callable[[SideBySideRun], None] | None = None,
                     log: Callable[[str], None] = print) -> SideBySideRun:
    """Every (batch, n) of ``shape.rows`` × ``MODELS``. ``fits(seconds)``: whether a row predicted to take
    that long still fits the caller's budget (the prediction: the slowest row so far that was not a model's
    first, which compiles its kernels; before there is one, the slowest first row); a row that does not is
    recorded as skipped, with ``BUDGET_REASON``. ``on_row(run)`` after every row (the GPU check writes its
    file there)."""
    run = SideBySideRun(settings_of(shape, device, dtype, peak_tflops, peak_source), {}, [])
    slowest, first_rows, measured = 0.0, 0.0, set()  # a model's first row compiles its kernels
    for batch, length in shape.rows:
        for name in MODELS:
            predicted = slowest or first_rows  # first rows only until a model has a second one
            if fits is not None and predicted and not fits(predicted):
                run.rows.append({"model": name, "gau_kernel": GAU_KERNELS.get(name), "batch": batch,
                                 "length": length, "tokens": batch * length, "status": "skipped",
                                 "reason": BUDGET_REASON})
                continue
            started = time.monotonic()
            row = measure_row(name, shape, batch, length, device, dtype, peak_tflops, run)
            took = time.monotonic() - started
            if name in measured:
                slowest = max(slowest, took)
            else:
                first_rows = max(first_rows, took)
            measured.add(name)
            run.rows.append(row)
            log(f"side by side {batch}×{length} {name}: " + (
                f"{row['ms']:.1f} ms, {row['tokens_per_s']:.0f} tok/s, MFU {row['mfu']}, peak "
                f"{row['peak_gib']} GiB" if row["status"] == "ok"
                else f"{row['status']}: {row.get('reason')}"))
            if on_row is not None:
                on_row(run)
    return run


__all__ = ["BUDGET_REASON", "GPU_SHAPE", "MODELS", "SMOKE_SHAPE", "TARGETS", "SideBySideRun",
           "SideBySideShape", "build_side", "equal_llama_width", "llama_intermediate", "parameter_counts",
           "run_side_by_side", "step_flops"]
