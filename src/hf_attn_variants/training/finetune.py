"""``hf-attn-variants finetune``: sequence or token classification with ``Trainer`` (+ optional LoRA).

Flags follow transformers' ``run_glue.py`` / ``run_ner.py`` (``HfArgumentParser`` over
``arguments.FinetuneArguments`` and ``TrainingArguments``). Data: local csv/json/jsonl/parquet; the two tasks
(``--task sequence_classification`` / ``token_classification``), their columns, labels and metrics:
``tasks.py``.

``eval_results.json`` / ``train_results.json`` / ``all_results.json`` are written by
``Trainer.save_metrics`` exactly as run_glue does (``eval_accuracy``, ``eval_f1``, …).
``--early_stopping_patience N`` adds ``EarlyStoppingCallback`` (and turns on per-epoch evaluation,
matching checkpointing and ``load_best_model_at_end`` when they are not set).

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): with ``--lora_r > 0`` the
model is wrapped by ``peft`` with W + (α/r)·B·A on ``--lora_target_modules`` (default per family:
``LORA_TARGETS``) and the classifier head fully trained and saved (``modules_to_save``). The output folder
then holds the adapter (``adapter_config.json`` + ``adapter_model.safetensors``), the tokenizer and
``task_config.json`` (labels), and ``load_finetuned`` / ``PeftModel.from_pretrained`` reload it;
``--lora_merge`` also writes the merged full model to ``output_dir/merged``.

Output folder, resuming and preemption (``outputs.py``, ``trainer_hooks.py``): a rerun into the same
``--output_dir`` with the same flags resumes from the newest complete ``checkpoint-<step>`` (each carries a
manifest of its files' sizes and sha256); a folder holding a finished model or another run is refused before
anything is written unless ``--overwrite_output_dir``. SIGTERM/SIGUSR1: every rank finishes the same optimizer
step, ``Trainer`` saves that step's checkpoint, and the command exits with ``PREEMPTED_EXIT_CODE`` (75). One
run writes a folder at a time (``runlock.py``); the arguments are written as JSON, not pickled; a checkpoint
is read with safe loaders before ``Trainer`` resumes from it (``loadable``); a save that fails (a full disk)
ends in one line with the space it needed (``safe_state.SaveFailed``).

Sharded (``torchrun --nproc_per_node N -m hf_attn_variants finetune ... --fsdp_size F``;
``--dp_replicate_size`` for HSDP): rank 0 builds the single-process run's model (same seed, same new head)
into ``output_dir/.initial_model``, every rank loads it sharded by Transformers' ``DistributedConfig``
(FSDP2), and ``Trainer`` trains it (it recognises a model sharded at load time: no DDP wrapping, deferred FSDP
gradient reduction under accumulation). ``Trainer.save_model`` calls the model's ``save_pretrained`` on every
rank: the full weights are gathered and rank 0 writes them, so the folder equals a single-process run's;
model-only checkpoints (``--save_strategy steps|epoch --save_only_model true``) are written the same way. Not
supported, each refused with a ``FlagError`` naming the flag (``check_sharded_finetune``): ``--tp_size`` on
CPU (Trainer hands a tensor-parallel model to accelerate's ``ParallelismConfig``, which raises for
``DistributedType.MULTI_CPU``; on GPUs it is wired but untested here); checkpoints with optimizer state
(``Trainer`` refuses them for a model sharded at load time); ``--load_best_model_at_end``, hence
``--early_stopping_patience``, and ``--resume_from_checkpoint`` (``Trainer`` loads a checkpoint into the
sharded model with ``load_state_dict`` of plain tensors, which fails on its DTensor parameters); LoRA
(peft's ``modules_to_save`` copy of the sharded classifier fails). For the same reason a sharded finetune
stops on SIGTERM without a checkpoint, and a folder of its unfinished run is refused rather than resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cli_utils import (
    FlagError,
    check_folder,
    check_int,
    check_model_source,
    check_number,
    check_output_dir,
    check_positive,
    check_seed,
    quiet_progress,
)
from .arguments import TASKS, FinetuneArguments, check_adamw, has_accelerator
from .checkpoints import (
    announce_resume,
    broken_checkpoint_error,
    newest_resumable,
    probe_files,
    read_json_file,
)
from .modeling import build_config, load_pretrained, load_tokenizer
from .outputs import (
    FolderState,
    OutputRule,
    check_output_folder,
    finish_run,
    json_arguments,
    refuse_foreign_files,
    start_run,
)
from .preemption import StopSignals, TrainingPreempted, max_over_ranks, run_training_command, stop_signals
from .runlock import run_lock
from .safe_state import failing_save_raises, training_state_bytes
from .sharded import INITIAL_MODEL_DIR, check_layout, check_parallel_plans, load_sharded, model_class_for
from .summary import (
    FinetunePlan,
    finetune_end_summary,
    finetune_start_summary,
    parameter_counts,
    print_lines,
    updates_per_epoch,
)
from .tasks import (
    compute_metrics,
    label_kwargs,
    load_splits,
    sequence_features,
    task_auto_class,
    token_features,
)
from .trainer_hooks import (
    ARGUMENTS_FILE,
    BATCH_ORDERED_SAMPLERS,
    MANIFEST_FILE,
    CheckpointGuard,
    LogLines,
    arguments_as_json,
    examples_per_batch,
    per_process_batch,
    read_trainer_checkpoint,
    sampling_strategy,
    splits_batches,
    trainer_checkpoints,
)

logger = logging.getLogger(__name__)

LORA_TARGETS = {
    "entropy_invariant": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "synthesizer": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gau": ["in_proj", "out_proj"],
}
"""Default LoRA targets: the attention projections (GAU: its fused u/v/z projection and output)."""
TASK_CONFIG_FILE = "task_config.json"
FINETUNE_RULE = OutputRule(
    command="finetune",
    aside=frozenset({
        "max_steps", "num_train_epochs",  # the step budget
        "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node",
        "logging_nan_inf_filter", "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name",
        "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
        "include_num_input_tokens_seen", "skip_memory_metrics",
        "save_strategy", "save_steps", "save_total_limit", "save_on_each_node", "enable_jit_checkpoint",
        # evaluation cadence (pretrain: eval_steps)
        "eval_strategy", "eval_steps", "per_device_eval_batch_size",
        "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push",
        "hub_revision", "dataloader_num_workers", "local_rank", "checkpointing_minutes",
    }),
    run_files=("checkpoint-*", "trainer_state.json", "all_results.json", "train_results.json",
               "eval_results.json", TASK_CONFIG_FILE, "base_model", "merged", INITIAL_MODEL_DIR),
)
"""``finetune``'s output folder (``outputs.py``): what may differ within one run, what its files are."""


@dataclass
class FinetuneResult:
    """What ``finetune`` returns: metrics, the trained model (a ``PeftModel`` under LoRA) and the trainer."""

    output_dir: str
    metrics: dict[str, float]
    model: Any
    trainer: Any
    label_list: list[Any] | None


# ---------------------------------------------------------------- checks
TRAINER_METRIC_INPUTS = ("inputs", "loss")
"""What ``--include_for_metrics`` may list (``Trainer`` passes these to ``compute_metrics``)."""


def check_training_arguments(training_args: Any) -> None:
    """``FlagError`` for ``TrainingArguments`` values that its own ``__post_init__`` accepts but that would
    fail (or silently misbehave) only once ``Trainer`` runs: sizes, rates, seeds, paths, integrations."""
    from transformers.integrations import get_reporting_integration_callbacks

    if training_args.output_dir is not None:
        check_output_dir("output_dir", training_args.output_dir)
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        check_positive(name, getattr(training_args, name))
    if training_args.eval_accumulation_steps is not None:
        check_positive("eval_accumulation_steps", training_args.eval_accumulation_steps)
    check_int("dataloader_num_workers", training_args.dataloader_num_workers, 0)
    check_seed("seed", training_args.seed)
    if training_args.data_seed is not None:
        check_seed("data_seed", training_args.data_seed)
    check_adamw(training_args)
    if training_args.fp16 and (training_args.use_cpu or not has_accelerator()):
        raise FlagError("fp16", "fp16 needs a GPU: on a CPU Trainer applies no fp16 autocast, so the run "
                                "would train in float32; use --bf16 (recent CPUs) or neither.")
    if training_args.max_steps <= 0:
        check_number("num_train_epochs", training_args.num_train_epochs, 0, open_low=True)
    check_number("label_smoothing_factor", training_args.label_smoothing_factor, 0, 1, open_high=True)
    if training_args.resume_from_checkpoint:
        check_folder("resume_from_checkpoint", training_args.resume_from_checkpoint, what="checkpoint folder")
    if training_args.enable_jit_checkpoint:
        raise FlagError("enable_jit_checkpoint",
                        "enable_jit_checkpoint: finetune checkpoints on SIGTERM and SIGUSR1 "
                        "itself, at the same step on every rank; drop the flag.")
    unknown = [name for name in training_args.include_for_metrics or () if name not in TRAINER_METRIC_INPUTS]
    if unknown:
        raise FlagError("include_for_metrics",
                        f"include_for_metrics may list {TRAINER_METRIC_INPUTS}, got {unknown}.")
    try:
        get_reporting_integration_callbacks(training_args.report_to)
    except ValueError as error:
        raise FlagError("report_to", f"report_to: {error}") from error


def check_lora_targets(model: Any, targets: list[str] | str) -> None:
    """``FlagError`` unless every name in ``targets`` is the last part of some module name of ``model`` (how
    ``peft`` matches ``target_modules``); ``"all-linear"`` always matches."""
    if isinstance(targets, str):
        return
    suffixes = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in targets if target not in suffixes]
    if missing:
        raise FlagError("lora_target_modules", f"lora_target_modules {missing} name no module of "
                                               f"{type(model).__name__} (default for "
                                               f"{model.config.model_type}: "
                                               f"{LORA_TARGETS.get(model.config.model_type, 'all-linear')}).")


def lora_targets(model_type: str, requested: list[str] | str | None) -> list[str] | str:
    """``requested`` or the family default (``LORA_TARGETS``; ``"all-linear"`` for other model types)."""
    if requested:
        return requested
    return LORA_TARGETS.get(model_type, "all-linear")


def apply_lora(model: Any, task: str, args: FinetuneArguments) -> Any:
    """Wrap ``model`` in a ``peft`` LoRA ``PeftModel``; the ``classifier`` head is trained and saved in
    full."""
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        task_type=TaskType.SEQ_CLS if task == "sequence_classification" else TaskType.TOKEN_CLS,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=lora_targets(model.config.model_type, args.lora_target_modules),
        modules_to_save=["classifier"],
    )
    return get_peft_model(model, config)


def load_finetuned(path: str) -> Any:
    """Reload a ``finetune`` output: a full model folder, or a LoRA adapter (base from its
    ``adapter_config.json``, labels from ``task_config.json``) as a ``PeftModel``."""
    folder = Path(path)
    task_info = json.loads((folder / TASK_CONFIG_FILE).read_text())
    auto_class = task_auto_class(task_info["task"])
    if not (folder / "adapter_config.json").exists():
        return auto_class.from_pretrained(folder)
    from peft import PeftConfig, PeftModel

    base_path = PeftConfig.from_pretrained(folder).base_model_name_or_path
    base = auto_class.from_pretrained(base_path, **task_info["label_kwargs"])
    return PeftModel.from_pretrained(base, folder)


def _with_early_stopping(training_args: Any, args: FinetuneArguments, regression: bool) -> Any:
    if args.early_stopping_patience is None:
        return training_args
    changes: dict[str, Any] = {}
    if str(getattr(training_args.eval_strategy, "value", training_args.eval_strategy)) == "no":
        changes["eval_strategy"] = "epoch"
    strategy = changes.get("eval_strategy", training_args.eval_strategy)
    if str(getattr(training_args.save_strategy, "value", training_args.save_strategy)) != str(
        getattr(strategy, "value", strategy)
    ):
        changes["save_strategy"] = getattr(strategy, "value", strategy)
        if changes["save_strategy"] == "steps":
            changes["save_steps"] = training_args.eval_steps or training_args.logging_steps
    if not training_args.load_best_model_at_end:
        changes["load_best_model_at_end"] = True
    if training_args.metric_for_best_model is None:
        changes["metric_for_best_model"] = "mse" if regression else (
            "accuracy" if args.task == "sequence_classification" else "f1")
        changes["greater_is_better"] = not regression
    if changes:
        logger.info("early stopping: setting %s", changes)
        try:
            training_args = dataclasses.replace(training_args, **changes)
        except ValueError as error:  # TrainingArguments' own check of the combined strategies
            raise FlagError("early_stopping_patience",
                            f"early_stopping_patience: with {changes}: {error}") from error
    return training_args


@dataclass
class _Prepared:
    """Everything ``finetune`` builds from its inputs before it writes anything."""

    training_args: Any
    tokenizer: Any
    data: Any
    collator: Any
    label_list: list[Any] | None
    label_kwargs: dict[str, Any]
    regression: bool
    config: Any
    model: Any
    """The model; ``None`` for a sharded run, whose ranks build it in ``finetune`` (``_sharded_model``)."""
    folder: FolderState
    arguments: dict[str, Any]
    """The run's arguments as ``run.json`` records them."""
    resume_from: str | None = None
    """The checkpoint ``Trainer`` resumes from: ``--resume_from_checkpoint``, or this run's newest complete
    one."""


SHARDED_CHECKPOINT_ERROR = ("Resuming is not supported for models sharded at load time "
                            "(`DistributedConfig`), so their optimizer state cannot be checkpointed. Pass "
                            "`save_only_model=True` or `save_strategy='no'`.")
"""What ``Trainer.__init__`` raises for a model sharded at load time with checkpoints of optimizer state."""
SHARDED_LOAD_ERROR = ("aten.copy_.default got mixed torch.Tensor and DTensor, need to convert all "
                      "torch.Tensor to DTensor before calling distributed operators!")
"""What ``Trainer`` raises when it loads a checkpoint into a sharded model (``_load_best_model``,
``_load_from_checkpoint``: ``model.load_state_dict`` of the full tensors of ``model.safetensors``)."""


def check_sharded_finetune(args: FinetuneArguments, training_args: Any) -> None:
    """``FlagError`` for what a sharded finetune (``--fsdp_size``/``--tp_size``/``--dp_replicate_size``)
    cannot do, checked before anything is written:

    - run without ``torchrun`` (or with sizes that do not multiply to ``WORLD_SIZE``);
    - tensor parallelism on CPU (Trainer hands a tensor-parallel model to accelerate's ``ParallelismConfig``,
      which refuses CPU processes);
    - checkpoints with optimizer state (``--save_strategy`` other than ``no`` without ``--save_only_model``):
      ``Trainer`` itself refuses them for a model sharded at load time (``SHARDED_CHECKPOINT_ERROR``);
      model-only checkpoints work (``save_pretrained`` on every rank, rank 0 writes the gathered weights);
    - ``--load_best_model_at_end`` (hence ``--early_stopping_patience``, which turns it on) and
      ``--resume_from_checkpoint``: ``Trainer`` loads the checkpoint's full tensors into the sharded model
      with ``load_state_dict``, which fails (``SHARDED_LOAD_ERROR``).
    """
    import torch

    layout = args.layout
    check_layout(layout)
    if layout.tp_size > 1 and (training_args.use_cpu or not torch.accelerator.is_available()):
        raise FlagError("tp_size",
                        "tp_size: Trainer hands a tensor-parallel model to accelerate's ParallelismConfig, "
                        "which refuses CPU processes (DistributedType.MULTI_CPU); on CPU shard with "
                        "--fsdp_size.")
    sizes = f"{layout.flag()}={getattr(layout, layout.flag())}"
    if training_args.load_best_model_at_end:
        flag = ("early_stopping_patience" if args.early_stopping_patience is not None
                else "load_best_model_at_end")
        raise FlagError(flag,
                        f"{flag}: Trainer cannot load the best checkpoint back into a model sharded at load "
                        f"time ({sizes}; load_best_model_at_end, which early stopping needs): its "
                        f"load_state_dict of the full weights fails with \"{SHARDED_LOAD_ERROR}\"")
    if training_args.resume_from_checkpoint:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: Trainer cannot resume a model sharded at "
                        f"load time ({sizes}): it keeps no optimizer state for it, and its "
                        "load_state_dict of the checkpoint's full weights fails with "
                        f"\"{SHARDED_LOAD_ERROR}\"")
    strategy = str(getattr(training_args.save_strategy, "value", training_args.save_strategy))
    if strategy != "no" and not training_args.save_only_model:
        raise FlagError("save_strategy",
                        f"save_strategy={strategy!r}: Trainer refuses optimizer-state checkpoints of a "
                        f"model sharded at load time ({sizes}): \"{SHARDED_CHECKPOINT_ERROR}\" Pass "
                        "--save_only_model true (model-only checkpoints) or --save_strategy no.")


def _unsharded_model(args: FinetuneArguments, training_args: Any, config: Any) -> Any:
    """The model of a single-process run: the pretrained folder (a new head initialised from the seed), or a
    new model; the seed is set first, so that the initialisation depends on it only."""
    from transformers import set_seed

    auto_class = task_auto_class(args.task)
    set_seed(training_args.seed)
    if args.model_name_or_path:
        return load_pretrained(auto_class, args.model_name_or_path, config=config)
    return auto_class.from_config(config)


def _sharded_model(args: FinetuneArguments, training_args: Any, config: Any) -> Any:
    """The model of a sharded run: rank 0 builds the single-process run's model
    (``_unsharded_model``: the same initial weights) into ``output_dir/.initial_model``, then every rank loads
    it sharded by ``DistributedConfig``."""
    model_class = model_class_for(config, task_auto_class(args.task))[0]
    folder = Path(training_args.output_dir) / INITIAL_MODEL_DIR
    with training_args.main_process_first(local=False, desc="initial model"):
        if training_args.process_index == 0:
            shutil.rmtree(folder, ignore_errors=True)
            _unsharded_model(args, training_args, config).save_pretrained(folder)
    return load_sharded(model_class, config, folder, args.layout)


def _resume_explicit(path: str) -> str:
    """``--resume_from_checkpoint``: the named checkpoint when it is complete, else the one sentence naming
    its broken file (one cut short, or its ``checkpoint_manifest.json`` itself) and the newest complete
    checkpoint before it. A checkpoint without a manifest (written before them) is probed."""
    folder = Path(path)
    checkpoint = read_trainer_checkpoint(folder, require_manifest=(folder / MANIFEST_FILE).exists())
    if checkpoint is not None and (problem := checkpoint.problem()) is not None:
        raise broken_checkpoint_error("resume_from_checkpoint", checkpoint, problem,
                                      trainer_checkpoints(Path(path).parent))
    return path


def loadable(path: str) -> str:
    """``path`` when every file of the checkpoint that ``Trainer`` reads loads with a safe loader
    (``probe_files``: safetensors, JSON, ``torch.load(weights_only=True)`` as ``Trainer`` itself loads them),
    else one ``FlagError`` naming the file: ``Trainer`` would end in a raw traceback on it."""
    problem = probe_files(Path(path))
    if problem is not None:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: checkpoint {path!r} does not load "
                        f"safely: {problem}; resume from an earlier checkpoint or start "
                        "afresh with --overwrite_output_dir.")
    return path


def checkpoint_to_resume(args: FinetuneArguments, training_args: Any, folder: FolderState) -> str | None:
    """The checkpoint to resume: ``--resume_from_checkpoint``; else, in a folder holding this run unfinished,
    its newest complete ``checkpoint-<step>`` (broken newer ones skipped with a warning; ``_prepare`` says
    which in one line once every input is checked); else ``None``. A sharded run's unfinished folder is
    refused: ``Trainer`` cannot resume it. The checkpoint's files are read once with safe loaders first
    (``loadable``), and its batches compared with this launch's (``check_batches``)."""
    if training_args.resume_from_checkpoint:
        return check_batches(loadable(_resume_explicit(training_args.resume_from_checkpoint)), training_args)
    chosen = newest_resumable("finetune", trainer_checkpoints(folder.folder)) if folder.same_run else None
    if chosen is None:
        return None
    if args.layout.sharded:
        raise FlagError("output_dir",
                        f"--output_dir {str(folder.folder)!r} holds checkpoints of this sharded run "
                        f"({args.sizes_text()}), which Trainer cannot resume (a model sharded at load "
                        "time); pass --overwrite_output_dir to start over.")
    return check_batches(loadable(str(chosen.path)), training_args)  # _prepare says it resumes, once it can


def check_batches(path: str, training_args: Any) -> str:
    """``path`` when this launch batches the data as the run that wrote the checkpoint did, else one
    ``FlagError`` naming ``resume_from_checkpoint``. ``Trainer`` counts the data position and the epoch in
    batches of its training dataloader: with its default sampler, a batch of other examples over all
    processes would resume at another example (some seen twice, some never). The batch compared is the one
    ``Trainer`` derives, which the manifest records (``trainer_hooks.examples_per_batch``: DataParallel GPUs,
    ``split_batches``, and the batch ``auto_find_batch_size`` settled on, which ``Trainer`` restores); a
    checkpoint from before it did compares per-device batch × processes from ``training_args.json``. Another
    ``gradient_accumulation_steps`` is refused too, though only ``dataloader_drop_last`` makes it move the
    position, and another sampler order (``check_sampler``). Not accounted for: tensor-, context- and
    sequence-parallel ranks. Checkpoints written before the manifest recorded the processes are taken as they
    are."""
    manifest = read_json_file(Path(path) / MANIFEST_FILE) or {}
    written = read_json_file(Path(path) / ARGUMENTS_FILE) or {}
    if "processes" not in manifest:
        return path
    processes = manifest["processes"]
    if "examples_per_batch" in manifest:
        then, (now, per_process, launch) = manifest["examples_per_batch"], _launch_batch(path, training_args)
        check_sampler(path, manifest, training_args, per_process)
        problem = (f"was trained on {then} examples a batch over {processes} process(es), this launch takes "
                   f"{now} ({launch}): resume it with the same batch over all processes")
    elif "per_device_train_batch_size" in written:
        per_device = written["per_device_train_batch_size"]
        then = per_device * processes
        now = training_args.per_device_train_batch_size * training_args.world_size
        problem = (f"was trained with per_device_train_batch_size {per_device} × {processes} process(es) = "
                   f"{then} examples a batch, this launch has {training_args.per_device_train_batch_size} × "
                   f"{training_args.world_size} = {now}: resume it with the same product")
    else:
        return path
    if then != now:
        raise FlagError("resume_from_checkpoint", f"resume_from_checkpoint: {path!r} {problem} (Trainer "
                        "counts the data position in batches).")
    now_accumulation = training_args.gradient_accumulation_steps
    accumulation = manifest.get("gradient_accumulation_steps",
                                written.get("gradient_accumulation_steps", now_accumulation))
    if accumulation != now_accumulation:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {path!r} was trained with gradient_accumulation_steps="
                        f"{accumulation}, this launch has {training_args.gradient_accumulation_steps}.")
    return path


def check_sampler(path: str, manifest: dict[str, Any], training_args: Any, per_process: int) -> None:
    """One ``FlagError`` naming ``resume_from_checkpoint`` when this launch would draw the examples in another
    order than the run that wrote ``path``: another ``train_sampling_strategy``, or, for a sampler that orders
    them by the batch (``BATCH_ORDERED_SAMPLERS``), another per-process batch (``per_process``) or, for
    ``batch_rebalance``, another number of processes. Manifests from before they recorded the sampler pass."""
    then = manifest.get("train_sampling_strategy")
    now = sampling_strategy(training_args)
    if then is None:
        return
    if then != now:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {path!r} was trained with train_sampling_strategy="
                        f"{then!r}, this launch has {now!r}: the examples would come in another order.")
    if now not in BATCH_ORDERED_SAMPLERS:
        return
    shape_then = (manifest.get("batch_per_process"), manifest.get("processes"))
    shape_now = (per_process, training_args.world_size)
    if not BATCH_ORDERED_SAMPLERS[now]:
        shape_then, shape_now = shape_then[:1], shape_now[:1]
    if shape_then != shape_now:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {path!r} was trained with {now}, which orders the "
                        f"examples by the batch: {_shape(shape_then)} then, {_shape(shape_now)} in this "
                        "launch; resume it with the same.")


def _shape(shape: tuple[Any, ...]) -> str:
    """``(batch, processes)`` or ``(batch,)`` in words."""
    words = f"{shape[0]} examples a batch per process"
    return words + (f" × {shape[1]} process(es)" if len(shape) > 1 else "")


def _launch_batch(path: str, training_args: Any) -> tuple[int, int, str]:
    """The examples a batch of this launch takes over all processes (``examples_per_batch``) resuming
    ``path``, the per-process batch behind them (``Trainer``'s ``train_batch_size``), and how they come about
    in words."""
    how = f"per_device_train_batch_size {training_args.per_device_train_batch_size}"
    if training_args.n_gpu > 1:
        how += f" × {training_args.n_gpu} GPUs of one process"
    state = read_json_file(Path(path) / "trainer_state.json") if training_args.auto_find_batch_size else None
    per_process = per_process_batch(training_args, (state or {}).get("train_batch_size"))
    if training_args.auto_find_batch_size:  # Trainer restores the checkpoint's batch
        how = f"auto_find_batch_size's {per_process} of the checkpoint"
    if splits_batches(training_args):
        how += f", split over {training_args.world_size} process(es)"
    else:
        how += f" × {training_args.world_size} process(es)"
    return examples_per_batch(training_args, per_process), per_process, how


def _check_output_folder(args: FinetuneArguments, training_args: Any) -> tuple[FolderState, dict[str, Any]]:
    """The output-folder rule (``outputs.py``) for this run; reads only."""
    arguments = json_arguments(args, training_args)
    inputs = {"train_file": args.train_file, "validation_file": args.validation_file,
              "model_name_or_path": args.model_name_or_path, "config_name": args.config_name,
              "tokenizer_name": args.tokenizer_name}
    folder = check_output_folder(FINETUNE_RULE, training_args.output_dir, arguments,
                                 overwrite=args.overwrite_output_dir,
                                 resume=training_args.resume_from_checkpoint, inputs=inputs,
                                 write_into=args.write_into_output_dir)
    return folder, arguments


def _features(args: FinetuneArguments, tokenizer: Any) -> tuple[Any, Any, list[Any] | None, bool]:
    """Tokenized splits (cut to ``--max_train_samples`` / ``--max_eval_samples``), collator, labels,
    regression."""
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

    raw = load_splits(args)
    regression = False
    if args.task == "sequence_classification":
        data, label_list, regression = sequence_features(args, raw, tokenizer)
        collator = DataCollatorWithPadding(tokenizer)
    else:
        data, label_list = token_features(args, raw, tokenizer)
        collator = DataCollatorForTokenClassification(tokenizer)
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit is not None and len(data[split]) > limit:
            data[split] = data[split].select(range(limit))
    return data, collator, label_list, regression


def evaluation_only(training_args: Any) -> bool:
    """Whether the run only evaluates: ``--do_eval`` without ``--do_train`` and with no ``--eval_strategy``.

    ``TrainingArguments`` turns ``do_eval`` on by itself for any ``eval_strategy`` but ``"no"``, so a run
    given ``--eval_strategy epoch`` (evaluating during training) and neither ``--do_train`` nor ``--do_eval``
    trains and evaluates, as one given neither does.
    """
    return bool(training_args.do_eval) and training_args.eval_strategy == "no"


def _prepare(args: FinetuneArguments, training_args: Any) -> _Prepared:
    """Check every input and the output folder (``outputs.py``) and build tokenizer, data, config and model;
    nothing is written. A bad value raises ``FlagError`` naming its flag."""
    from transformers import set_seed

    if args.model_name_or_path is not None:
        check_model_source("model_name_or_path", args.model_name_or_path, weights=True)
    folder, arguments = _check_output_folder(args, training_args)
    resume_from = checkpoint_to_resume(args, training_args, folder)  # before anything slow is loaded
    if not training_args.do_train and not evaluation_only(training_args):
        training_args = dataclasses.replace(training_args, do_train=True, do_eval=True)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(args.tokenizer_name or args.model_name_or_path,
                               flag="tokenizer_name" if args.tokenizer_name else "model_name_or_path")
    config = build_config(
        args.model_type, config_name=args.config_name, model_name_or_path=args.model_name_or_path,
        config_overrides=args.config_overrides, tokenizer=tokenizer, max_seq_length=args.max_seq_length,
    )
    data, collator, label_list, regression = _features(args, tokenizer)
    training_args = _with_early_stopping(training_args, args, regression)
    labels = label_kwargs(label_list, regression)
    for key, value in labels.items():
        setattr(config, key, value)
    model = _checked_model(args, training_args, config)
    automatic = resume_from is not None and not training_args.resume_from_checkpoint
    if automatic and (chosen := read_trainer_checkpoint(Path(resume_from))) is not None:  # every check passed
        announce_resume("finetune", chosen)
    return _Prepared(training_args, tokenizer, data, collator, label_list, labels, regression, config, model,
                     folder, arguments, resume_from)


def _checked_model(args: FinetuneArguments, training_args: Any, config: Any) -> Any:
    """The single-process run's model, or ``None`` for a sharded run (checked on the meta device: layout,
    plans); the LoRA targets are checked on it."""
    if args.layout.sharded:
        check_sharded_finetune(args, training_args)
        checked = model_class_for(config, task_auto_class(args.task))[1]  # on the meta device
        check_parallel_plans(checked, args.layout)
        model = None  # every rank builds it in finetune(), where the run may write
    else:
        checked = model = _unsharded_model(args, training_args, config)
    if args.lora_r > 0:
        check_lora_targets(checked, lora_targets(checked.config.model_type, args.lora_target_modules))
    return model


def _barrier(training_args: Any) -> None:
    if training_args.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def _start_writing(prepared: _Prepared) -> None:
    """Every rank has checked the folder; the main process clears it (``--overwrite_output_dir``) and records
    the run in ``run.json``; then every rank goes on."""
    training_args = prepared.training_args
    refuse_foreign_files(FINETUNE_RULE, prepared.folder)  # every rank, before the barrier
    _barrier(training_args)
    if training_args.process_index == 0:
        start_run(FINETUNE_RULE, prepared.folder, prepared.arguments)
    _barrier(training_args)


def _final_model(args: FinetuneArguments, prepared: _Prepared) -> Any:
    """The model ``Trainer`` trains: the prepared one, or (sharded) every rank's shard; wrapped by LoRA."""
    model = prepared.model
    output_dir = Path(prepared.training_args.output_dir)
    if model is None:
        model = _sharded_model(args, prepared.training_args, prepared.config)
    if args.lora_r > 0:
        if args.model_name_or_path is None:  # a random base must be saved for the adapter to be reloadable
            model.save_pretrained(output_dir / "base_model")
            model.config._name_or_path = str(output_dir / "base_model")
        model = apply_lora(model, args.task, args)
    return model


def _trainer(args: FinetuneArguments, prepared: _Prepared, model: Any, guard: CheckpointGuard) -> Any:
    """The ``Trainer`` of the run (with early stopping and the checkpoint guard as callbacks)."""
    from transformers import EarlyStoppingCallback, PrinterCallback, Trainer

    training_args, data = prepared.training_args, prepared.data
    callbacks = [guard]
    if args.early_stopping_patience is not None:
        callbacks.append(EarlyStoppingCallback(args.early_stopping_patience, args.early_stopping_threshold))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data["validation"] if training_args.do_eval else None,
        processing_class=prepared.tokenizer,
        data_collator=prepared.collator,
        compute_metrics=compute_metrics(args.task, prepared.label_list, prepared.regression,
                                        args.return_entity_level_metrics),
        callbacks=callbacks,
    )
    if training_args.disable_tqdm:  # lines, not Trainer's raw log dicts
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(LogLines())
    return trainer


def _train(trainer: Any, prepared: _Prepared, guard: CheckpointGuard) -> dict[str, float]:
    """``trainer.train`` (resuming ``prepared.resume_from``), then the model, metrics and state as run_glue
    writes them; ``TrainingPreempted`` when a stop signal ended it early."""
    train_result = trainer.train(resume_from_checkpoint=prepared.resume_from)
    if guard.stopped_step is not None:
        step = guard.stopped_step
        checkpoint = (Path(prepared.training_args.output_dir) / f"checkpoint-{step}" if guard.can_checkpoint
                      else None)
        note = "" if guard.can_checkpoint else "a sharded finetune cannot be resumed by Trainer"
        raise TrainingPreempted("finetune", guard.stop.signal_name, step, checkpoint, note)
    trainer.save_model()  # sharded: every rank calls save_pretrained, rank 0 writes the gathered weights
    if trainer.is_world_process_zero():
        arguments_as_json(Path(prepared.training_args.output_dir), prepared.training_args)
    metrics = {**train_result.metrics, "train_samples": len(prepared.data["train"])}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def _evaluate(trainer: Any, prepared: _Prepared) -> dict[str, float]:
    """``trainer.evaluate`` on the validation split, logged and saved as run_glue does."""
    metrics = {**trainer.evaluate(), "eval_samples": len(prepared.data["validation"])}
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def _write_task_outputs(args: FinetuneArguments, prepared: _Prepared, trainer: Any) -> None:
    """Tokenizer, ``task_config.json``, the merged model (``--lora_merge``); the run is then finished."""
    if not trainer.is_world_process_zero():
        return
    output_dir, tokenizer = Path(prepared.training_args.output_dir), prepared.tokenizer
    tokenizer.save_pretrained(output_dir)
    info = {"task": args.task, "label_list": prepared.label_list, "label_kwargs": prepared.label_kwargs,
            "base_model": args.model_name_or_path, "lora": args.lora_r > 0,
            "train_file": args.train_file, "validation_file": args.validation_file}
    (output_dir / TASK_CONFIG_FILE).write_text(json.dumps(info, indent=2))
    shutil.rmtree(output_dir / INITIAL_MODEL_DIR, ignore_errors=True)
    if args.lora_r > 0 and args.lora_merge:
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(output_dir / "merged")
        tokenizer.save_pretrained(output_dir / "merged")
    finish_run(output_dir)


def timed_checkpoints(args: FinetuneArguments, training_args: Any) -> float:
    """``--checkpointing_minutes``, or 0 under ``--save_strategy no`` (no periodic checkpoint asked for)."""
    strategy = getattr(training_args.save_strategy, "value", training_args.save_strategy)
    return 0.0 if str(strategy) == "no" else args.checkpointing_minutes


def finetune(args: FinetuneArguments, training_args: Any, stop: StopSignals | None = None, *,
             summary: bool = False) -> FinetuneResult:
    """Finetune (see module docstring); ``training_args`` is a ``transformers.TrainingArguments``.

    It trains and evaluates unless only evaluation was asked for (``evaluation_only``). Every input and the
    output folder are checked before anything is written (without progress bars, so that a bad value prints
    its one error line alone): a bad one raises ``FlagError`` naming its flag. A stop signal during training
    raises ``TrainingPreempted`` after the checkpoint of the last finished step is written (caught during
    training, or by ``stop`` when the caller installed the handlers). With ``summary`` (the command line) the
    main process prints what the run is about to do before its first step and what it did at the end
    (``summary.py``).
    """
    with quiet_progress():
        check_training_arguments(training_args)
    main_process = training_args.process_index == 0
    with run_lock("finetune", training_args.output_dir, main_process=main_process,
                  agree=lambda refused: max_over_ranks(refused, training_args.device)):
        with quiet_progress():
            prepared = _prepare(args, training_args)
        _start_writing(prepared)  # every input is valid: from here on the run writes
        quiet = quiet_progress() if training_args.disable_tqdm else contextlib.nullcontext()
        with quiet:  # --disable_tqdm: Transformers' "Writing model shards" bars too
            trainer, metrics = _run_trainer(args, prepared, stop, summary)
    return FinetuneResult(str(prepared.training_args.output_dir), metrics, trainer.model, trainer,
                          prepared.label_list)


def _run_trainer(args: FinetuneArguments, prepared: _Prepared, stop: StopSignals | None,
                 summary: bool = False) -> tuple[Any, dict[str, float]]:
    """Train and evaluate with ``Trainer`` (stopped by a signal: ``TrainingPreempted`` after its
    checkpoint), then write the task's outputs; returns the trainer and the metrics. With ``summary`` the
    main process prints the start and end summaries."""
    model = _final_model(args, prepared)
    metrics: dict[str, float] = {}
    training_args = prepared.training_args
    output_dir = Path(training_args.output_dir)
    with failing_save_raises("finetune", output_dir, lambda: training_state_bytes(model),
                             "the checkpoints it completed before are intact", staging=False):
        with stop_signals(stop) as active:
            guard = CheckpointGuard(active, can_checkpoint=not args.layout.sharded,
                                    checkpoint_minutes=timed_checkpoints(args, training_args))
            trainer = _trainer(args, prepared, model, guard)
            summary = summary and trainer.is_world_process_zero()
            if summary:
                print_lines("finetune", finetune_start_summary(run_plan(args, prepared, model)))
            started, first_step = time.perf_counter(), resumed_step(prepared.resume_from)
            if training_args.do_train:
                metrics.update(_train(trainer, prepared, guard))
        if training_args.do_eval:
            metrics.update(_evaluate(trainer, prepared))
        _write_task_outputs(args, prepared, trainer)
    if summary:
        last = trainer.state.global_step
        steps = (last - first_step, last) if training_args.do_train else None
        print_lines("finetune", finetune_end_summary(
            str(output_dir), metrics, steps, time.perf_counter() - started,
            loss_line(trainer, metrics, first_step), lora=args.lora_r > 0,
            merged=args.lora_r > 0 and args.lora_merge))
    return trainer, metrics


def resumed_step(checkpoint: str | None) -> int:
    """The step ``checkpoint`` (a ``Trainer`` checkpoint) was saved at; 0 without one."""
    if checkpoint is None:
        return 0
    state = read_json_file(Path(checkpoint) / "trainer_state.json") or {}
    return int(state.get("global_step") or 0)


def last_logged_loss(trainer: Any) -> tuple[int, float] | None:
    """The step and value of the last training loss ``Trainer`` logged, ``None`` before any."""
    rows = [row for row in trainer.state.log_history if "loss" in row and "step" in row]
    return (int(rows[-1]["step"]), float(rows[-1]["loss"])) if rows else None


def loss_line(trainer: Any, metrics: dict[str, float], first_step: int) -> str | None:
    """The training loss for the end summary: the last logged one (``"train loss 0.6931 at step 6"``); else,
    in a run not resumed, ``Trainer``'s mean over the run (``"mean train loss 0.6931"``; after a resume it
    would average over the earlier steps too without their losses); ``None`` otherwise."""
    if (last := last_logged_loss(trainer)) is not None:
        return f"train loss {last[1]:.4f} at step {last[0]:,}"
    mean = metrics.get("train_loss")
    return f"mean train loss {mean:.4f}" if first_step == 0 and isinstance(mean, (int, float)) else None


def cadence(args: FinetuneArguments, training_args: Any) -> str:
    """When the run evaluates and checkpoints (and stops early), for the start summary."""

    def every(strategy: Any, steps: float | None, never: str) -> str:
        name = str(getattr(strategy, "value", strategy))
        # below 1, TrainingArguments reads the steps as a share of the training steps
        cadence = (f"every {steps:g} steps" if steps and steps >= 1 else
                   f"every {steps:.0%} of the training steps" if steps else "every logging step")
        names = {"no": never, "epoch": "every epoch", "best": "at each new best", "steps": cadence}
        return names.get(name, name)

    evaluation = every(training_args.eval_strategy, training_args.eval_steps or training_args.logging_steps,
                       "at the end" if training_args.do_eval else "never")
    saves = every(training_args.save_strategy, training_args.save_steps,
                  "only when stopped")  # a stop signal still writes one
    text = f"evaluates {evaluation}, checkpoints {saves}"
    if minutes := timed_checkpoints(args, training_args):
        text += f" and every {minutes:g} min"
    if args.early_stopping_patience is not None:
        text += (f"; stops after {args.early_stopping_patience} evaluation"
                 f"{'s' * (args.early_stopping_patience != 1)} without improvement")
    return text


def run_plan(args: FinetuneArguments, prepared: _Prepared, model: Any) -> FinetunePlan:
    """What the start summary states about the run (main process)."""
    training_args = prepared.training_args
    train = prepared.data["train"] if training_args.do_train else None
    evaluation = prepared.data["validation"] if training_args.do_eval else None
    processes, accumulation = training_args.world_size, training_args.gradient_accumulation_steps
    batch = (_launch_batch(prepared.resume_from, training_args)[0] if prepared.resume_from
             else examples_per_batch(training_args, training_args.train_batch_size))  # over all processes
    steps = training_args.max_steps
    if steps <= 0 and train is not None:
        per_epoch = updates_per_epoch(len(train), batch, 1, accumulation)
        steps = math.ceil(per_epoch * training_args.num_train_epochs)
    labels = None if prepared.regression else len(prepared.label_list or []) or prepared.config.num_labels
    return FinetunePlan(
        task=args.task, model_type=prepared.config.model_type, source=args.model_name_or_path,
        parameters=parameter_counts(model)[0],
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad), lora_r=args.lora_r,
        device=str(training_args.device), processes=processes,
        train_examples=len(train) if train is not None else None,
        eval_examples=len(evaluation) if evaluation is not None else None, labels=labels, steps=max(steps, 0),
        batch_size=batch * accumulation, cadence=cadence(args, training_args),
        resume_from=prepared.resume_from)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: ``FinetuneArguments`` + ``TrainingArguments`` (as run_glue's ``HfArgumentParser``)."""
    from transformers import TrainingArguments

    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, FinetuneArguments, TrainingArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: finetune (``preemption.run_training_command``: a bad flag value or output folder gives one
    error line naming the flag and exit status 2; a stop signal, after its checkpoint, one line and exit
    status 75)."""
    from transformers import TrainingArguments

    return run_training_command("finetune", functools.partial(finetune, summary=True), namespace,
                                FinetuneArguments, TrainingArguments)


__all__ = [
    "FINETUNE_RULE",
    "LORA_TARGETS",
    "SHARDED_CHECKPOINT_ERROR",
    "SHARDED_LOAD_ERROR",
    "TASKS",
    "FinetuneArguments",
    "FinetuneResult",
    "add_arguments",
    "apply_lora",
    "check_lora_targets",
    "check_sharded_finetune",
    "check_training_arguments",
    "checkpoint_to_resume",
    "finetune",
    "load_finetuned",
    "lora_targets",
    "run",
]
