"""Training loops side by side: ``pretrain``'s loop (``training/pretrain.py``, accelerate) against
transformers' ``Trainer`` on the same model, data, batch and optimizer settings, in tokens per second (issue
23).

What both loops get (built from ``pretrain``'s own pieces, so that they can only differ in the loop):

- the model: the family config from the embedded WordPiece tokenizer (``causal_tokenizer`` for CLM) with the
  bench preset's widths and dropout 0, built by ``build_lm_model`` right after ``set_seed(seed)``, as
  ``pretrain`` builds it: the same initial weights;
- the data: the embedded corpus cut into blocks by ``group_into_blocks``, read through ``IndexedBlocks`` and
  ``collate_blocks`` in ``EpochShuffleSampler``'s order (the ``Trainer``'s sampler is replaced by it); CLM
  labels are the input ids; MLM inputs and targets come from ``mask_tokens`` seeded per block with
  ``mix_seed(seed, epoch, block)`` as ``pretrain`` seeds them;
- AdamW with ``PretrainArguments``' values (learning rate, betas, ε, weight decay on matrices only: the
  ``Trainer``'s decay set is replaced by the same one), clipping, a linear schedule, the same number of steps;
  no evaluation, checkpoint, log row or progress bar inside the timed steps (``pretrain`` logs and evaluates
  once, after its last step; the ``Trainer`` logs nothing); one process on CPU.

The ``Trainer`` keeps everything else of its own: its optimizer choice (``adamw_torch_fused`` with torch ≥
2.8), its loop, callbacks and accelerate wrapping. ``pretrain`` applies an MLM head to the masked positions
only (``TargetOnlyMLMLoss``: same loss and gradients), the ``Trainer`` the model's full head: the MLM ratio
includes that, the CLM ratio is the loop alone.

Timing (``StepClock``): a global optimizer post-step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``) records the wall and process CPU clocks after
every optimizer step, in both loops alike, so a step is the same interval on both sides: from the end of one
optimizer step to the end of the next (book-keeping, data loading, forward, backward, clipping, AdamW). Setup
(tokenization, model, accelerate) and the first ``warmup_steps`` steps are not timed. A run's value is its
mean time per timed step (tokens/s = tokens per step ÷ that); a round runs every loop once, in an order
rotated each round (``measure_loops``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from ..cli_utils import quiet_progress
from ..training.arguments import PretrainArguments
from ..training.corpus import causal_tokenizer
from ..training.data import (
    EpochShuffleSampler,
    IndexedBlocks,
    collate_blocks,
    group_into_blocks,
    load_text_datasets,
    mask_tokens,
    mix_seed,
)
from ..training.evaluation import special_token_ids
from ..training.modeling import build_config, build_lm_model, load_tokenizer
from .specs import LOOP_MODEL_TYPE, LoopSize

SEED = 42
"""``PretrainArguments``' default seed: initial weights, data order and MLM masks of both loops."""


@dataclass(frozen=True)
class LoopJob:
    """One loop to run: ``loop`` (``"pretrain"`` or ``"trainer"``), ``objective`` (``"clm"``/``"mlm"``), the
    model's config overrides and the sizes."""

    loop: str
    objective: str
    model: tuple[tuple[str, Any], ...]
    size: LoopSize
    seed: int = SEED

    def arguments(self, output_dir: str) -> PretrainArguments:
        """The ``PretrainArguments`` of this run; the ``Trainer``'s settings are taken from them too."""
        size = self.size
        return PretrainArguments(
            output_dir=output_dir, model_type=LOOP_MODEL_TYPE, objective=self.objective,
            config_overrides=dict(self.model), max_seq_length=size.length,
            per_device_train_batch_size=size.batch_size,
            max_train_steps=size.steps, logging_steps=size.steps, max_eval_samples=1, disable_tqdm=True,
            seed=self.seed, overwrite_output_dir=True,
        )


@dataclass
class LoopRun:
    """What one run of a loop measured: mean seconds per timed step on both clocks, the mean training loss
    over all its steps, the optimizer steps it made and the model's parameter count."""

    wall: float
    cpu: float
    train_loss: float
    steps: int
    parameters: int


@dataclass
class LoopOutcome:
    """Every round's ``LoopRun`` of one loop, or the error that stopped it."""

    runs: list[LoopRun] = field(default_factory=list)
    error: str | None = None


class StepClock:
    """While open, records ``(perf_counter, process_time)`` after every step of any torch optimizer."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = []
        self._handle: Any = None

    def __enter__(self) -> Self:
        self._handle = register_optimizer_step_post_hook(self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _record(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.stamps.append((time.perf_counter(), time.process_time()))

    def mean_step(self, warmup_steps: int) -> tuple[float, float]:
        """Mean (wall, CPU) seconds of the steps after the first ``warmup_steps`` (≥ 1)."""
        timed = len(self.stamps) - warmup_steps
        if warmup_steps < 1 or timed < 1:
            raise RuntimeError(f"{len(self.stamps)} optimizer steps recorded: too few for {warmup_steps} "
                               "warm-up step(s) and one timed step.")
        (wall0, cpu0), (wall1, cpu1) = self.stamps[warmup_steps - 1], self.stamps[-1]
        return (wall1 - wall0) / timed, (cpu1 - cpu0) / timed


@contextlib.contextmanager
def _on_cpu() -> Iterator[None]:
    """accelerate's ``ACCELERATE_USE_CPU=1`` in the block, so ``pretrain``'s ``Accelerator`` stays on CPU."""
    previous = os.environ.get("ACCELERATE_USE_CPU")
    os.environ["ACCELERATE_USE_CPU"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("ACCELERATE_USE_CPU", None)
        else:
            os.environ["ACCELERATE_USE_CPU"] = previous


# ---------------------------------------------------------------------------------------------- pretrain
def run_pretrain(job: LoopJob, folder: str) -> LoopRun:
    """``pretrain(PretrainArguments(...))`` into ``folder``, timed by ``StepClock``."""
    from ..training.pretrain import pretrain

    with StepClock() as clock:
        result = pretrain(job.arguments(folder))
    rows = [json.loads(line) for line in Path(result.log_file).read_text().splitlines() if line.strip()]
    info = json.loads((Path(folder) / "pretrain_args.json").read_text())
    wall, cpu = clock.mean_step(job.size.warmup_steps)
    return LoopRun(wall, cpu, float(rows[-1]["loss"]), result.completed_steps, int(info["num_parameters"]))


# ---------------------------------------------------------------------------------------------- Trainer
class LoopTrainer(Trainer):
    """``Trainer`` reading the blocks in ``pretrain``'s order and decaying the same parameters."""

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return EpochShuffleSampler(len(dataset), self.args.seed)

    def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
        """Matrices (ndim ≥ 2), as ``pretrain.parameter_groups``."""
        return [name for name, p in model.named_parameters() if p.ndim >= 2]


@dataclass(frozen=True)
class LoopData:
    """The ``Trainer``'s tokenizer, config and training blocks: ``pretrain``'s ``setup`` built again."""

    tokenizer: Any
    config: Any
    blocks: Any


@functools.lru_cache(maxsize=4)
def trainer_data(objective: str, model: tuple[tuple[str, Any], ...], length: int) -> LoopData:
    """Tokenizer, config and training blocks as ``pretrain`` builds them (cached: untimed setup)."""
    tokenizer = load_tokenizer(None)
    if objective == "clm":
        tokenizer = causal_tokenizer(tokenizer)
    config = build_config(LOOP_MODEL_TYPE, config_overrides=dict(model), tokenizer=tokenizer,
                          max_seq_length=length)
    with quiet_progress():
        raw = load_text_datasets(None, None)
        eos = tokenizer.eos_token_id if objective == "clm" else None
        blocks = group_into_blocks(raw["train"], tokenizer, length, None, eos)
    return LoopData(tokenizer, config, blocks)


def block_collator(job: LoopJob, data: LoopData,
                   probability: float) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    """Batches of ``input_ids`` and ``labels`` as ``pretrain`` makes them (``micro_batch_inputs``; MLM: masks
    of ``probability``, epoch 0, which ``check_one_epoch`` guarantees)."""
    special = special_token_ids(data.tokenizer)

    def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = collate_blocks(items)
        input_ids = batch["input_ids"]
        if job.objective == "clm":
            return {"input_ids": input_ids, "labels": input_ids}
        seeds = [mix_seed(job.seed, 0, int(i)) for i in batch["index"]]
        inputs, labels = mask_tokens(input_ids, seeds, mask_token_id=data.tokenizer.mask_token_id,
                                     vocab_size=data.config.vocab_size, special_ids=special,
                                     probability=probability)
        return {"input_ids": inputs, "labels": labels}

    return collate


def check_one_epoch(job: LoopJob, blocks: int) -> None:
    """``ValueError`` unless the run stays within the first epoch (the MLM collator seeds masks for epoch
    0)."""
    if job.size.steps * job.size.batch_size > blocks:
        raise ValueError(f"{job.size.steps} steps of {job.size.batch_size} blocks need more than the "
                         f"{blocks} training blocks of one epoch.")


def training_arguments(args: PretrainArguments, folder: str) -> TrainingArguments:
    """The ``Trainer``'s arguments: ``args``' optimizer, schedule, batch, steps and seed; no evaluation,
    saving, logging, reporting or progress bar; CPU."""
    return TrainingArguments(
        output_dir=folder, max_steps=args.max_train_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        learning_rate=args.learning_rate, weight_decay=args.weight_decay, adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon, max_grad_norm=args.max_grad_norm,
        lr_scheduler_type=args.lr_scheduler_type, warmup_steps=args.num_warmup_steps, seed=args.seed,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, remove_unused_columns=False, dataloader_pin_memory=False,
    )


def run_trainer(job: LoopJob, folder: str) -> LoopRun:
    """``Trainer.train()`` on the model, blocks and settings of ``job``, timed by ``StepClock``."""
    from accelerate.utils import set_seed

    args = job.arguments(folder)
    data = trainer_data(job.objective, job.model, job.size.length)
    check_one_epoch(job, len(data.blocks))
    set_seed(args.seed)
    with quiet_progress():
        model = build_lm_model(data.config, job.objective)
    trainer = LoopTrainer(model=model, args=training_arguments(args, folder),
                          train_dataset=IndexedBlocks(data.blocks),
                          data_collator=block_collator(job, data, args.mlm_probability))
    trainer.remove_callback(PrinterCallback)
    with StepClock() as clock:
        output = trainer.train()
    wall, cpu = clock.mean_step(job.size.warmup_steps)
    return LoopRun(wall, cpu, float(output.training_loss), output.global_step,
                   sum(p.numel() for p in model.parameters()))


# ---------------------------------------------------------------------------------------------- rounds
def run_loop(job: LoopJob) -> LoopRun:
    """One run of ``job`` in a temporary output folder, on CPU, with the caller's torch thread count."""
    threads = torch.get_num_threads()
    runner = run_pretrain if job.loop == "pretrain" else run_trainer
    try:
        with tempfile.TemporaryDirectory(prefix=f"bench-{job.loop}-") as folder, _on_cpu(), quiet_progress():
            return runner(job, folder)
    finally:
        torch.set_num_threads(threads)


def measure_loops(jobs: dict[str, LoopJob], repeats: int,
                  log: Callable[[str], None] = print) -> dict[str, LoopOutcome]:
    """``repeats`` rounds; each runs every job once (order rotated by one per round). A job that raises is
    reported in its outcome and left out of the later rounds."""
    outcomes = {name: LoopOutcome() for name in jobs}
    for round_index in range(repeats):
        alive = [name for name in jobs if outcomes[name].error is None]
        shift = round_index % max(len(alive), 1)
        for name in alive[shift:] + alive[:shift]:
            try:
                run = run_loop(jobs[name])
            except Exception as error:  # noqa: BLE001 - reported in the results, the other loops go on
                outcomes[name].error = (f"round {round_index}: {type(error).__name__}: "
                                        f"{str(error).splitlines()[0][:200]}")
                log(f"    {name} FAILED: {outcomes[name].error}")
                continue
            outcomes[name].runs.append(run)
            size = jobs[name].size
            log(f"    {name:<14} round {round_index + 1}/{repeats}: {1e3 * run.cpu:7.1f} ms CPU, "
                f"{1e3 * run.wall:7.1f} ms wall per step, {size.tokens_per_step / run.cpu:7.0f} tokens/s "
                f"(CPU), mean loss {run.train_loss:.4f}")
    return outcomes


__all__ = [
    "SEED",
    "LoopData",
    "LoopJob",
    "LoopOutcome",
    "LoopRun",
    "LoopTrainer",
    "StepClock",
    "measure_loops",
    "run_loop",
    "run_pretrain",
    "run_trainer",
    "trainer_data",
]
