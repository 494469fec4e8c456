"""``hf-attn-variants pretrain``: MLM or CLM pretraining of any family with ``accelerate``.

Flags follow transformers' ``examples/pytorch/language-modeling/run_mlm_no_trainer.py``. The same loop
runs in one process, under ``accelerate launch`` (DDP, FSDP; see ``scripts/accelerate/``) or in-process
through the Python API ``pretrain(PretrainArguments(...))``.

Exact resume. Every source of randomness in a training step is a pure function of the run's seed and the
position in the data, never of what ran before in the process:
- data order: ``EpochShuffleSampler`` (permutation seeded with seed + epoch); after a resume the epoch's
  already-seen batches are skipped with ``accelerator.skip_first_batches``;
- MLM masks: per block, seeded with ``mix_seed(seed, epoch, block index)`` (see ``data.mask_tokens``);
- dropout: the global torch RNG is reseeded before every micro-batch with
  ``mix_seed(seed, "step", global micro-batch index, process index)``.
Checkpoints (``accelerator.save_state`` into ``output_dir/checkpoints/step_<k>``: model safetensors, AdamW
state, scheduler, RNG states, plus ``training_state.json``) are written to a temporary folder and renamed,
so a killed run never leaves a partial checkpoint. Resuming from step k therefore reproduces the losses of
an uninterrupted run bit for bit (same process count and batch sizes), and ``train_log.jsonl`` is cut back
to the rows with step ≤ k first. The log is also flushed at each checkpoint step so that logging windows
never straddle a checkpoint.

Mixed-length pretraining (``mixed_length_splits``; Su 2022, "听说Attention与Softmax更配哦~", the second
remedy for key-count-normalised attention): each micro-batch's blocks are cut into k equal pieces, k drawn
per micro-batch with ``mix_seed(seed, "split", …)`` — identical on every rank and after a resume.

MLM loss on the targets only: for this package's ``*ForMaskedLM`` the training module is
``TargetOnlyMLMLoss``, which applies the LM head to the masked positions only (same loss and gradients;
the head is most of a small model's compute). Checkpoints then hold ``model.``-prefixed keys; the final
``save_pretrained`` writes the plain model.

Gradient accumulation is explicit: a window of ``gradient_accumulation_steps`` micro-batches (shorter at
the end of an epoch) is averaged by dividing each micro-batch loss by the window size; DDP gradient
all-reduce is skipped (``accelerator.no_sync``) except on the window's last micro-batch. The scheduler
steps once per optimizer step (not once per process, as a prepared scheduler would).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import SchedulerType

from .cli_utils import (
    FlagError,
    check_int,
    check_model_folder,
    check_number,
    check_output_dir,
    check_percentage,
    check_positive,
    check_seed,
    quiet_progress,
)
from .corpus import CORPUS_DESCRIPTION, CORPUS_NAME, causal_tokenizer
from .data import (
    EpochShuffleSampler,
    IndexedBlocks,
    collate_blocks,
    group_into_blocks,
    holds_tokens,
    load_text_datasets,
    mask_tokens,
    mix_seed,
)
from .evaluation import evaluate_lm, special_token_ids
from .modeling import (
    TargetOnlyMLMLoss,
    build_config,
    build_lm_model,
    check_model_type,
    has_target_only_mlm_head,
    load_tokenizer,
)

logger = logging.getLogger(__name__)

SCHEDULER_TYPES = tuple(s.value for s in SchedulerType if s.value not in ("reduce_lr_on_plateau", "greedy"))
LOG_FILE = "train_log.jsonl"
CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "training_state.json"


@dataclass
class PretrainArguments:
    """Arguments of ``pretrain`` (each field is also a ``--flag``; names follow run_mlm_no_trainer.py)."""

    output_dir: str = field(metadata={"help": "Where the final model, train_log.jsonl and checkpoints go."})
    model_type: str | None = field(
        default=None, metadata={"help": "Family to train from scratch: entropy_invariant, gau or synthesizer."}
    )
    config_overrides: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": 'Config fields as "k=v,k=v", e.g. "hidden_size=64,num_hidden_layers=2" '
                  '(lists in brackets: "synthesizer_components=[random,vanilla]"). From Python also a dict.'},
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder/file to start from."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A pretrained model folder to continue training (else from scratch)."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer folder; default: the embedded pydoc WordPiece tokenizer."}
    )
    objective: Literal["mlm", "clm"] = field(
        default="mlm", metadata={"help": "mlm (masked LM, bidirectional) or clm (causal LM)."}
    )
    train_file: str | None = field(
        default=None, metadata={"help": "Local .txt/.json/.jsonl/.csv/.parquet; default: the embedded corpus."}
    )
    validation_file: str | None = field(default=None, metadata={"help": "Local validation file (same format)."})
    text_column_name: str | None = field(default=None, metadata={"help": "Text column (default: text / first)."})
    validation_split_percentage: int = field(
        default=5, metadata={"help": "Held-out %% of train_file when there is no validation_file."}
    )
    max_seq_length: int = field(default=128, metadata={"help": "Block length the texts are grouped into."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per process."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Evaluation batch size per process."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak AdamW learning rate."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (not on biases/norms/gains)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW β1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW β2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW ε."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 = off)."})
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "Learning-rate schedule after warm-up.", "choices": SCHEDULER_TYPES}
    )
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps in total; overrides num_train_epochs."}
    )
    num_train_epochs: int = field(default=3, metadata={"help": "Epochs when max_train_steps is not set."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    checkpointing_steps: str | None = field(
        default=None, metadata={"help": 'Save a checkpoint every N optimizer steps, or "epoch".'}
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": 'A checkpoint folder, or "latest" (newest under output_dir/checkpoints).'}
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, data order, masks and dropout."})
    with_tracking: bool = field(default=False, metadata={"help": "Log to TensorBoard under output_dir/tensorboard."})
    mixed_precision: Literal["no", "fp16", "bf16"] = field(
        default="no", metadata={"help": "Autocast precision (fp16 needs a GPU; bf16 works on recent CPUs)."}
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens selected for MLM."})
    mixed_length_splits: list[int] | None = field(
        default=None,
        metadata={"help": "Mixed-length pretraining (Su 2022's second remedy for relu² GAU): each micro-batch's "
                  "blocks are cut into k equal shorter blocks, k drawn per micro-batch from this list "
                  "(deterministic in seed and step; each k must divide max_seq_length; tokens per step unchanged)."},
    )
    logging_steps: int = field(default=10, metadata={"help": "Write a train_log.jsonl row every N steps."})
    eval_steps: int | None = field(
        default=None, metadata={"help": "Also evaluate every N steps (always: each epoch end and the last step)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N train blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation blocks."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for datasets.map."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bars (training and datasets.map)."})

    def __post_init__(self) -> None:
        """Check every value that needs no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it.
        Paths, data and the model config are checked by ``pretrain`` before it writes anything."""
        if self.model_type is None and self.config_name is None and self.model_name_or_path is None:
            raise FlagError("model_type", "Pass --model_type (entropy_invariant, gau, synthesizer, …), "
                                          "--config_name or --model_name_or_path.")
        if self.model_type is not None:
            check_model_type(self.model_type)
        _choice("objective", self.objective, ("mlm", "clm"))
        _choice("mixed_precision", self.mixed_precision, ("no", "fp16", "bf16"))
        _choice("lr_scheduler_type", self.lr_scheduler_type, SCHEDULER_TYPES)
        for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                     "num_train_epochs", "gradient_accumulation_steps", "logging_steps"):
            check_positive(name, getattr(self, name))
        for name in ("max_train_steps", "eval_steps", "max_train_samples", "max_eval_samples",
                     "preprocessing_num_workers"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        check_int("num_warmup_steps", self.num_warmup_steps, 0)
        check_percentage("validation_split_percentage", self.validation_split_percentage)
        check_seed("seed", self.seed)
        check_number("mlm_probability", self.mlm_probability, 0, 1, open_low=True, open_high=True)
        check_number("learning_rate", self.learning_rate, 0, open_low=True)
        check_number("weight_decay", self.weight_decay, 0)
        check_number("adam_beta1", self.adam_beta1, 0, 1, open_high=True)
        check_number("adam_beta2", self.adam_beta2, 0, 1, open_high=True)
        check_number("adam_epsilon", self.adam_epsilon, 0, open_low=True)
        check_number("max_grad_norm", self.max_grad_norm, 0)
        for name in ("validation_file", "text_column_name"):
            if getattr(self, name) is not None and self.train_file is None:
                raise FlagError(name, f"{name} needs a train_file (the embedded corpus is one text column).")
        if self.mixed_length_splits is not None:
            splits = list(self.mixed_length_splits)
            if not splits or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                 or self.max_seq_length % k for k in splits):
                raise FlagError("mixed_length_splits",
                                f"mixed_length_splits must be positive integers dividing max_seq_length="
                                f"{self.max_seq_length}, got {self.mixed_length_splits}.")
            self.mixed_length_splits = splits
        if self.checkpointing_steps is not None:
            value = str(self.checkpointing_steps)
            if value != "epoch" and not (value.isdigit() and int(value) > 0):
                raise FlagError("checkpointing_steps",
                                f'checkpointing_steps must be a positive integer or "epoch", got {value!r}.')
            self.checkpointing_steps = value


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise FlagError(name, f"{name} must be one of {allowed}, got {value!r}.")


@dataclass
class PretrainResult:
    """What ``pretrain`` returns: the output folder, the step reached and the final evaluation."""

    output_dir: str
    completed_steps: int
    metrics: dict[str, float]
    log_file: str


def make_accelerator(mixed_precision: str = "no", log_with: str | None = None, project_dir: str | None = None) -> Any:
    """An ``Accelerator``. Outside a distributed launch, accelerate's process-wide state from an earlier
    in-process run (another precision, a Trainer) is cleared first, so the API can be called repeatedly."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        AcceleratorState._reset_state()
        GradientState._reset_state()
    return Accelerator(mixed_precision=mixed_precision, log_with=log_with, project_dir=project_dir)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices (ndim ≥ 2), none on biases, norm gains and per-head scalars."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def find_checkpoint(output_dir: str, name: str) -> Path:
    """Resolve ``--resume_from_checkpoint``: a folder, or ``latest`` = the highest step under output_dir."""
    if name != "latest":
        path = Path(name)
        if not (path / STATE_FILE).exists():
            raise FlagError("resume_from_checkpoint",
                            f"resume_from_checkpoint: {name!r} is not a checkpoint folder (no {STATE_FILE}).")
        return path
    root = Path(output_dir) / CHECKPOINT_DIR
    found = [p for p in root.glob("*") if (p / STATE_FILE).exists()] if root.exists() else []
    if not found:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint='latest' but there is no checkpoint under {root}.")
    return max(found, key=lambda p: json.loads((p / STATE_FILE).read_text())["completed_steps"])


def save_checkpoint(accelerator: Any, output_dir: str, name: str, state: dict[str, Any]) -> Path:
    """``accelerator.save_state`` into ``checkpoints/.<name>.tmp``, then an atomic rename to ``<name>``."""
    root = Path(output_dir) / CHECKPOINT_DIR
    final, staging = root / name, root / f".{name}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / STATE_FILE).write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    accelerator.wait_for_everyone()
    return final


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only the rows of ``train_log.jsonl`` with ``step <= last_step`` (after a resume)."""
    if not path.exists():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def _training_blocks(args: PretrainArguments, tokenizer: Any, accelerator: Any) -> dict[str, Any]:
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    bars = is_progress_bar_enabled()
    if args.disable_tqdm and bars:
        disable_progress_bar()
    try:
        return _load_blocks(args, tokenizer, accelerator)
    finally:
        if args.disable_tqdm and bars:
            enable_progress_bar()


def _load_blocks(args: PretrainArguments, tokenizer: Any, accelerator: Any) -> dict[str, Any]:
    with accelerator.main_process_first():
        eos = tokenizer.eos_token_id if args.objective == "clm" else None
        with quiet_progress():  # the checks: a bad file prints its one error line alone
            raw = load_text_datasets(
                args.train_file,
                args.validation_file,
                text_column_name=args.text_column_name,
                validation_split_percentage=args.validation_split_percentage,
            )
            if not holds_tokens(raw["train"], tokenizer, args.max_seq_length, eos):
                raise FlagError("train_file" if args.train_file else "max_seq_length",
                                f"The training data holds fewer than max_seq_length={args.max_seq_length} tokens.")
        blocks = {
            split: group_into_blocks(raw[split], tokenizer, args.max_seq_length, args.preprocessing_num_workers, eos)
            for split in ("train", "validation")
        }
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit is not None and len(blocks[split]) > limit:
            blocks[split] = blocks[split].select(range(limit))
    if len(blocks["train"]) == 0:
        raise FlagError("train_file" if args.train_file else "max_seq_length",
                        f"The training data holds fewer than max_seq_length={args.max_seq_length} tokens.")
    return blocks


def _language_model(module: torch.nn.Module) -> torch.nn.Module:
    """The ``*ForMaskedLM``/``*ForCausalLM`` inside the (unwrapped) training module."""
    return module.model if isinstance(module, TargetOnlyMLMLoss) else module


def pretrain(args: PretrainArguments) -> PretrainResult:
    """Run MLM/CLM pretraining as described in the module docstring; returns a ``PretrainResult``.

    Writes to ``args.output_dir``: the model (safetensors + remote code + config), the tokenizer,
    ``train_log.jsonl`` (step, epoch, loss, lr, grad_norm, eval_* when evaluated), ``all_results.json``,
    ``pretrain_args.json`` and ``checkpoints/``. Nothing is written before the output folder, tokenizer,
    config, checkpoint, data and model are checked: a bad one raises ``FlagError`` naming its argument.
    """
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    check_output_dir("output_dir", args.output_dir)
    if args.model_name_or_path is not None:
        check_model_folder("model_name_or_path", args.model_name_or_path, weights=True)
    if args.with_tracking:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
            raise FlagError("with_tracking",
                            "with_tracking logs to TensorBoard, which is not installed (pip install tensorboard).")
    accelerator = make_accelerator(
        args.mixed_precision, "tensorboard" if args.with_tracking else None, args.output_dir
    )
    main = accelerator.is_main_process
    if not main:
        import datasets
        import transformers

        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    output_dir = Path(args.output_dir)

    set_seed(args.seed)
    tokenizer = load_tokenizer(args.tokenizer_name)
    if args.objective == "clm":  # prompts must not end with EOS: the saved tokenizer adds BOS only
        tokenizer = causal_tokenizer(tokenizer)
    config = build_config(
        args.model_type,
        config_name=args.config_name,
        model_name_or_path=args.model_name_or_path,
        config_overrides=args.config_overrides,
        tokenizer=tokenizer,
        max_seq_length=args.max_seq_length,
    )
    checkpoint = find_checkpoint(args.output_dir, args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    blocks = _training_blocks(args, tokenizer, accelerator)
    eval_blocks = blocks["validation"] if len(blocks["validation"]) > 0 else None
    set_seed(args.seed)  # (again) so that the initialisation depends on the seed only
    with quiet_progress():
        model = build_lm_model(config, args.objective, args.model_name_or_path)
    if args.objective == "mlm" and has_target_only_mlm_head(model):
        model = TargetOnlyMLMLoss(model)  # the MLM head runs on the masked positions only
    if main:  # every input is valid: from here on the run writes
        output_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()

    sampler = EpochShuffleSampler(len(blocks["train"]), args.seed)
    train_loader = DataLoader(
        IndexedBlocks(blocks["train"]),
        batch_size=args.per_device_train_batch_size,
        sampler=sampler,
        collate_fn=collate_blocks,
    )
    optimizer = torch.optim.AdamW(
        parameter_groups(model, args.weight_decay),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
    )
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    batches_per_epoch = len(train_loader)
    ga = args.gradient_accumulation_steps
    updates_per_epoch = math.ceil(batches_per_epoch / ga)
    max_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    num_epochs = math.ceil(max_steps / updates_per_epoch)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_steps,
    )
    accelerator.register_for_checkpointing(scheduler)

    log_path = output_dir / LOG_FILE
    completed = 0
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        completed = json.loads((checkpoint / STATE_FILE).read_text())["completed_steps"]
        if main:
            truncate_log(log_path, completed)
            logger.info("Resumed from %s at step %d", checkpoint, completed)
    elif main and log_path.exists():
        log_path.unlink()
    accelerator.wait_for_everyone()

    if args.with_tracking:
        hparams = {k: v for k, v in asdict(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("tensorboard", hparams)

    special_ids = special_token_ids(tokenizer)
    ckpt_every = int(args.checkpointing_steps) if (args.checkpointing_steps or "").isdigit() else None
    progress = tqdm(total=max_steps, initial=completed, disable=args.disable_tqdm or not accelerator.is_local_main_process,
                    desc=f"pretrain {config.model_type} ({args.objective})")
    started = time.perf_counter()
    window_loss = torch.zeros((), device=accelerator.device)
    log_loss, log_updates = torch.zeros((), device=accelerator.device), 0
    metrics: dict[str, float] = {}
    last_row: dict[str, Any] = {}

    def evaluate() -> dict[str, float]:
        if eval_blocks is None:
            return {}
        result = evaluate_lm(
            _language_model(accelerator.unwrap_model(model)), eval_blocks, objective=args.objective, tokenizer=tokenizer,
            batch_size=args.per_device_eval_batch_size, mlm_probability=args.mlm_probability,
            seed=args.seed, accelerator=accelerator,
        )
        model.train()
        keys = ("loss", "perplexity", "accuracy") if args.objective == "mlm" else ("loss", "perplexity")
        return {f"eval_{k}": result[k] for k in keys}

    start_epoch = completed // updates_per_epoch
    for epoch in range(start_epoch, num_epochs):
        if completed >= max_steps:
            break
        model.train()
        train_loader.set_epoch(epoch)
        sampler.set_epoch(epoch)
        skip = (completed - epoch * updates_per_epoch) * ga
        loader = accelerator.skip_first_batches(train_loader, skip) if skip > 0 else train_loader
        micro = skip
        for batch in loader:
            torch.manual_seed(mix_seed(args.seed, "step", epoch * batches_per_epoch + micro, accelerator.process_index))
            window_start = micro // ga * ga
            window = min(ga, batches_per_epoch - window_start)
            micro += 1
            sync = micro - window_start == window
            input_ids = batch["input_ids"]
            if args.objective == "mlm":
                seeds = [mix_seed(args.seed, epoch, int(i)) for i in batch["index"]]
                input_ids, labels = mask_tokens(
                    input_ids, seeds, mask_token_id=tokenizer.mask_token_id, vocab_size=config.vocab_size,
                    special_ids=special_ids, probability=args.mlm_probability,
                )
            else:
                labels = input_ids
            if args.mixed_length_splits:  # cut each block into k shorter ones (masks drawn on the full block)
                splits = args.mixed_length_splits
                k = splits[mix_seed(args.seed, "split", epoch * batches_per_epoch + micro) % len(splits)]
                input_ids, labels = (t.reshape(-1, t.shape[1] // k) for t in (input_ids, labels))
            with contextlib.nullcontext() if sync else accelerator.no_sync(model):
                loss = model(input_ids=input_ids, labels=labels).loss
                accelerator.backward(loss / window)
            window_loss += loss.detach().float() / window
            if not sync:
                continue

            grad_norm = None
            if args.max_grad_norm > 0:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            if not accelerator.optimizer_step_was_skipped:
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            completed += 1
            progress.update(1)
            log_loss += window_loss
            log_updates += 1
            window_loss.zero_()

            epoch_end = micro == batches_per_epoch
            ckpt_name = None
            if ckpt_every and completed % ckpt_every == 0:
                ckpt_name = f"step_{completed}"
            elif args.checkpointing_steps == "epoch" and epoch_end:
                ckpt_name = f"epoch_{epoch}"
            eval_due = (
                completed == max_steps or epoch_end or (args.eval_steps and completed % args.eval_steps == 0)
            )
            if eval_due or ckpt_name or completed % args.logging_steps == 0:
                mean_loss = accelerator.reduce(log_loss / log_updates, reduction="mean")
                row = {
                    "step": completed,
                    "epoch": round(completed / updates_per_epoch, 4),
                    "loss": float(mean_loss),
                    "lr": scheduler.get_last_lr()[0],
                }
                if grad_norm is not None:
                    row["grad_norm"] = float(grad_norm)
                if eval_due:
                    metrics = evaluate()
                    row.update(metrics)
                row["elapsed_s"] = round(time.perf_counter() - started, 3)
                log_loss.zero_()
                log_updates = 0
                last_row = row
                progress.set_postfix(loss=f"{row['loss']:.4f}")
                if main:
                    with log_path.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                if args.with_tracking:
                    accelerator.log({k: v for k, v in row.items() if k != "step"}, step=completed)
            if ckpt_name:
                save_checkpoint(accelerator, args.output_dir, ckpt_name, {"completed_steps": completed, "epoch": epoch})
            if completed >= max_steps:
                break
    progress.close()

    if not metrics and completed > 0:
        metrics = evaluate()
    accelerator.wait_for_everyone()
    unwrapped = _language_model(accelerator.unwrap_model(model))
    state_dict = accelerator.get_state_dict(model)
    if state_dict is not None and unwrapped is not accelerator.unwrap_model(model):
        state_dict = {key.removeprefix("model."): value for key, value in state_dict.items()}
    unwrapped.save_pretrained(
        args.output_dir, is_main_process=main, save_function=accelerator.save, state_dict=state_dict
    )
    if main:
        tokenizer.model_max_length = unwrapped.config.max_position_embeddings
        tokenizer.save_pretrained(args.output_dir)
        results = {**metrics, "train_loss": last_row.get("loss"), "step": completed,
                   "epoch": round(completed / updates_per_epoch, 4)}
        (output_dir / "all_results.json").write_text(json.dumps(results, indent=2))
        info = {
            **asdict(args),
            "model_type": unwrapped.config.model_type,
            "num_parameters": sum(p.numel() for p in unwrapped.parameters()),
            "dataset": CORPUS_NAME if args.train_file is None else args.train_file,
            "dataset_name": "pydoc_data.topics (Python Language Reference)" if args.train_file is None
            else Path(args.train_file).name,
            "dataset_description": CORPUS_DESCRIPTION if args.train_file is None else f"local file {args.train_file}",
            "train_blocks": len(blocks["train"]),
            "validation_blocks": len(blocks["validation"]),
            "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "mixed_precision": accelerator.mixed_precision,
        }
        (output_dir / "pretrain_args.json").write_text(json.dumps(info, indent=2))
    if args.with_tracking:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    return PretrainResult(str(output_dir), completed, metrics, str(log_path))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``PretrainArguments`` field."""
    from .cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, PretrainArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: train; a bad flag value (``FlagError``, raised before anything is written) gives one
    error line naming the flag and exit status 2."""
    from .cli_utils import dataclasses_from_namespace, fail_flag

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_attn_variants").setLevel(logging.INFO)
    try:
        (args,) = dataclasses_from_namespace(namespace, PretrainArguments)
        pretrain(args)
    except FlagError as error:
        return fail_flag("pretrain", error)
    return 0


__all__ = ["PretrainArguments", "PretrainResult", "add_arguments", "find_checkpoint", "pretrain", "run"]
