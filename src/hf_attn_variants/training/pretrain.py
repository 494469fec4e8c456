"""``hf-attn-variants pretrain``: MLM or CLM pretraining of any family, with ``accelerate`` or sharded.

Flags follow transformers' ``examples/pytorch/language-modeling/run_mlm_no_trainer.py``
(``arguments.PretrainArguments``). The same loop runs in one process, under ``accelerate launch`` /
``torchrun`` (DDP, accelerate's FSDP; see ``scripts/accelerate/``), in-process through the Python API
``pretrain(PretrainArguments(...))``, or — with ``--fsdp_size`` / ``--tp_size`` / ``--dp_replicate_size``
under ``torchrun`` — on a model sharded by Transformers' ``DistributedConfig`` (FSDP2, tensor parallelism,
HSDP; CPU and GPU; ``sharded.py``). The loop talks to a ``runtime.TrainingRuntime`` (``AccelerateRuntime`` or
``ShardedRuntime``) for everything that differs between the two.

Structure: ``check_arguments`` → ``make_runtime`` → ``setup`` (the output folder and the checkpoint to resume,
tokenizer, config, data, model, optimizer, scheduler → ``TrainingSetup``) → ``restore`` (checkpoint) →
``train`` (``train_epoch`` → per micro-batch ``micro_batch_inputs`` and ``forward_backward``, per update
``optimizer_step`` and ``after_update``: ``log_row``, ``evaluate``, ``save_checkpoint``) → ``save_outputs``.

Exact resume. Every source of randomness in a training step is a pure function of the run's seed and the
position in the data, never of what ran before in the process:
- data order: ``EpochShuffleSampler`` (permutation seeded with seed + epoch); after a resume the epoch's
  already-seen batches are skipped (``accelerator.skip_first_batches``; sharded: the batch sampler's
  ``skip``);
- MLM masks: per block, seeded with ``mix_seed(seed, epoch, block index)`` (see ``data.mask_tokens``);
- dropout: the global torch RNG is reseeded before every micro-batch with
  ``mix_seed(seed, "step", global micro-batch index, data-parallel rank)``.
Checkpoints (``output_dir/checkpoints/step_<k>``: model safetensors, AdamW state, scheduler and RNG states in
files that load without unpickling anything — ``safe_state.py`` — plus ``training_state.json`` with the size
and sha256 of every file; ``checkpoints.py``) are written to a temporary folder and renamed, so a killed run
never leaves a partial checkpoint, a checkpoint damaged later is named by its bad file, and a save that fails
(a full disk) leaves the earlier ones intact. One run writes an output folder at a time (``runlock.py``).
Resuming from step k therefore reproduces the losses of an uninterrupted run bit for bit (same process count
and batch sizes), and ``train_log.jsonl`` is cut back to the rows with step ≤ k first. The log is also flushed
at each checkpoint step so that logging windows never straddle a checkpoint.

Streaming (``--streaming``; ``sources.py``, ``streaming.py``). The data is a ``datasets.IterableDataset`` read
as training goes: each data-parallel rank tokenizes and packs its own part of the stream (``TrainStream``),
the run is one "epoch" of ``--max_train_steps`` updates (the stream starts its next pass by itself), MLM masks
are seeded per block by the block's run-wide number, and every checkpoint also holds each rank's stream
position and packer buffer (``data_state/``), so a resume continues on exactly the next block.
``--packing documents`` (either way of reading) gives the blocks ``position_ids`` restarting at every
document; they go to the model with the inputs. Every ``train_log.jsonl`` row has ``tokens`` and
``tokens_per_second`` (and ``mfu`` where the peak is known; ``throughput.py``).

Re-runs and preemption (``outputs.py``, ``preemption.py``). Rerunning the same command resumes from the newest
complete checkpoint in ``--output_dir`` (one line says which); a folder holding a finished model or another
run's files is refused before anything is written, unless ``--overwrite_output_dir``. On SIGTERM/SIGUSR1 every
rank finishes the same optimizer step, writes its checkpoint, and the command exits with
``PREEMPTED_EXIT_CODE`` (75); on Ctrl-C at the command line the same, with ``INTERRUPTED_EXIT_CODE`` (130).
Checkpoints come every ``--checkpointing_minutes`` (10) besides ``--checkpointing_steps``, and carry the
model's ``config.json`` and the tokenizer (``checkpoint_model.py``: ``export`` takes them). A rerun that finds
no checkpoint keeps the earlier attempt's ``train_log.jsonl`` as ``train_log.earlier-<k>.jsonl``. From the
command line the run prints what it will do before its first step and what it did at the end, and draws
``loss_curve.png`` (``summary.py``). ``--save_total_limit N`` keeps the newest N checkpoints and the one
resumed from.

No fixed cost per step. ``--torch_compile`` compiles the training module in place (``compile_model``; the
checkpoints and the final model are the plain module's). Between logging steps nothing is read back from the
device: the loaders yield host tensors, ``micro_batch_inputs`` makes the inputs on the host and ``to_device``
copies them without blocking; the loss stays on the device until ``log_row``; the ranks agree on stop signals
and timed checkpoints only at the steps ``preemption.Agreement`` picks (``agree``).
``tests/test_host_syncs.py`` holds the loop to it.

Mixed-length pretraining (``mixed_length_splits``; Su 2022, "听说Attention与Softmax更配哦~", the second
remedy for key-count-normalised attention): each micro-batch's blocks are cut into k equal pieces, k drawn
per micro-batch with ``mix_seed(seed, "split", …)`` — identical on every rank and after a resume.

MLM loss on the targets only: for this package's ``*ForMaskedLM`` the training module is
``TargetOnlyMLMLoss``, which applies the LM head to the masked positions only (same loss and gradients;
the head is most of a small model's compute). Checkpoints then hold ``model.``-prefixed keys; the final
``save_pretrained`` writes the plain model. (Sharded runs use the full head: FSDP2 gathers parameters in the
root module's forward.)

Gradient accumulation is explicit: a window of ``gradient_accumulation_steps`` micro-batches (shorter at
the end of an epoch) is averaged by dividing each micro-batch loss by the window size; DDP gradient
all-reduce is skipped (``accelerator.no_sync``; FSDP2: ``set_requires_gradient_sync``) except on the
window's last micro-batch. The scheduler
steps once per optimizer step (not once per process, as a prepared scheduler would).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ..cli_utils import FlagError, check_model_source, check_output_dir, quiet_progress
from .arguments import SCHEDULER_TYPES, PretrainArguments
from .checkpoint_model import write_model_files
from .checkpoints import (
    AUTOMATIC,
    CHECKPOINT_DIR,
    STATE_FILE,
    announce_resume,
    check_checkpoint_kind,
    find_checkpoint,
    named_checkpoint,
    newest_resumable,
    pretrain_checkpoints,
    read_json_file,
    save_checkpoint,
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
    LM_AUTO_CLASSES,
    TargetOnlyMLMLoss,
    build_config,
    build_lm_model,
    has_target_only_mlm_head,
    load_tokenizer,
)
from .outputs import (
    FolderState,
    OutputRule,
    check_output_folder,
    finish_run,
    json_arguments,
    refuse_foreign_files,
    start_run,
)
from .preemption import (
    PREEMPTED_EXIT_CODE,
    Agreement,
    StopSignals,
    TrainingDiverged,
    TrainingPreempted,
    max_over_ranks,
    run_training_command,
    stop_signals,
)
from .runlock import run_lock
from .runtime import AccelerateRuntime, TrainingRuntime, language_model
from .safe_state import failing_save_raises, legacy_checkpoint_error, training_state_bytes
from .sharded import INITIAL_MODEL_DIR, ShardedRuntime, check_layout, check_parallel_plans, model_class_for
from .sources import (
    load_named_dataset,
    open_stream,
    rank_share,
    rank_token_stream,
    stream_validation_texts,
    training_stream,
)
from .streaming import DATA_STATE_DIR, PackedStream, TrainStream
from .summary import (
    PLOT_FILE,
    RunPlan,
    device_matmul_flops,
    end_summary,
    estimate_seconds,
    parameter_counts,
    plot_loss_curve,
    print_lines,
    start_summary,
)
from .throughput import device_peak_flops, mfu, model_flops_per_token

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"
EARLIER_LOGS = "train_log.earlier-*.jsonl"
"""Where a rerun that finds no checkpoint to resume from keeps the log of the run before it
(``keep_earlier_log``)."""
ARGS_FILE = "pretrain_args.json"


def _legacy_arguments(folder: Path) -> dict[str, Any] | None:
    """The arguments of a finished pretrain folder written before ``run.json``: its ``pretrain_args.json``."""
    info = read_json_file(folder / ARGS_FILE)
    if info is None:
        return None
    names = {f.name for f in fields(PretrainArguments)}
    return {key: value for key, value in info.items() if key in names}


PRETRAIN_RULE = OutputRule(
    command="pretrain",
    aside=frozenset({"max_train_steps", "num_train_epochs", "logging_steps", "eval_steps", "with_tracking",
                     "disable_tqdm", "checkpointing_steps", "checkpointing_minutes", "save_total_limit",
                     "preprocessing_num_workers", "torch_compile", "torch_compile_backend",
                     "torch_compile_mode"}),
    run_files=(CHECKPOINT_DIR, LOG_FILE, EARLIER_LOGS, ARGS_FILE, "all_results.json", "tensorboard",
               PLOT_FILE),
    continue_hint="with checkpoints, --resume_from_checkpoint latest trains it further",
    legacy_arguments=_legacy_arguments,
)
"""``pretrain``'s output folder (``outputs.py``): the step budget, logging and checkpoint cadence, and whether
the model is compiled may differ within one run; every other flag makes another run."""


@dataclass
class PretrainResult:
    """What ``pretrain`` returns: the output folder, the step reached and the final evaluation."""

    output_dir: str
    completed_steps: int
    metrics: dict[str, float]
    log_file: str


@dataclass
class TrainingSetup:
    """Everything ``setup`` builds from the arguments: the fixed inputs of the training loop."""

    args: PretrainArguments
    runtime: TrainingRuntime
    tokenizer: Any
    config: Any
    blocks: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    batches_per_epoch: int
    max_steps: int
    num_epochs: int
    special_ids: list[int]
    checkpoint: Path | None
    """The checkpoint the run resumes from (``--resume_from_checkpoint``, or its folder's newest complete
    one)."""
    stream: TrainStream | None = None
    """``--streaming``: this rank's batches, read as training goes (``blocks["train"]`` is then ``None``)."""
    flops_per_token: float = 0.0
    peak_flops: float | None = None
    """The device's peak FLOP/s (``throughput.device_peak_flops``), ``None`` where unknown: no ``mfu``
    then."""
    target_only: bool = False
    """Whether the training module is ``TargetOnlyMLMLoss`` (its micro-batches carry ``target_index``)."""

    @property
    def output_dir(self) -> Path:
        """``--output_dir``."""
        return Path(self.args.output_dir)

    @property
    def log_path(self) -> Path:
        """``output_dir/train_log.jsonl``."""
        return self.output_dir / LOG_FILE

    @property
    def updates_per_epoch(self) -> int:
        """Optimizer steps per epoch (the last accumulation window of an epoch may be shorter)."""
        return math.ceil(self.batches_per_epoch / self.args.gradient_accumulation_steps)

    @property
    def eval_blocks(self) -> Any:
        """The validation blocks, or ``None`` when there are none."""
        validation = self.blocks["validation"]
        return validation if validation is not None and len(validation) > 0 else None


@dataclass
class LoopState:
    """What changes while training: steps done, loss accumulators, the last row and evaluation."""

    completed: int
    window_loss: torch.Tensor
    log_loss: torch.Tensor
    log_updates: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    last_row: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    """Tokens trained on so far, over every data-parallel rank (kept in the checkpoints)."""
    window_tokens: int = 0
    window_started: float = field(default_factory=time.perf_counter)
    """Tokens trained on since the last ``train_log.jsonl`` row, and when that window began."""
    stop: StopSignals | None = None
    """SIGTERM/SIGUSR1, and Ctrl-C from the command line (``preemption.py``): after the step the ranks next
    agree (``agreement``), every rank checkpoints and stops."""
    agreement: Agreement = field(default_factory=Agreement)
    """The steps after which the ranks agree on stop signals and on a due timed checkpoint: every step in one
    process, about every second of training with several (``preemption.Agreement``)."""
    last_checkpoint: float = field(default_factory=time.perf_counter)
    """When the last checkpoint was written (or the run started): ``--checkpointing_minutes`` counts from
    here."""
    first_completed: int = 0
    first_tokens: int = 0
    """The step and tokens this process started from (a resumed run's checkpoint), for the end summary."""
    train_seconds: float = 0.0
    """Seconds of this process's logging windows: training, without evaluation and checkpoints (the end
    summary's tokens/s, as ``train_log.jsonl``'s)."""


# ---------------------------------------------------------------- small pieces
def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices (ndim ≥ 2), none on biases, norm gains and per-head scalars."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def keep_earlier_log(path: Path) -> Path:
    """Rename the ``train_log.jsonl`` of an earlier run that left no checkpoint to the first free
    ``train_log.earlier-<k>.jsonl`` next to it (never overwritten, never truncated); returns the new path."""
    index = 1
    while (kept := path.with_name(f"train_log.earlier-{index}.jsonl")).exists():
        index += 1
    path.rename(kept)
    return kept


def truncate_log(path: Path, last_step: int) -> None:
    """Keep only the rows of ``train_log.jsonl`` with ``step <= last_step`` (after a resume)."""
    if not path.exists():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def _training_blocks(args: PretrainArguments, tokenizer: Any, runtime: TrainingRuntime) -> dict[str, Any]:
    """``_load_blocks`` without ``datasets``' progress bars under ``--disable_tqdm``."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    bars = is_progress_bar_enabled()
    if args.disable_tqdm and bars:
        disable_progress_bar()
    try:
        return _load_blocks(args, tokenizer, runtime)
    finally:
        if args.disable_tqdm and bars:
            enable_progress_bar()


def _load_blocks(args: PretrainArguments, tokenizer: Any, runtime: TrainingRuntime) -> dict[str, Any]:
    """The train and validation texts as blocks of ``--max_seq_length`` tokens (``FlagError`` when the
    training data holds fewer), cut to ``--max_train_samples`` / ``--max_eval_samples``."""
    with runtime.main_process_first():
        eos = tokenizer.eos_token_id if args.objective == "clm" else None
        with quiet_progress():  # the checks: a bad file prints its one error line alone
            raw = _raw_texts(args)
            if not holds_tokens(raw["train"], tokenizer, args.max_seq_length, eos):
                raise FlagError(_source_flag(args),
                                "The training data holds fewer than "
                                f"max_seq_length={args.max_seq_length} tokens.")
        blocks = {
            split: group_into_blocks(raw[split], tokenizer, args.max_seq_length,
                                     args.preprocessing_num_workers, eos,
                                     documents=args.packing == "documents")
            for split in ("train", "validation")
        }
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit is not None and len(blocks[split]) > limit:
            blocks[split] = blocks[split].select(range(limit))
    if len(blocks["train"]) == 0:
        raise FlagError(_source_flag(args),
                        f"The training data holds fewer than max_seq_length={args.max_seq_length} tokens.")
    return blocks


def _source_flag(args: PretrainArguments) -> str:
    """The flag an error about the training data names."""
    return "dataset_name" if args.dataset_name else "train_file" if args.train_file else "max_seq_length"


def _raw_texts(args: PretrainArguments) -> Any:
    """The ``text`` ``DatasetDict`` of ``--dataset_name``, ``--train_file`` or the embedded corpus."""
    if args.dataset_name is not None:
        return load_named_dataset(args.dataset_name, args.dataset_config_name,
                                  text_column_name=args.text_column_name,
                                  validation_split_percentage=args.validation_split_percentage)
    return load_text_datasets(args.train_file, args.validation_file, text_column_name=args.text_column_name,
                              validation_split_percentage=args.validation_split_percentage)


def _stream_data(args: PretrainArguments, tokenizer: Any,
                 runtime: TrainingRuntime) -> tuple[TrainStream, Any]:
    """``--streaming``: this rank's ``TrainStream`` and the validation blocks (``sources.py``); ``FlagError``
    when the start of the stream holds fewer than ``--max_seq_length`` tokens. Reads only the examples it
    needs."""
    from datasets import Dataset

    eos = tokenizer.eos_token_id if args.objective == "clm" else None
    with runtime.main_process_first(), quiet_progress():
        train = open_stream(args)
        texts, held_out = stream_validation_texts(args, train)
        if not holds_tokens(training_stream(train, held_out), tokenizer, args.max_seq_length, eos):
            raise FlagError(_source_flag(args),
                            "The training data holds fewer than "
                            f"max_seq_length={args.max_seq_length} tokens.")
        validation = (group_into_blocks(Dataset.from_dict({"text": texts}), tokenizer, args.max_seq_length,
                                        append_eos_id=eos, documents=args.packing == "documents")
                      if texts else None)
    rank, world = runtime.process_index, runtime.num_processes
    check_every_rank_reads(args, rank_share(train, held_out, rank, world), runtime, len(held_out))
    packed = PackedStream(rank_token_stream(train, held_out, tokenizer, eos, rank, world),
                          args.max_seq_length, documents=args.packing == "documents", rank=rank, world=world,
                          name=_source_flag(args))
    return TrainStream(packed, args.per_device_train_batch_size, rank), validation


def check_every_rank_reads(args: PretrainArguments, share: Any, runtime: TrainingRuntime,
                           held_out: int) -> None:
    """``FlagError`` on every rank (one all-reduce) when some data-parallel rank's ``share`` of the stream
    (its text, ``sources.rank_share``) is empty: too few shards or examples for the ranks, or all of a rank's
    examples held out for validation."""
    empty = torch.tensor(float(next(iter(share), None) is None), device=runtime.device)
    ranks = int(runtime.reduce(empty, reduction="sum")) if runtime.num_processes > 1 else int(empty)
    if ranks:
        held = (f" after the {held_out} example(s) held out for validation (--max_eval_samples)" if held_out
                else "")
        raise FlagError(_source_flag(args),
                        f"{_source_flag(args)}: {ranks} of {runtime.num_processes} data-parallel rank(s) get "
                        f"no training example from the stream{held}; give the corpus more examples or shards "
                        "(at least one per rank), or pass --validation_file.")


# ---------------------------------------------------------------- setup
def check_arguments(args: PretrainArguments) -> None:
    """The checks that need files or the launch but no model: output folder, model folder, TensorBoard, and
    for a sharded run the process count (``FlagError`` naming the flag; nothing is written)."""
    check_output_dir("output_dir", args.output_dir)
    if args.model_name_or_path is not None:
        check_model_source("model_name_or_path", args.model_name_or_path, weights=True)
    if args.with_tracking:
        import importlib.util

        if (importlib.util.find_spec("tensorboard") is None
                and importlib.util.find_spec("tensorboardX") is None):
            raise FlagError("with_tracking",
                            "with_tracking logs to TensorBoard, which is not installed (pip install "
                            "tensorboard).")
    if args.layout.sharded:
        check_layout(args.layout)


def make_runtime(args: PretrainArguments) -> TrainingRuntime:
    """``ShardedRuntime`` when a size flag is above 1, else ``AccelerateRuntime``; other processes than the
    main one log errors only."""
    tracking_dir = Path(args.output_dir) / "tensorboard" if args.with_tracking else None
    if args.layout.sharded:
        runtime: TrainingRuntime = ShardedRuntime(args.layout, args.mixed_precision, tracking_dir)
    else:
        runtime = AccelerateRuntime(args.mixed_precision, "tensorboard" if args.with_tracking else None,
                                    args.output_dir)
    if not runtime.is_main_process:
        import datasets
        import transformers

        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    return runtime


def build_or_check_model(args: PretrainArguments, config: Any) -> torch.nn.Module | None:
    """The training module of the accelerate path, with initial weights that depend on the seed only (this
    package's MLMs wrapped in ``TargetOnlyMLMLoss``); for a sharded run ``None``, after checking the family's
    parallel plans on a model on the meta device (the last check: from here on the run writes)."""
    from accelerate.utils import set_seed

    if args.layout.sharded:
        check_parallel_plans(model_class_for(config, LM_AUTO_CLASSES[args.objective])[1], args.layout)
        return None
    set_seed(args.seed)  # (again) so that the initialisation depends on the seed only
    with quiet_progress():
        model = build_lm_model(config, args.objective, args.model_name_or_path)
    if args.objective == "mlm" and has_target_only_mlm_head(model):
        model = TargetOnlyMLMLoss(model)  # the MLM head runs on the masked positions only
    return model


def sharded_model(args: PretrainArguments, config: Any, runtime: TrainingRuntime) -> torch.nn.Module:
    """The model of a sharded run: rank 0 builds the model with the seed into ``checkpoints/.initial_model``
    (or ``--model_name_or_path`` is used), then every rank loads it sharded (``ShardedRuntime.load_model``);
    the MLM head runs on every position there (FSDP2 gathers parameters in the root module's forward, which
    calling ``model.lm_head`` alone would skip)."""
    from accelerate.utils import set_seed

    model_class = model_class_for(config, LM_AUTO_CLASSES[args.objective])[0]
    source = Path(args.model_name_or_path) if args.model_name_or_path else initial_model_dir(args)
    if args.model_name_or_path is None and runtime.is_main_process:
        shutil.rmtree(source, ignore_errors=True)
        set_seed(args.seed)
        with quiet_progress():
            build_lm_model(config, args.objective).save_pretrained(source)
    runtime.wait_for_everyone()
    with quiet_progress():
        return runtime.load_model(model_class, config, source)


def initial_model_dir(args: PretrainArguments) -> Path:
    """Where rank 0 writes the seeded initial model of a sharded run (removed when the run ends)."""
    return Path(args.output_dir) / CHECKPOINT_DIR / INITIAL_MODEL_DIR


def remove_initial_model(args: PretrainArguments) -> None:
    """Remove ``checkpoints/.initial_model`` (and ``checkpoints/`` when that leaves it empty)."""
    folder = initial_model_dir(args)
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent.is_dir() and not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def check_inductor(device: torch.device) -> None:
    """``FlagError`` naming ``torch_compile`` when ``torch.compile``'s default backend (inductor) cannot build
    kernels for ``device``: on a CPU it compiles C++ with ``$CXX`` (default ``g++``; ``clang++`` on macOS),
    on a CUDA GPU it needs Triton."""
    if device.type == "cpu":
        compiler = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
        if shutil.which(compiler) is None:
            raise FlagError("torch_compile",
                            f"torch_compile on the CPU needs a C++ compiler: torch's inductor builds its "
                            f"kernels with {compiler!r} ($CXX), which is not on PATH; install one (e.g. "
                            "apt install g++) or drop --torch_compile.")
    elif device.type == "cuda" and importlib.util.find_spec("triton") is None:
        raise FlagError("torch_compile",
                        "torch_compile on a CUDA GPU needs Triton (torch's inductor writes its kernels in "
                        "it), which is not installed; pip install triton, or drop --torch_compile.")


def compile_model(args: PretrainArguments, model: torch.nn.Module) -> None:
    """``--torch_compile``: compile the training module's forward in place (``nn.Module.compile`` with
    ``--torch_compile_backend``, default inductor, and ``--torch_compile_mode``; the backward is compiled with
    it). In place, the module keeps its class and its parameter names, so checkpoints, the final model and
    ``unwrap_model`` see the plain module (no ``_orig_mod.`` prefix); compilation happens at the first step.
    Evaluation runs eagerly (``evaluate``)."""
    model.compile(backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)


def compile_description(args: PretrainArguments) -> str | None:
    """``"torch.compile (inductor, mode max-autotune)"`` under ``--torch_compile``, else ``None``."""
    if not args.torch_compile:
        return None
    mode = f", mode {args.torch_compile_mode}" if args.torch_compile_mode else ""
    return f"torch.compile ({args.torch_compile_backend or 'inductor'}{mode})"


def make_optimizer(args: PretrainArguments, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW over ``parameter_groups``; the fused implementation (one kernel for all tensors, as ``Trainer``'s
    default ``adamw_torch_fused``) except on a sharded model, whose DTensor parameters keep the default
    one."""
    return torch.optim.AdamW(
        parameter_groups(model, args.weight_decay),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        fused=not args.layout.sharded,
    )


def check_output_folder_of(args: PretrainArguments) -> FolderState:
    """The output-folder rule (``outputs.py``) for this run; reads only (every rank calls it)."""
    inputs = {"train_file": args.train_file, "validation_file": args.validation_file,
              "model_name_or_path": args.model_name_or_path, "config_name": args.config_name,
              "tokenizer_name": args.tokenizer_name}
    return check_output_folder(PRETRAIN_RULE, args.output_dir, json_arguments(args),
                               overwrite=args.overwrite_output_dir, resume=args.resume_from_checkpoint,
                               inputs=inputs, write_into=args.write_into_output_dir)


def checkpoint_to_resume(args: PretrainArguments, folder: FolderState, data_ranks: int) -> Path | None:
    """``--resume_from_checkpoint``'s checkpoint; else, in a folder holding this run unfinished, its newest
    complete checkpoint (broken newer ones skipped with a warning); else ``None``. One line says which
    checkpoint the run continues from. A checkpoint of the other kind of launch (sharded or not), or of
    another global batch over the ``data_ranks`` processes, is refused (``check_checkpoint_kind``)."""
    if args.resume_from_checkpoint:
        chosen = named_checkpoint(args.output_dir, args.resume_from_checkpoint)
        reason = ("the newest complete checkpoint in --output_dir (--resume_from_checkpoint latest)"
                  if args.resume_from_checkpoint == "latest" else "as --resume_from_checkpoint names it")
    else:
        chosen = (newest_resumable("pretrain", pretrain_checkpoints(args.output_dir)) if folder.same_run
                  else None)
        reason = AUTOMATIC
    if chosen is None:
        return None
    if (legacy := legacy_checkpoint_error(chosen.path)) is not None:
        raise legacy
    check_checkpoint_kind(chosen.path, args, data_ranks)
    check_stream_position(chosen.path, args)
    announce_resume("pretrain", chosen, reason)
    return chosen.path


def check_stream_position(checkpoint: Path, args: PretrainArguments) -> None:
    """``FlagError`` naming ``resume_from_checkpoint`` when ``--streaming`` and the checkpoint disagree: a
    streamed run needs the stream position the checkpoint of a streamed run holds (``data_state/``), a
    whole-data run cannot use one (its data order is the epoch permutation's)."""
    held = (checkpoint / DATA_STATE_DIR).is_dir()
    if held == args.streaming:
        return
    if args.streaming:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {checkpoint} holds no stream position "
                        f"({DATA_STATE_DIR}/): it was written by a run without --streaming.")
    raise FlagError("resume_from_checkpoint", f"resume_from_checkpoint: {checkpoint} holds a stream position "
                                              f"({DATA_STATE_DIR}/): it was written with --streaming; pass "
                                              "it again.")


def start_writing(args: PretrainArguments, runtime: TrainingRuntime, folder: FolderState) -> None:
    """Every rank has checked everything; the main process clears the folder (``--overwrite_output_dir``) and
    records the run in ``run.json``; then every rank goes on. A folder of a person's files is refused on every
    rank first (``refuse_foreign_files``)."""
    refuse_foreign_files(PRETRAIN_RULE, folder)
    runtime.wait_for_everyone()
    if runtime.is_main_process:
        start_run(PRETRAIN_RULE, folder, json_arguments(args))
    runtime.wait_for_everyone()


def _tokenizer_and_config(args: PretrainArguments) -> tuple[Any, Any]:
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
    return tokenizer, config


def setup(args: PretrainArguments, runtime: TrainingRuntime) -> TrainingSetup:
    """Output folder, checkpoint to resume, tokenizer, config, data, model, optimizer, scheduler — every input
    and the output folder are checked (``FlagError``) before anything is written."""
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    set_seed(args.seed)
    if args.torch_compile and args.torch_compile_backend in (None, "inductor"):
        check_inductor(runtime.device)
    folder = check_output_folder_of(args)
    checkpoint = checkpoint_to_resume(args, folder, runtime.num_processes)
    tokenizer, config = _tokenizer_and_config(args)
    stream = None
    if args.streaming:
        stream, validation = _stream_data(args, tokenizer, runtime)
        blocks = {"train": None, "validation": validation}
    else:
        blocks = _training_blocks(args, tokenizer, runtime)
    model = build_or_check_model(args, config)
    start_writing(args, runtime, folder)  # every input is valid: from here on the run writes
    if model is None:
        model = sharded_model(args, config, runtime)
    target_only = isinstance(model, TargetOnlyMLMLoss)
    if args.torch_compile:
        compile_model(args, model)

    if stream is None:
        sampler = EpochShuffleSampler(len(blocks["train"]), args.seed)
        model, optimizer = runtime.prepare(model, make_optimizer(args, model), IndexedBlocks(blocks["train"]),
                                           sampler, args.per_device_train_batch_size, collate_blocks)
        batches_per_epoch = runtime.batches_per_epoch()
    else:  # one "epoch" of max_train_steps updates; the stream starts its next pass by itself
        model, optimizer = runtime.prepare(model, make_optimizer(args, model), None, None,
                                           args.per_device_train_batch_size, None)
        batches_per_epoch = args.max_train_steps * args.gradient_accumulation_steps
    updates_per_epoch = math.ceil(batches_per_epoch / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_steps,
    )
    runtime.register_for_checkpointing(scheduler)
    return TrainingSetup(
        args=args, runtime=runtime, tokenizer=tokenizer, config=config, blocks=blocks, model=model,
        optimizer=optimizer, scheduler=scheduler, batches_per_epoch=batches_per_epoch, max_steps=max_steps,
        num_epochs=math.ceil(max_steps / updates_per_epoch), special_ids=special_token_ids(tokenizer),
        checkpoint=checkpoint, stream=stream, target_only=target_only,
        flops_per_token=model_flops_per_token(language_model(runtime.unwrap_model(model)), config,
                                              args.max_seq_length),
        peak_flops=device_peak_flops(runtime.device, args.mixed_precision),
    )


def restore(run: TrainingSetup) -> tuple[int, int]:
    """Load the checkpoint to resume (if any; with ``--streaming`` also the stream's position) and cut
    ``train_log.jsonl`` back to its step; without one, an earlier attempt's log is kept under another name
    (``keep_earlier_log``, with one warning line), never truncated. Returns the optimizer steps and the tokens
    already done. (``checkpoint_to_resume`` has said which checkpoint: one line.)"""
    completed = tokens = 0
    if run.checkpoint is not None:
        run.runtime.load_state(run.checkpoint)
        if run.stream is not None:
            run.stream.load(run.checkpoint)
        state = json.loads((run.checkpoint / STATE_FILE).read_text())
        completed, tokens = state["completed_steps"], state.get("tokens", 0)
        if run.runtime.is_main_process:
            truncate_log(run.log_path, completed)
    elif run.runtime.is_main_process and run.log_path.exists():
        kept = keep_earlier_log(run.log_path)
        logger.warning("pretrain: %s holds no checkpoint of this run to resume from, so it starts at step 0; "
                       "the earlier attempt's log is kept as %s", run.output_dir, kept)
    run.runtime.wait_for_everyone()
    return completed, tokens


# ---------------------------------------------------------------- one step
def micro_batch_inputs(run: TrainingSetup, batch: dict[str, torch.Tensor], epoch: int,
                       micro: int) -> dict[str, torch.Tensor]:
    """The model inputs of the ``micro``-th (1-based) micro-batch of ``epoch``, made on the host from the
    loader's host tensors (so nothing here waits for the device): ``input_ids`` and ``labels`` — MLM masks
    seeded per block; CLM labels are the inputs, except at the first token of each packed document
    (``--packing documents``: nothing predicts it across the boundary); mixed-length pretraining cuts the
    blocks into k pieces (k seeded per micro-batch) — packed documents' ``position_ids``, and for
    ``TargetOnlyMLMLoss`` ``target_index``, the flat positions of the targets: the device then gathers a
    number of rows the host already knows, where a boolean mask would make it wait to learn the count."""
    args = run.args
    input_ids = batch["input_ids"]
    if args.objective == "mlm":
        seeds = [mix_seed(args.seed, epoch, index) for index in batch["index"].tolist()]
        input_ids, labels = mask_tokens(
            input_ids, seeds, mask_token_id=run.tokenizer.mask_token_id, vocab_size=run.config.vocab_size,
            special_ids=run.special_ids, probability=args.mlm_probability,
        )
    elif "position_ids" in batch:
        labels = input_ids.masked_fill(batch["position_ids"] == 0, -100)
    else:
        labels = input_ids
    if args.mixed_length_splits:  # cut each block into k shorter ones (masks drawn on the full block)
        splits = args.mixed_length_splits
        k = splits[mix_seed(args.seed, "split", epoch * run.batches_per_epoch + micro) % len(splits)]
        input_ids, labels = (t.reshape(-1, t.shape[1] // k) for t in (input_ids, labels))
    inputs = {"input_ids": input_ids, "labels": labels}
    if "position_ids" in batch:
        inputs["position_ids"] = batch["position_ids"]
    if run.target_only:
        inputs["target_index"] = torch.flatten(torch.nonzero(labels.flatten() != -100))
    return inputs


def to_device(inputs: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Host tensors ``inputs`` on ``device`` without waiting for it: to a GPU from pinned memory with
    ``non_blocking=True`` (a plain copy to the GPU waits until it has finished the work queued before; this
    one is queued behind it, and the host goes on queueing the step)."""
    if device.type != "cuda":
        return {name: value.to(device) for name, value in inputs.items()}
    return {name: value.pin_memory().to(device, non_blocking=True) for name, value in inputs.items()}


def forward_backward(run: TrainingSetup, inputs: dict[str, torch.Tensor], window: int,
                     sync: bool) -> torch.Tensor:
    """Loss of one micro-batch (``inputs`` on the device: ``micro_batch_inputs``) and its gradients (scaled by
    1/window), reduced across ranks only if ``sync``; the loss stays on the device."""
    runtime = run.runtime
    with runtime.accumulate(run.model, sync):
        with runtime.forward_context():
            loss = run.model(**inputs).loss
        runtime.backward(loss / window)
    return loss.detach().float()


def optimizer_step(run: TrainingSetup) -> torch.Tensor | None:
    """Clip (``--max_grad_norm``), step optimizer and scheduler, clear the gradients; returns the norm."""
    grad_norm = None
    if run.args.max_grad_norm > 0:
        grad_norm = run.runtime.clip_grad_norm_(run.model, run.args.max_grad_norm)
    run.optimizer.step()
    if not run.runtime.optimizer_step_was_skipped():
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def agree(run: TrainingSetup, state: LoopState) -> tuple[bool, bool]:
    """``(stop, timed checkpoint)`` after this step: whether any rank received a stop signal, and whether
    ``--checkpointing_minutes`` have passed since the last checkpoint on any rank. Asked only at the steps
    where the ranks agree (``state.agreement``: every step in one process; with several, one all-reduce about
    every second of training, the same steps on every rank), else ``(False, False)``; never at the last step,
    which ends the run and whose final save covers it."""
    if state.completed >= run.max_steps or not state.agreement.due(state.completed):
        return False, False
    minutes = run.args.checkpointing_minutes
    elapsed = bool(minutes) and time.perf_counter() - state.last_checkpoint >= 60.0 * minutes
    signal, timed = state.agreement.agree(
        state.completed, [state.stop.number if state.stop is not None else 0, int(elapsed)])
    return state.stop is not None and state.stop.settle(signal), timed > 0


def checkpoint_name(run: TrainingSetup, completed: int, epoch: int, epoch_end: bool) -> str | None:
    """``step_<k>`` every ``--checkpointing_steps`` steps, ``epoch_<e>`` at epoch ends with ``epoch``, else
    None."""
    every = run.args.checkpointing_steps
    if every and every.isdigit() and completed % int(every) == 0:
        return f"step_{completed}"
    if every == "epoch" and epoch_end:
        return f"epoch_{epoch}"
    return None


def checkpoint_extras(run: TrainingSetup, folder: Path) -> None:
    """What a checkpoint holds besides the training state (every rank calls it): a streamed run's data
    position (each rank), and the language model's ``config.json`` and the tokenizer (the main process), so
    that ``export`` takes the checkpoint (``checkpoint_model.py``)."""
    if run.stream is not None:
        run.stream.save(folder)
    if run.runtime.is_main_process:
        write_model_files(folder, language_model(run.runtime.unwrap_model(run.model)), run.tokenizer)


def checkpoint_state(run: TrainingSetup, state_of_loop: LoopState, epoch: int) -> dict[str, Any]:
    """``training_state.json``: the step, epoch, tokens trained on, the objective, the global batch and the
    gradient accumulation the data position counts in (and, for a sharded run, its format)."""
    state: dict[str, Any] = {
        "completed_steps": state_of_loop.completed, "epoch": epoch, "tokens": state_of_loop.tokens,
        "objective": run.args.objective,
        "global_batch_size": run.args.per_device_train_batch_size * run.runtime.num_processes,
        "gradient_accumulation_steps": run.args.gradient_accumulation_steps}
    if run.args.layout.sharded:
        state.update(sharded=True, layout=asdict(run.args.layout))
    return state


# ---------------------------------------------------------------- logging
def device_count(run: TrainingSetup) -> int:
    """The processes (one device each) the run uses: the data-parallel ranks (``runtime.num_processes``,
    which see distinct data) times the tensor-parallel ones."""
    return run.runtime.num_processes * run.args.layout.tp_size


def throughput_fields(run: TrainingSetup, state: LoopState, seconds: float) -> dict[str, float | int]:
    """``tokens`` (trained on so far, every rank), ``tokens_per_second`` over the window since the last row
    (``seconds`` long), and ``mfu`` where the device's peak is known (``throughput.py``)."""
    rate = state.window_tokens / max(seconds, 1e-9)
    fields_ = {"tokens": state.tokens, "tokens_per_second": round(rate, 1)}
    utilisation = mfu(rate, run.flops_per_token, run.peak_flops, device_count(run))
    if utilisation is not None:
        fields_["mfu"] = round(utilisation, 4)
    return fields_


def evaluate(run: TrainingSetup) -> dict[str, float]:
    """``eval_loss``, ``eval_perplexity`` (and ``eval_accuracy`` for MLM) on the validation blocks, sharded
    over the data-parallel ranks; ``{}`` without validation blocks."""
    if run.eval_blocks is None:
        return {}
    args = run.args
    # --torch_compile: the evaluation is eager (no compilation for its batch shape and eval mode, and the
    # same numbers as an uncompiled run's)
    with torch.compiler.set_stance("force_eager") if args.torch_compile else contextlib.nullcontext():
        result = evaluate_lm(
            language_model(run.runtime.unwrap_model(run.model)), run.eval_blocks, objective=args.objective,
            tokenizer=run.tokenizer, batch_size=args.per_device_eval_batch_size,
            mlm_probability=args.mlm_probability, seed=args.seed, accelerator=run.runtime,
        )
    run.model.train()
    keys = ("loss", "perplexity", "accuracy") if args.objective == "mlm" else ("loss", "perplexity")
    return {f"eval_{k}": result[k] for k in keys}


def log_row(run: TrainingSetup, state: LoopState, grad_norm: torch.Tensor | None,
            eval_due: bool) -> dict[str, Any]:
    """One ``train_log.jsonl`` row: the mean loss since the last row (over ranks), lr, grad norm, evaluation;
    appended by the main process, sent to TensorBoard under ``--with_tracking``."""
    mean_loss = run.runtime.reduce(state.log_loss / state.log_updates, reduction="mean")
    row = {
        "step": state.completed,
        "epoch": round(state.completed / run.updates_per_epoch, 4),
        "loss": float(mean_loss),
        "lr": run.scheduler.get_last_lr()[0],
    }
    if not math.isfinite(row["loss"]):  # every rank has the reduced loss: all stop here together
        raise TrainingDiverged("pretrain", state.completed, row["loss"], run.args.learning_rate)
    if grad_norm is not None:
        row["grad_norm"] = float(grad_norm)
    window = time.perf_counter() - state.window_started
    state.train_seconds += window
    row.update(throughput_fields(run, state, window))
    if eval_due:
        state.metrics = evaluate(run)
        row.update(state.metrics)
    row["elapsed_s"] = round(time.perf_counter() - state.started, 3)
    state.log_loss.zero_()
    state.log_updates = 0
    state.window_tokens = 0
    state.last_row = row
    if run.runtime.is_main_process:
        with run.log_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
    if run.args.with_tracking:
        run.runtime.log({k: v for k, v in row.items() if k != "step"}, step=state.completed)
    return row


# ---------------------------------------------------------------- the loop
def after_update(run: TrainingSetup, state: LoopState, epoch: int, epoch_end: bool,
                 grad_norm: torch.Tensor | None, progress: Any) -> None:
    """Book-keeping after an optimizer step: progress, logging (every ``--logging_steps``, at evaluations and
    checkpoints), evaluation (``--eval_steps``, epoch ends, the last step), checkpoints; after a stop signal
    (seen where the ranks agree: ``agree``), the checkpoint of this step (no evaluation: the time before the
    kill is short) and ``TrainingPreempted``. Only the steps that log, evaluate, checkpoint or agree among
    several processes read anything from the device."""
    args = run.args
    state.completed += 1
    progress.update(1)
    state.log_loss += state.window_loss
    state.log_updates += 1
    state.window_loss.zero_()
    stopping, timed = agree(run, state)
    name = (checkpoint_name(run, state.completed, epoch, epoch_end)
            or (f"step_{state.completed}" if stopping or timed else None))
    eval_due = not stopping and bool(state.completed == run.max_steps or epoch_end
                                     or (args.eval_steps and state.completed % args.eval_steps == 0))
    if eval_due or name or state.completed % args.logging_steps == 0:
        row = log_row(run, state, grad_norm, eval_due)
        progress.set_postfix(loss=f"{row['loss']:.4f}", tokens=f"{row['tokens']:.3g}",
                             tok_s=f"{row['tokens_per_second']:.4g}")
    if name:
        saved = save_checkpoint(run.runtime, args.output_dir, name, checkpoint_state(run, state, epoch),
                                limit=args.save_total_limit, keep=run.checkpoint,
                                write_extra=lambda folder: checkpoint_extras(run, folder),
                                needed=lambda: training_state_bytes(run.model))
        state.last_checkpoint = time.perf_counter()
        if stopping:
            raise TrainingPreempted("pretrain", state.stop.signal_name, state.completed, saved)
    # a row was written: the next window starts now (evaluation, checkpoint excluded)
    if state.window_tokens == 0:
        state.window_started = time.perf_counter()


def train_epoch(run: TrainingSetup, state: LoopState, epoch: int, progress: Any) -> None:
    """The rest of ``epoch`` from ``state.completed`` (skipping its already-trained micro-batches)."""
    args, runtime = run.args, run.runtime
    ga, batches = args.gradient_accumulation_steps, run.batches_per_epoch
    run.model.train()
    skip = (state.completed - epoch * run.updates_per_epoch) * ga
    micro = skip
    source = run.stream.batches() if run.stream is not None else runtime.epoch_batches(epoch, skip)
    for batch in source:
        torch.manual_seed(mix_seed(args.seed, "step", epoch * batches + micro, runtime.process_index))
        window_start = micro // ga * ga
        window = min(ga, batches - window_start)
        micro += 1
        sync = micro - window_start == window
        inputs = to_device(micro_batch_inputs(run, batch, epoch, micro), runtime.device)
        state.window_loss += forward_backward(run, inputs, window, sync) / window
        trained = inputs["input_ids"].numel() * runtime.num_processes
        state.tokens += trained
        state.window_tokens += trained
        if not sync:
            continue
        grad_norm = optimizer_step(run)
        after_update(run, state, epoch, micro == batches, grad_norm, progress)
        if state.completed >= run.max_steps:
            break


def train(run: TrainingSetup, completed: tuple[int, int], stop: StopSignals | None = None) -> LoopState:
    """Train from ``completed`` = (optimizer steps, tokens) done to ``max_steps`` (with a ``tqdm`` bar on each
    node's main process); a stop signal in ``stop`` ends it early with ``TrainingPreempted`` after a
    checkpoint."""
    from tqdm.auto import tqdm

    args, runtime = run.args, run.runtime
    if args.with_tracking:
        runtime.init_trackers({k: v for k, v in asdict(args).items()
                               if isinstance(v, (int, float, str, bool))})
    device = runtime.device
    completed, tokens = completed
    state = LoopState(completed=completed, window_loss=torch.zeros((), device=device),
                      log_loss=torch.zeros((), device=device), stop=stop, agreement=Agreement(device),
                      tokens=tokens, first_completed=completed, first_tokens=tokens)
    progress = tqdm(total=run.max_steps, initial=state.completed,
                    disable=args.disable_tqdm or not runtime.is_local_main_process,
                    desc=f"pretrain {run.config.model_type} ({args.objective})")
    try:
        for epoch in range(state.completed // run.updates_per_epoch, run.num_epochs):
            if state.completed >= run.max_steps:
                break
            train_epoch(run, state, epoch, progress)
    finally:
        progress.close()
    if not state.metrics and state.completed > 0:
        state.metrics = evaluate(run)
    return state


# ---------------------------------------------------------------- outputs
def dataset_info(args: PretrainArguments) -> dict[str, str]:
    """``dataset``, ``dataset_name`` and ``dataset_description`` of ``pretrain_args.json`` (the model
    card's)."""
    if args.dataset_name is not None:
        config = f" ({args.dataset_config_name})" if args.dataset_config_name else ""
        return {"dataset": args.dataset_name, "dataset_name": Path(args.dataset_name).name + config,
                "dataset_description": f"datasets.load_dataset({args.dataset_name!r}){config}"}
    if args.train_file is None:
        return {"dataset": CORPUS_NAME, "dataset_name": "pydoc_data.topics (Python Language Reference)",
                "dataset_description": CORPUS_DESCRIPTION}
    files = args.train_file.split(",")
    return {"dataset": args.train_file,
            "dataset_name": Path(files[0]).name + (f" (+{len(files) - 1})" * (len(files) > 1)),
            "dataset_description": f"local file(s) {args.train_file}"}


def save_outputs(run: TrainingSetup, state: LoopState) -> Path | None:
    """The final folder: model (safetensors, config, remote code), tokenizer, ``all_results.json``,
    ``pretrain_args.json`` and ``loss_curve.png`` (with matplotlib; ``train_log.jsonl`` and ``checkpoints/``
    are already there). Returns the plot's path, or ``None`` when none was drawn. Under ``--disable_tqdm``
    Transformers' "Writing model shards" bar is off too."""
    args, runtime = run.args, run.runtime
    runtime.wait_for_everyone()
    plot = None
    with quiet_progress() if args.disable_tqdm else contextlib.nullcontext():
        runtime.save_model(run.model, args.output_dir)
    if runtime.is_main_process:
        model = language_model(runtime.unwrap_model(run.model))
        run.tokenizer.model_max_length = model.config.max_position_embeddings
        run.tokenizer.save_pretrained(args.output_dir)
        title = f"pretrain {model.config.model_type} ({args.objective}): {run.output_dir.name}"
        plot = plot_loss_curve(run.log_path, run.output_dir / PLOT_FILE, title)
        epoch = round(state.completed / run.updates_per_epoch, 4)
        results = {**state.metrics, "train_loss": state.last_row.get("loss"), "step": state.completed,
                   "epoch": epoch}
        (run.output_dir / "all_results.json").write_text(json.dumps(results, indent=2))
        info = {
            **asdict(args),
            "model_type": model.config.model_type,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            **dataset_info(args),
            "train_blocks": len(run.blocks["train"]) if run.blocks["train"] is not None else None,
            "validation_blocks": len(run.eval_blocks) if run.eval_blocks is not None else 0,
            "tokens": state.tokens,
            **runtime.describe(),
        }
        (run.output_dir / ARGS_FILE).write_text(json.dumps(info, indent=2))
        if args.layout.sharded:
            remove_initial_model(args)
    if args.with_tracking:
        runtime.end_training()
    runtime.wait_for_everyone()
    if runtime.is_main_process:
        finish_run(args.output_dir)
    return plot


def checkpoint_cadence(args: PretrainArguments) -> str:
    """How often the run checkpoints, for the start summary."""
    parts = []
    if args.checkpointing_steps == "epoch":
        parts.append("each epoch")
    elif args.checkpointing_steps:
        parts.append(f"every {args.checkpointing_steps} steps")
    if args.checkpointing_minutes:
        parts.append(f"every {args.checkpointing_minutes:g} min")
    return "a checkpoint " + " and ".join(parts) if parts else "no checkpoints (--checkpointing_minutes 0)"


def run_plan(run: TrainingSetup, completed: int) -> RunPlan:
    """What the start summary states about ``run`` (main process): the model's size, where it runs, the
    steps ahead and a rough time estimate (``summary.py``)."""
    args, runtime = run.args, run.runtime
    model = language_model(runtime.unwrap_model(run.model))
    total, non_embedding = parameter_counts(model)
    per_process = args.per_device_train_batch_size * args.gradient_accumulation_steps
    matmul = device_matmul_flops(runtime.device, per_process * args.max_seq_length // max(
        args.gradient_accumulation_steps, 1), run.config.hidden_size)
    # each tensor-parallel rank computes its share of a token's FLOPs
    estimate = estimate_seconds(run.flops_per_token / args.layout.tp_size, per_process * args.max_seq_length,
                                run.max_steps - completed, matmul)
    return RunPlan(model_type=run.config.model_type, objective=args.objective, parameters=total,
                   non_embedding_parameters=non_embedding, device=str(runtime.device),
                   processes=device_count(run), batch_size=per_process * runtime.num_processes,
                   sequence_length=args.max_seq_length, start_step=completed, max_steps=run.max_steps,
                   checkpoint_cadence=checkpoint_cadence(args), estimated_seconds=estimate,
                   compiled=compile_description(args))


def pretrain(args: PretrainArguments, stop: StopSignals | None = None, *,
             summary: bool = False) -> PretrainResult:
    """Run MLM/CLM pretraining as described in the module docstring; returns a ``PretrainResult``.

    Writes to ``args.output_dir``: ``run.json``, the model (safetensors + remote code + config), the
    tokenizer, ``train_log.jsonl`` (step, epoch, loss, lr, grad_norm, eval_* when evaluated),
    ``all_results.json``, ``pretrain_args.json`` and ``checkpoints/``. Nothing is written before the output
    folder, tokenizer, config, checkpoint, data, model and (sharded) process layout are checked: a bad one
    raises ``FlagError`` naming its argument. SIGTERM/SIGUSR1 end the run after the current optimizer step and
    its checkpoint with ``TrainingPreempted`` (caught during training, or by ``stop`` when the caller
    installed the handlers). With ``summary`` (the command line) the main process prints what the run is
    about to do before its first step and what it did at the end (``summary.py``).
    """
    check_arguments(args)
    runtime = make_runtime(args)
    try:
        with run_lock("pretrain", args.output_dir, main_process=runtime.is_main_process,
                      agree=lambda refused: max_over_ranks(refused, runtime.device)):
            run = setup(args, runtime)
            with stop_signals(stop) as active:
                done = restore(run)
                if summary and runtime.is_main_process:
                    print_lines("pretrain", start_summary(run_plan(run, done[0])))
                state = train(run, done, active)
            with failing_save_raises("pretrain", run.output_dir, lambda: training_state_bytes(run.model),
                                     "its checkpoints are intact", staging=False):
                plot = save_outputs(run, state)
            if summary and runtime.is_main_process:
                print_lines("pretrain", end_summary(
                    args.output_dir, args.objective, state.completed - state.first_completed,
                    state.tokens - state.first_tokens, state.train_seconds,
                    time.perf_counter() - state.started, state.last_row.get("loss"),
                    state.metrics.get("eval_loss"), plot))
    except (TrainingPreempted, TrainingDiverged):
        if args.with_tracking:
            runtime.end_training()
        raise
    finally:
        if isinstance(runtime, ShardedRuntime):
            runtime.close()
    return PretrainResult(str(run.output_dir), state.completed, state.metrics, str(run.log_path))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``PretrainArguments`` field."""
    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, PretrainArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: train (``preemption.run_training_command``: a bad flag value or output folder gives one
    error line naming the flag and exit status 2; a stop signal, after its checkpoint, one line and exit
    status 75)."""
    return run_training_command("pretrain", functools.partial(pretrain, summary=True), namespace,
                                PretrainArguments)


__all__ = [
    "PREEMPTED_EXIT_CODE",
    "PRETRAIN_RULE",
    "SCHEDULER_TYPES",
    "STATE_FILE",
    "LoopState",
    "PretrainArguments",
    "PretrainResult",
    "TrainingPreempted",
    "TrainingSetup",
    "add_arguments",
    "check_checkpoint_kind",
    "find_checkpoint",
    "pretrain",
    "run",
    "setup",
    "train",
]
