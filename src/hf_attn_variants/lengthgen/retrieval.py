"""One run of a retrieval task (passkey, MQAR): its plan, model, training and evaluation at many lengths.

A run is one variant × position scheme × seed, trained as a causal LM on the task's examples at length L
(``tasks.make_batch``, a fresh batch per step from the stream of the run's seed; loss on the answer tokens
only) and evaluated by exact-match accuracy (``tasks.score``) at every evaluation length on ``eval_samples``
examples that are the same for every run (the stream of ``eval_seed`` and the length). Nothing but
``<output_dir>/runs/<series>/seed_<s>/result.json`` is kept (the models are small and retrained in seconds): a
run whose stored fingerprint matches is skipped on a rerun; a run interrupted in training (SIGTERM/SIGUSR1)
raises ``TrainingPreempted`` without a checkpoint and is redone from the start by the same command.

The models: the families through ``AutoModelForCausalLM.from_config`` (causal: their causal-LM heads set
``is_decoder``), the stock Llama through ``LlamaConfig`` (``base_length`` = L kept as an extra attribute for
its ``entropy_invariant`` evaluation modes); vocabulary = the task's, dropout as ``hidden_dropout_prob`` (0
for the tasks).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .runfolders import fingerprint
from .tasks import BOS, COPY, PAD, TASK_WEIGHT_DECAY, TaskSpec, answer_hits, make_batch, score
from .variants import (
    EvalMode,
    Variant,
    config_fields,
    get_variant,
    max_length_of,
    resolved_config,
    position_applies,
    with_position,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped when the meaning of stored task results changes, so stale runs are redone."""
EVAL_STREAM = 7_919
"""Offset of the evaluation streams from the training streams (seed ``eval_seed * EVAL_STREAM + length``)."""


def task_spec(args: Any) -> TaskSpec:
    """The ``TaskSpec`` of the study's flags."""
    return TaskSpec(args.task, args.task_vocab_size, args.passkey_digits, args.num_kv_pairs,
                    args.task_bos is not False)


def task_config(variant: Variant, fields: dict[str, Any], vocab_size: int) -> Any:
    """The config of ``variant`` for a task of ``vocab_size`` tokens (a family config, or a ``LlamaConfig``);
    the config class's own ``ValueError`` for a bad field."""
    from transformers import AutoConfig, LlamaConfig

    special = {"vocab_size": vocab_size, "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": None}
    if variant.model_type == "llama":
        return LlamaConfig(**special, **fields)
    return AutoConfig.for_model(variant.model_type, **special, **fields)


def study_variants(args: Any) -> list[Any]:
    """The variants of the study with their position schemes, in report order (the Llama once: RoPE only)."""
    out = []
    for position in args.position_embedding_types:
        for name in args.variants:
            variant = get_variant(name)
            if position_applies(variant, position):
                out.append(with_position(variant, position))
    return out


@dataclass
class TaskRunPlan:
    """Everything that identifies one task run."""

    variant: Variant
    seed: int
    fields: dict[str, Any]
    run_dir: Path
    fingerprint: str

    @property
    def model_dir(self) -> Path:
        """Where ``--save_models`` keeps the trained model."""
        return self.run_dir / "model"


def plan_task_run(variant: Variant, seed: int, args: Any) -> TaskRunPlan:
    """The plan of ``variant`` (already carrying its position scheme) × ``seed`` under the study ``args``."""
    fields = config_fields(variant, args.size, args.train_length)
    task = asdict(task_spec(args))
    bos = task.pop("bos")
    # Runs with BOS, the default weight decay and no copy warm-up keep the keys they had before those flags
    # existed.
    settings = {**({} if bos else {"bos": False}),
                **({} if args.weight_decay is None else {"weight_decay": args.weight_decay}),
                **({"copy_warmup_steps": args.copy_warmup_steps} if args.copy_warmup_steps else {})}
    key = {
        "version": FORMAT_VERSION, "task": {**task, **settings}, "variant": variant.name, "fields": fields,
        "config": resolved_config(variant, fields) if variant.model_type != "llama" else fields, "seed": seed,
        "train_length": args.train_length, "steps": args.max_train_steps,
        "batch": args.per_device_train_batch_size,
        "lr": args.learning_rate, "warmup": args.num_warmup_steps, "lengths": args.eval_lengths,
        "eval_samples": args.eval_samples, "eval_seed": args.eval_seed,
        "modes": [asdict(mode) for mode in variant.eval_modes],
    }
    run_dir = Path(args.output_dir) / "runs" / variant.name / f"seed_{seed}"
    return TaskRunPlan(variant, seed, fields, run_dir, fingerprint(key))


def build_model(plan: TaskRunPlan, spec: TaskSpec) -> Any:
    """A freshly initialised causal LM of ``plan`` (seeded by the run's seed)."""
    from transformers import AutoModelForCausalLM, set_seed

    set_seed(plan.seed)
    config = task_config(plan.variant, plan.fields, spec.vocab_size)
    if plan.variant.model_type == "llama":
        config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config)


def train_task_model(model: Any, plan: TaskRunPlan, spec: TaskSpec, args: Any,
                     stop: Any = None) -> dict[str, Any]:
    """Train ``model`` for ``max_train_steps`` (AdamW, ``--weight_decay``, linear warm-up and decay), the
    first ``copy_warmup_steps`` of them on the copy warm-up; returns the training summary (seconds, final
    loss, loss curve). ``TrainingPreempted`` after a stop signal (of ``stop``, the caller's
    ``StopSignals``, else of its own)."""
    from transformers import get_linear_schedule_with_warmup

    from ..training.preemption import TrainingPreempted, stop_signals

    decay = TASK_WEIGHT_DECAY if args.weight_decay is None else args.weight_decay
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=decay)
    schedule = get_linear_schedule_with_warmup(optimizer, args.num_warmup_steps, args.max_train_steps)
    batch_size, curve, started = args.per_device_train_batch_size, [], time.perf_counter()
    every = max(1, args.max_train_steps // 20)
    model.train()
    with stop_signals(stop) as active:
        for step in range(args.max_train_steps):
            example = COPY if step < args.copy_warmup_steps else spec.task
            batch = make_batch(spec, args.train_length, plan.seed, step * batch_size, batch_size, example)
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % every == 0 or step + 1 == args.max_train_steps:
                curve.append((step + 1, round(loss.item(), 4)))
            if active.requested:
                raise TrainingPreempted("lengthgen", active.signal_name, step + 1, None,
                                        note="a task run is short and is redone from the start by the same "
                                             "command")
    model.eval()
    return {"steps": args.max_train_steps, "copy_warmup_steps": args.copy_warmup_steps,
            "seconds": time.perf_counter() - started,
            "final_train_loss": curve[-1][1] if curve else None, "loss_curve": curve}


def attention_heads(config: Any) -> int:
    """The attention maps per layer a model computes: its heads; GAU's one shared map."""
    return 1 if config.model_type == "gau" else getattr(config, "num_attention_heads", 1)


def eval_batch_size(length: int, model: Any, memory_gib: float, samples: int) -> int:
    """Sequences per evaluation batch at ``length`` so that the attention maps (heads × n² floats, three live
    copies) and activations fit ``memory_gib``; at least 1, at most ``samples``."""
    config = model.config
    heads = attention_heads(config)
    per_sequence = 4 * (3 * heads * length * length + 64 * length * config.hidden_size)
    return max(1, min(samples, int(memory_gib * 2**30 // per_sequence)))


@torch.no_grad()
def accuracy_at(model: Any, spec: TaskSpec, length: int, args: Any) -> dict[str, Any]:
    """The task metrics (``tasks.score``) of ``model`` on the ``eval_samples`` examples at ``length``."""
    batch_size = eval_batch_size(length, model, args.eval_memory_gib, args.eval_samples)
    hits = []
    for start in range(0, args.eval_samples, batch_size):
        count = min(batch_size, args.eval_samples - start)
        batch = make_batch(spec, length, args.eval_seed * EVAL_STREAM + length, start, count)
        logits = model(input_ids=batch["input_ids"]).logits
        hits.append(answer_hits(logits, batch["input_ids"], batch["answer_positions"]))
    return {**score(spec.task, torch.cat(hits)), "batch_size": batch_size}


def load_mode(model: Any, plan: TaskRunPlan, mode: EvalMode) -> Any:
    """``model`` set up for evaluation mode ``mode`` (the stock Llama: an attention implementation and config
    updates, on the same weights; ``base_length`` = L)."""
    if mode.attn_implementation is None and not mode.config_updates:
        return model
    model.config.base_length = plan.fields.get("base_length")
    for key, value in mode.config_updates.items():
        setattr(model.config, key, value)
    model.set_attn_implementation(mode.attn_implementation)
    return model


def evaluate_task_run(model: Any, plan: TaskRunPlan, spec: TaskSpec, args: Any) -> list[dict[str, Any]]:
    """One row per evaluation mode × length: accuracy, exact match, answer accuracy (``n/a`` past a model's
    length)."""
    from .evaluation import na_status

    rows, limit = [], max_length_of(plan.variant, plan.fields)
    for mode in plan.variant.eval_modes:
        model = load_mode(model, plan, mode)
        for length in args.eval_lengths:
            row: dict[str, Any] = {"series": plan.variant.series(mode), "variant": plan.variant.name,
                                   "model_type": plan.variant.model_type, "mode": mode.name,
                                   "objective": args.task,
                                   "seed": plan.seed, "length": int(length),
                                   "ratio": length / args.train_length}
            if limit is not None and length > limit:
                row.update(status=na_status(limit))
            else:
                row.update(status="ok", **accuracy_at(model, spec, int(length), args))
            rows.append(row)
    return rows


def run_task(plan: TaskRunPlan, args: Any, stop: Any = None) -> dict[str, Any]:
    """Train and evaluate one run (``stop``: as for ``train_task_model``); returns what ``result.json``
    stores."""
    spec = task_spec(args)
    model = build_model(plan, spec)
    train = train_task_model(model, plan, spec, args, stop)
    if args.save_models:
        model.save_pretrained(plan.model_dir)
    started = time.perf_counter()
    rows = evaluate_task_run(model, plan, spec, args)
    train["eval_seconds"] = time.perf_counter() - started
    params = {"total": model.num_parameters(), "non_embedding": model.num_parameters(exclude_embeddings=True)}
    logger.info("%s seed %d: %.0f s training, %.0f s evaluation, accuracy at L %s", plan.variant.name,
                plan.seed,
                train["seconds"], train["eval_seconds"],
                [round(r["accuracy"], 3) for r in rows if r["length"] == args.train_length
                 and r["status"] == "ok"])
    return {"fingerprint": plan.fingerprint, "variant": plan.variant.name, "seed": plan.seed,
            "model_type": plan.variant.model_type, "description": plan.variant.description,
            "objective": args.task,
            "position_embedding_type": plan.variant.position,
            "config_fields": plan.fields, "parameters": params,
            "train": {k: v for k, v in train.items() if k != "loss_curve"}, "loss_curve": train["loss_curve"],
            "rows": rows}


__all__ = [
    "EVAL_STREAM",
    "FORMAT_VERSION",
    "TaskRunPlan",
    "accuracy_at",
    "attention_heads",
    "build_model",
    "eval_batch_size",
    "evaluate_task_run",
    "load_mode",
    "plan_task_run",
    "run_task",
    "study_variants",
    "task_config",
    "task_spec",
    "train_task_model",
]
