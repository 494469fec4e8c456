"""What ``pretrain`` and ``finetune`` tell a person at both ends of a run; the loss curve ``pretrain`` draws.

- At the start (``start_summary``): the model (family, objective, parameters with and without the embeddings),
  the device and processes (and ``torch.compile``'s backend and mode under ``--torch_compile``), the tokens
  per optimizer step, the steps to do, the checkpoint cadence, and a rough estimate of the time the run takes
  (``estimate_seconds``), stated before the first step: the default model is BERT-base sized, which a laptop
  CPU trains at seconds per step.
- At the end (``end_summary``): the steps and tokens trained, tokens per second, the final train and eval loss
  with their perplexities, the output folder, the loss curve, and the next command (export, or load).
- ``finetune`` (``FinetunePlan``, ``finetune_start_summary``, ``finetune_end_summary``): the task, model and
  parameters (trainable ones under LoRA), the examples, labels and steps ahead, the evaluation and checkpoint
  cadence; at the end the steps and time, the validation metrics, what was written where, and the next
  command.
- ``plot_loss_curve``: ``loss_curve.png`` from ``train_log.jsonl`` (train loss per logged row, eval loss where
  evaluated), when matplotlib (the ``plots`` extra) is installed.

The estimate. A step costs about ``model_flops_per_token`` × tokens per step floating-point operations
(``throughput.py``: 6·N + attention). ``device_matmul_flops`` times a matrix product of the model's width on
the device (at least 1024 × 256 @ 256 × 1024; a few milliseconds), and a training step is taken to reach
``STEP_EFFICIENCY`` of that rate: the kernels around the products (norms, activations, softmax, the optimizer)
are slower per FLOP. It is a rough figure, printed as such: for the default GAU (46.8M parameters, 8 × 128
tokens per step) on the shared 2-core CPU of the development machine it said 4 s per step, and the steps took
4 to 7 s. Below ``OVERHEAD_BOUND_STEP_SECONDS`` per step it is printed as a lower bound: such small steps
cost their operators' fixed costs. The progress bar's ETA follows the real steps from the first one.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STEP_EFFICIENCY = 0.25
"""The share of a plain matrix product's FLOP rate that a training step reaches (see the module docstring)."""
PLOT_FILE = "loss_curve.png"


@dataclass(frozen=True)
class RunPlan:
    """What ``start_summary`` states: the model, where it runs, and how much training is ahead."""

    model_type: str
    objective: str
    parameters: int
    non_embedding_parameters: int
    device: str
    processes: int
    batch_size: int
    """Sequences per optimizer step over every process (per-device batch × processes × accumulation)."""
    sequence_length: int
    start_step: int
    max_steps: int
    checkpoint_cadence: str
    estimated_seconds: float | None = None
    compiled: str | None = None
    """How the model is compiled (``"torch.compile (inductor)"``), ``None`` when it runs eagerly."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens trained on per optimizer step."""
        return self.batch_size * self.sequence_length


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """``(total, non-embedding)`` parameters of ``model``: the second leaves out every ``nn.Embedding``'s
    weights (token and position embeddings; a tied LM head shares the token embedding and is counted once)."""
    total = sum(p.numel() for p in model.parameters())
    embedding_ids = {id(p) for module in model.modules() if isinstance(module, torch.nn.Embedding)
                     for p in module.parameters()}
    embedding = sum(p.numel() for p in model.parameters() if id(p) in embedding_ids)
    return total, total - embedding


def short_count(value: float) -> str:
    """``1234567`` → ``"1.23M"``; ``5300`` → ``"5.3k"``; small numbers as they are."""
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def duration(seconds: float) -> str:
    """``42.0`` → ``"42 s"``, ``150`` → ``"2.5 min"``, ``7200`` → ``"2.0 h"``."""
    if seconds < 90:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def device_matmul_flops(device: torch.device, rows: int, width: int, repeats: int = 5) -> float:
    """FLOP/s of a float32 product ``(rows × width) @ (width × 4·width)`` on ``device``, the best of
    ``repeats`` timed runs after one warm-up.

    Rows are taken in [1024, 4096] and the width in [256, 1024]: a smaller product times the threads'
    start and, on a busy CPU, a scheduler quantum (a 64 × 32 product took 15 ms on a shared 2-core CPU, the
    estimate 368 h for a run of minutes), not the device's speed."""
    rows, width = max(1024, min(rows, 4096)), max(256, min(width, 1024))
    generator = torch.Generator(device="cpu").manual_seed(0)  # the global RNG stays untouched
    a = torch.rand(rows, width, generator=generator).to(device)
    b = torch.rand(width, 4 * width, generator=generator).to(device)
    best = math.inf
    for index in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index:
            best = min(best, time.perf_counter() - started)
    return 2.0 * rows * width * 4 * width / max(best, 1e-9)


def estimate_seconds(flops_per_token: float, tokens_per_step_per_process: int, steps: int,
                     matmul_flops: float) -> float:
    """Rough seconds for ``steps`` optimizer steps (module docstring): FLOPs per step over
    ``STEP_EFFICIENCY`` × the device's matrix-product rate."""
    return steps * flops_per_token * tokens_per_step_per_process / (STEP_EFFICIENCY * matmul_flops)


def start_summary(plan: RunPlan) -> list[str]:
    """The lines ``pretrain`` prints before its first step."""
    steps = plan.max_steps - plan.start_step
    where = f"{plan.device}, {plan.processes} process{'es' * (plan.processes > 1)}"
    if plan.compiled:
        where += f", compiled with {plan.compiled}: the first step compiles"
    ahead = f"{steps:,} step{'s' * (steps != 1)}"
    if plan.start_step:
        ahead += f" ({plan.max_steps:,} in all, resuming after step {plan.start_step:,})"
    lines = [
        f"{plan.model_type} {plan.objective.upper()}: {short_count(plan.parameters)} parameters "
        f"({short_count(plan.non_embedding_parameters)} without the embeddings) on {where}",
        f"{plan.batch_size} sequences × {plan.sequence_length} tokens = {plan.tokens_per_step:,} tokens per "
        f"step; {ahead}; {plan.checkpoint_cadence}",
    ]
    if plan.estimated_seconds is not None and steps > 0:
        lines.append(estimate_line(plan.estimated_seconds, steps))
    return lines


OVERHEAD_BOUND_STEP_SECONDS = 0.05
"""Below this estimate per step, a step's time follows its operators' fixed costs more than its FLOPs."""


def estimate_line(seconds: float, steps: int) -> str:
    """The start summary's line of ``estimate_seconds``' figure for ``steps`` steps (a lower bound where the
    steps are small enough for per-operator costs to rule)."""
    per_step = seconds / steps
    if per_step < OVERHEAD_BOUND_STEP_SECONDS:
        figure = (f"at least {duration(seconds)} ({duration(per_step)} per step, from this device's "
                  "matrix-product speed; steps this small are bound by per-operator costs instead)")
    elif seconds < 60:
        figure = "under a minute from this device's matrix-product speed"
    else:
        figure = (f"{duration(seconds)} ({duration(per_step)} per step) from this device's matrix-product "
                  "speed")
    return f"rough time estimate: {figure}; the progress bar's ETA follows the real steps"


def perplexity(loss: float | None) -> str:
    """``exp(loss)`` for the summary (``"inf"`` past float range)."""
    if loss is None:
        return "n/a"
    try:
        return f"{math.exp(loss):.4g}"
    except OverflowError:
        return "inf"


def loss_text(name: str, loss: float | None) -> str:
    """``"train loss 2.3456 (perplexity 10.44)"``, or ``"no train loss"``."""
    if loss is None:
        return f"no {name} loss"
    return f"{name} loss {loss:.4f} (perplexity {perplexity(loss)})"


def auto_class_for(objective: str) -> str:
    """The Auto class that loads a pretrain run's model."""
    return "AutoModelForCausalLM" if objective == "clm" else "AutoModelForMaskedLM"


def export_command(model: str | Path, run: str | Path) -> str:
    """The command that exports the model folder ``model`` of the run in ``run`` to ``<run>-hub`` (``.`` and
    ``..`` by their absolute paths: ``.-hub`` would be a hidden folder)."""
    folder = Path(run) if Path(run).name not in ("", "..") else Path(run).resolve()  # "." and ".." unnamed
    target = f"{str(folder).rstrip('/') or '/run'}-hub"  # the root: /run-hub
    return f"hf-attn-variants export --model_name_or_path {model} --output_dir {target}"


def end_summary(output_dir: str, objective: str, steps: int, tokens: int, seconds: float, total: float,
                train_loss: float | None, eval_loss: float | None, plot: Path | None) -> list[str]:
    """The lines ``pretrain`` prints when its model is written: ``seconds`` of training (the rate's, without
    evaluation and checkpoints, as ``train_log.jsonl``'s), ``total`` with them and the saving."""
    rate = tokens / seconds if seconds > 0 else 0.0
    folder = str(output_dir)
    curve = f"; loss curve {plot}" if plot is not None else (
        "; no loss curve (matplotlib is not installed: pip install 'hf_attn_variants[plots]')")
    return [
        f"trained {steps:,} steps, {tokens:,} tokens in {duration(seconds)} of training ({rate:,.0f} "
        f"tokens/s; {duration(total)} in all, with evaluation and saving)",
        f"{loss_text('train', train_loss)}, {loss_text('eval', eval_loss)}",
        f"wrote the model, its tokenizer and train_log.jsonl to {folder}{curve}",
        f"next: {export_command(folder, folder)}",
        f"  or: {auto_class_for(objective)}.from_pretrained({json.dumps(folder)}, trust_remote_code=True)",
    ]


@dataclass(frozen=True)
class FinetunePlan:
    """What ``finetune_start_summary`` states."""

    task: str
    model_type: str
    source: str | None
    """``--model_name_or_path``; ``None`` for a model built from scratch."""
    parameters: int
    trainable: int
    lora_r: int
    device: str
    processes: int
    train_examples: int | None
    """``None`` when the run only evaluates."""
    eval_examples: int | None
    labels: int | None
    """``None`` for regression."""
    steps: int
    batch_size: int
    """Examples per optimizer step over every process."""
    cadence: str
    resume_from: str | None = None


def updates_per_epoch(examples: int, batch_per_process: int, processes: int, accumulation: int) -> int:
    """Optimizer steps in one epoch of ``examples``, as ``Trainer`` counts them: batches per process, then
    whole accumulations (a last partial one counts)."""
    batches = math.ceil(examples / max(batch_per_process * processes, 1))
    return max(math.ceil(batches / max(accumulation, 1)), 1)


def finetune_start_summary(plan: FinetunePlan) -> list[str]:
    """The lines ``finetune`` prints before its first step."""
    origin = f"from {plan.source}" if plan.source else "from scratch (random weights)"
    trainable = (f", {short_count(plan.trainable)} of them trained (LoRA r={plan.lora_r})" if plan.lora_r
                 else "")
    where = f"{plan.device}, {plan.processes} process{'es' * (plan.processes > 1)}"
    labels = "regression" if plan.labels is None else f"{plan.labels} labels"
    lines = [f"{plan.task} with {plan.model_type} {origin}: {short_count(plan.parameters)} parameters"
             f"{trainable}; {labels}; on {where}"]
    evaluated = f"{plan.eval_examples:,} validation examples" if plan.eval_examples is not None else ""
    if plan.train_examples is None:
        lines.append(f"evaluates the model as it is on {evaluated}; no training")
        return lines
    ahead = f"{plan.steps:,} step{'s' * (plan.steps != 1)} of {plan.batch_size} examples"
    if plan.resume_from:
        ahead += f" in all, resuming from {plan.resume_from}"
    lines.append(f"{plan.train_examples:,} training examples" + (f", {evaluated}" if evaluated else "")
                 + f"; {ahead}; {plan.cadence}")
    return lines


def metrics_text(metrics: dict[str, Any], prefix: str = "eval_") -> str:
    """``"eval_accuracy 0.875, eval_f1 0.8571, eval_loss 0.4123"``: the validation metrics (no runtime or
    sample counts), or ``"no evaluation"``."""
    skipped = ("runtime", "samples_per_second", "steps_per_second", "samples", "epoch")
    shown = [(k, v) for k, v in sorted(metrics.items())
             if k.startswith(prefix) and not k.removeprefix(prefix).startswith(skipped)
             and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return ", ".join(f"{k} {v:.4g}" for k, v in shown) or "no evaluation"


def finetune_end_summary(output_dir: str, metrics: dict[str, Any], steps: tuple[int, int] | None,
                         seconds: float, loss: str | None, lora: bool, merged: bool) -> list[str]:
    """The lines ``finetune`` prints when its outputs are written. ``steps``: ``(trained in this process,
    the run's last step)``, ``None`` when it only evaluated; ``loss``: what to say of the training loss
    (``finetune.loss_line``)."""
    folder = str(output_dir).rstrip("/") or str(output_dir)
    lines = []
    if steps is not None:
        trained, last = steps
        upto = f" (up to step {last:,})" if last != trained else ""
        said = f"; {loss}" if loss else ""
        lines.append(f"trained {trained:,} step{'s' * (trained != 1)}{upto} in {duration(seconds)}{said}")
    lines.append(metrics_text(metrics))
    if steps is None:
        lines.append(f"wrote eval_results.json to {folder}")
        return lines
    what = "the LoRA adapter" if lora else "the model"
    lines.append(f"wrote {what}, its tokenizer, task_config.json and the results (all_results.json) to "
                 f"{folder}" + (f", and the merged model to {folder}/merged" if merged else ""))
    if lora and not merged:
        lines.append(f"next: hf_attn_variants.training.finetune.load_finetuned({json.dumps(folder)}); "
                     "--lora_merge also writes a full model to export")
    else:
        lines.append(f"next: {export_command(f'{folder}/merged' if merged else folder, folder)}")
    return lines


def print_lines(command: str, lines: list[str]) -> None:
    """Summary lines on stdout, each after ``<command>:``."""
    for line in lines:
        print(f"{command}: {line}", flush=True)


def read_rows(log_path: Path) -> list[dict[str, Any]]:
    """The rows of ``train_log.jsonl``."""
    if not log_path.is_file():
        return []
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


def plot_loss_curve(log_path: Path, output: Path, title: str) -> Path | None:
    """Draw ``output`` (a PNG): train loss per logged step and eval loss where evaluated, from
    ``log_path``; ``None`` (nothing drawn) without matplotlib or without rows."""
    rows = read_rows(log_path)
    if not rows or importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train loss", linewidth=1.2)
    evaluated = [r for r in rows if "eval_loss" in r]
    if evaluated:
        axes.plot([r["step"] for r in evaluated], [r["eval_loss"] for r in evaluated], "o-",
                  label="eval loss", linewidth=1.2, markersize=3)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


__all__ = ["PLOT_FILE", "STEP_EFFICIENCY", "FinetunePlan", "RunPlan", "auto_class_for", "device_matmul_flops",
           "duration", "end_summary", "estimate_seconds", "export_command", "finetune_end_summary",
           "finetune_start_summary", "loss_text", "metrics_text", "parameter_counts", "perplexity",
           "plot_loss_curve", "print_lines", "read_rows", "short_count", "start_summary", "updates_per_epoch"]
