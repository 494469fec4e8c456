"""``hf-attn-variants finetune``: sequence or token classification with ``Trainer`` (+ optional LoRA).

Flags follow transformers' ``run_glue.py`` / ``run_ner.py`` (``HfArgumentParser`` over
``FinetuneArguments`` and ``TrainingArguments``). Data: local csv/json/jsonl/parquet.

- ``--task sequence_classification``: a text column (``sentence``/``text``/``sentence1``, or
  ``--text_column_name``), optionally a second one (``sentence2``/``--text_pair_column_name``), and a
  ``label`` column of strings or ints (floats → regression, as run_glue). Metrics: accuracy and macro-F1
  (regression: mse).
- ``--task token_classification``: a ``tokens`` column (lists of words, or a whitespace-separated string
  in csv) and a ``ner_tags`` column (lists of tag strings or ints; or a whitespace-separated string). Only
  the first sub-word of each word is labelled (``--label_all_tokens`` labels all, ``B-`` → ``I-`` after the
  first). Metrics: entity-level precision/recall/F1 (conlleval rules, ``metrics.entity_scores``) and
  token accuracy.

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

Sharded (``torchrun --nproc_per_node N -m hf_attn_variants finetune ... --fsdp_size F``; ``--dp_replicate_size``
for HSDP): rank 0 builds the single-process run's model (same seed, same new head) into
``output_dir/.initial_model``, every rank loads it sharded by Transformers' ``DistributedConfig`` (FSDP2), and
``Trainer`` trains it (it recognises a model sharded at load time: no DDP wrapping, deferred FSDP gradient
reduction under accumulation). ``Trainer.save_model`` calls the model's ``save_pretrained`` on every rank:
the full weights are gathered and rank 0 writes them, so the folder equals a single-process run's; model-only
checkpoints (``--save_strategy steps|epoch --save_only_model true``) are written the same way. Not
supported, each refused with a ``FlagError`` naming the flag (``check_sharded_finetune``): ``--tp_size`` on
CPU (Trainer hands a tensor-parallel model to accelerate's ``ParallelismConfig``, which raises for
``DistributedType.MULTI_CPU``; on GPUs it is wired but untested here); checkpoints with optimizer state
(``Trainer`` refuses them for a model sharded at load time); ``--load_best_model_at_end``, hence
``--early_stopping_patience``, and ``--resume_from_checkpoint`` (``Trainer`` loads a checkpoint into the
sharded model with ``load_state_dict`` of plain tensors, which fails on its DTensor parameters); LoRA
(peft's ``modules_to_save`` copy of the sharded classifier fails).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..cli_utils import (
    FlagError,
    check_folder,
    check_int,
    check_model_folder,
    check_number,
    check_output_dir,
    check_percentage,
    check_positive,
    check_seed,
    quiet_progress,
)
from .data import file_builder, read_data_file, split_data_file
from .metrics import accuracy, entity_scores, macro_f1
from .modeling import build_config, check_model_type, load_pretrained, load_tokenizer
from .sharded import (
    INITIAL_MODEL_DIR,
    SIZE_FLAGS,
    ParallelLayout,
    check_layout,
    check_parallel_plans,
    load_sharded,
    model_class_for,
)

logger = logging.getLogger(__name__)

TASKS = ("sequence_classification", "token_classification")
LORA_TARGETS = {
    "entropy_invariant": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "synthesizer": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gau": ["in_proj", "out_proj"],
}
"""Default LoRA targets: the attention projections (GAU: its fused u/v/z projection and output)."""
TASK_CONFIG_FILE = "task_config.json"


@dataclass
class FinetuneArguments:
    """Model, data, LoRA and early-stopping flags of ``finetune`` (``TrainingArguments`` hold the rest)."""

    task: Literal["sequence_classification", "token_classification"] = field(
        default="sequence_classification", metadata={"help": "sequence_classification or token_classification."}
    )
    train_file: str | None = field(default=None, metadata={"help": "Local csv/json/jsonl/parquet training file."})
    validation_file: str | None = field(default=None, metadata={"help": "Local validation file (same format)."})
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Held-out %% of train_file when there is no validation_file."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Pretrained folder (e.g. a pretrain output_dir)."}
    )
    model_type: str | None = field(default=None, metadata={"help": "Family to build from scratch instead."})
    config_overrides: dict[str, Any] | str | None = field(
        default=None, metadata={"help": 'Config fields as "k=v,k=v" (from Python also a dict).'})
    config_name: str | None = field(default=None, metadata={"help": "Config folder to start from."})
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer folder (default: the model's, else the embedded one)."}
    )
    text_column_name: str | None = field(default=None, metadata={"help": "Text (or tokens) column."})
    text_pair_column_name: str | None = field(default=None, metadata={"help": "Second text column (pairs)."})
    label_column_name: str | None = field(default=None, metadata={"help": "Label column (label / ner_tags)."})
    max_seq_length: int = field(default=128, metadata={"help": "Truncate inputs to this many tokens."})
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad to max_seq_length (else per batch)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N train rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N eval rows."})
    label_all_tokens: bool = field(default=False, metadata={"help": "Label every sub-word, not only the first."})
    return_entity_level_metrics: bool = field(default=False, metadata={"help": "Per-entity-type metrics."})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 = full finetuning."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA α (update scale α / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names to adapt (default per family; 'all-linear' allowed)."}
    )
    lora_merge: bool = field(default=False, metadata={"help": "Also save the merged model to output_dir/merged."})
    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "Stop after N evaluations without improvement."}
    )
    early_stopping_threshold: float = field(default=0.0, metadata={"help": "Minimum improvement that counts."})
    fsdp_size: int = field(
        default=1,
        metadata={"help": "Sharded run (torchrun, Transformers' DistributedConfig; docs/training.md): ranks every "
                  "parameter is FSDP2-sharded over. dp_replicate_size × fsdp_size × tp_size = WORLD_SIZE."},
    )
    tp_size: int = field(
        default=1, metadata={"help": "Sharded run: tensor-parallel ranks (GPUs only: accelerate refuses it on CPU)."}
    )
    dp_replicate_size: int = field(
        default=1, metadata={"help": "Sharded run: replicas of the FSDP shards (HSDP; e.g. the number of nodes)."}
    )

    def __post_init__(self) -> None:
        """Check every value that needs no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it.
        Paths, data, config and model are checked by ``finetune`` before it writes anything."""
        if self.task not in TASKS:
            raise FlagError("task", f"task must be one of {TASKS}, got {self.task!r}.")
        if self.train_file is None:
            raise FlagError("train_file", "train_file is required (a local csv/json/jsonl/parquet file).")
        if self.model_name_or_path is None and self.model_type is None and self.config_name is None:
            raise FlagError("model_name_or_path", "Pass --model_name_or_path (a pretrained folder) or --model_type "
                                                  "to start from scratch.")
        if self.model_type is not None:
            check_model_type(self.model_type)
        check_percentage("validation_split_percentage", self.validation_split_percentage)
        check_positive("max_seq_length", self.max_seq_length)
        for name in ("max_train_samples", "max_eval_samples", "early_stopping_patience"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        check_number("early_stopping_threshold", self.early_stopping_threshold, 0)
        check_int("lora_r", self.lora_r, 0)
        check_positive("lora_alpha", self.lora_alpha)
        check_number("lora_dropout", self.lora_dropout, 0, 1, open_high=True)
        if self.lora_r == 0:
            for name in ("lora_merge", "lora_target_modules"):
                if getattr(self, name):
                    raise FlagError(name, f"{name} needs LoRA: pass --lora_r > 0 too.")
        if self.task == "sequence_classification":
            for name in ("label_all_tokens", "return_entity_level_metrics"):
                if getattr(self, name):
                    raise FlagError(name, f"{name} applies to --task token_classification only.")
        if isinstance(self.lora_target_modules, list) and self.lora_target_modules == ["all-linear"]:
            self.lora_target_modules = "all-linear"
        for name in SIZE_FLAGS:
            check_positive(name, getattr(self, name))
        if self.layout.sharded and self.lora_r > 0:
            raise FlagError("lora_r", f"lora_r: LoRA is not supported on a sharded model "
                                      f"({self.layout.flag()}={getattr(self.layout, self.layout.flag())}): peft's "
                                      "modules_to_save copies the sharded classifier head, which fails with "
                                      "\"RuntimeError: Attempted to call copy_() on an invalid python storage.\"")

    @property
    def layout(self) -> ParallelLayout:
        """The process mesh of ``--dp_replicate_size``/``--fsdp_size``/``--tp_size`` (sharded iff one is > 1)."""
        return ParallelLayout(tp_size=self.tp_size, fsdp_size=self.fsdp_size, dp_replicate_size=self.dp_replicate_size)


@dataclass
class FinetuneResult:
    """What ``finetune`` returns: metrics, the trained model (a ``PeftModel`` under LoRA) and the trainer."""

    output_dir: str
    metrics: dict[str, float]
    model: Any
    trainer: Any
    label_list: list[Any] | None


# ---------------------------------------------------------------- data
def _load_splits(args: FinetuneArguments) -> Any:
    from datasets import DatasetDict

    if args.validation_file:
        if file_builder(args.train_file, "train_file") != file_builder(args.validation_file, "validation_file"):
            raise FlagError("validation_file", "train_file and validation_file must have the same format.")
        raw = DatasetDict(train=read_data_file(args.train_file, "train_file"),
                          validation=read_data_file(args.validation_file, "validation_file"))
        if raw["validation"].column_names != raw["train"].column_names:
            raise FlagError("validation_file", f"validation_file has the columns {raw['validation'].column_names}, "
                                               f"train_file {raw['train'].column_names}.")
        return raw
    return split_data_file(args.train_file, args.validation_split_percentage)


def _pick(columns: list[str], explicit: str | None, candidates: tuple[str, ...], what: str) -> str | None:
    if explicit is not None:
        if explicit not in columns:
            raise FlagError(what, f"{what} {explicit!r} is not a column of the data; columns: {columns}.")
        return explicit
    return next((c for c in candidates if c in columns), None)


def _as_list(value: Any) -> list:
    return value.split() if isinstance(value, str) else list(value)


def _label_names(dataset: Any, column: str, token_level: bool) -> list[Any]:
    feature = dataset["train"].features[column]
    inner = getattr(feature, "feature", feature)
    if hasattr(inner, "names"):  # ClassLabel
        return list(inner.names)
    values = set()
    for split in dataset.values():
        for value in split[column]:
            values.update(_as_list(value) if token_level else [value])
    return sorted(values, key=lambda v: (str(type(v)), v))


def _sequence_features(args: FinetuneArguments, raw: Any, tokenizer: Any) -> tuple[Any, list | None, bool]:
    columns = raw["train"].column_names
    label_col = _pick(columns, args.label_column_name, ("label", "labels"), "label_column_name")
    if label_col is None:
        raise FlagError("label_column_name", f"No label column (label/labels) in {columns}; pass --label_column_name.")
    text_col = _pick(columns, args.text_column_name, ("sentence", "text", "sentence1", "question"), "text_column_name")
    text_col = text_col or next(c for c in columns if c != label_col)
    pair_col = _pick(columns, args.text_pair_column_name, ("sentence2",), "text_pair_column_name")
    regression = raw["train"].features[label_col].dtype in ("float32", "float64")
    label_list = None if regression else _label_names(raw, label_col, token_level=False)
    label_to_id = None if regression else {label: i for i, label in enumerate(label_list)}

    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = (batch[text_col],) if pair_col is None else (batch[text_col], batch[pair_col])
        enc = tokenizer(*texts, truncation=True, max_length=args.max_seq_length,
                        padding="max_length" if args.pad_to_max_length else False)
        enc["labels"] = [float(v) if regression else label_to_id[v] for v in batch[label_col]]
        return enc

    return raw.map(encode, batched=True, remove_columns=columns), label_list, regression


def _token_features(args: FinetuneArguments, raw: Any, tokenizer: Any) -> tuple[Any, list]:
    columns = raw["train"].column_names
    tokens_col = _pick(columns, args.text_column_name, ("tokens", "words"), "text_column_name") or columns[0]
    label_col = _pick(columns, args.label_column_name, ("ner_tags", "tags", "labels", "label"), "label_column_name")
    if label_col is None:
        raise FlagError("label_column_name",
                        f"No tag column (ner_tags/tags/labels) in {columns}; pass --label_column_name.")
    names = _label_names(raw, label_col, token_level=True)
    feature = raw["train"].features[label_col]
    has_class_names = hasattr(getattr(feature, "feature", feature), "names")
    label_list = [str(n) for n in names]
    label_to_id = {label: i for i, label in enumerate(label_list)}
    inside = {i: label_to_id.get("I-" + label[2:], i) if label.startswith("B-") else i
              for i, label in enumerate(label_list)}

    def encode(batch: dict[str, list]) -> dict[str, list]:
        words = [_as_list(w) for w in batch[tokens_col]]
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=args.max_seq_length,
                        padding="max_length" if args.pad_to_max_length else False)
        all_labels = []
        for row, tags in enumerate(batch[label_col]):
            tags = _as_list(tags)
            ids = [t if has_class_names else label_to_id[str(t)] for t in tags]
            if len(ids) != len(words[row]):
                raise FlagError("train_file", f"A row of the data has {len(words[row])} tokens (column "
                                              f"{tokens_col!r}) but {len(ids)} tags (column {label_col!r}).")
            labels, previous = [], None
            for word in enc.word_ids(row):
                if word is None:
                    labels.append(-100)
                elif word != previous:
                    labels.append(ids[word])
                else:
                    labels.append(inside[ids[word]] if args.label_all_tokens else -100)
                previous = word
            all_labels.append(labels)
        enc["labels"] = all_labels
        return enc

    return raw.map(encode, batched=True, remove_columns=columns), label_list


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
    check_number("learning_rate", training_args.learning_rate, 0, open_low=True)
    if training_args.max_steps <= 0:
        check_number("num_train_epochs", training_args.num_train_epochs, 0, open_low=True)
    check_number("weight_decay", training_args.weight_decay, 0)
    check_number("adam_beta1", training_args.adam_beta1, 0, 1, open_high=True)
    check_number("adam_beta2", training_args.adam_beta2, 0, 1, open_high=True)
    check_number("adam_epsilon", training_args.adam_epsilon, 0, open_low=True)
    check_number("max_grad_norm", training_args.max_grad_norm, 0)
    check_number("label_smoothing_factor", training_args.label_smoothing_factor, 0, 1, open_high=True)
    if training_args.resume_from_checkpoint:
        check_folder("resume_from_checkpoint", training_args.resume_from_checkpoint, what="checkpoint folder")
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
                                               f"{type(model).__name__} (default for {model.config.model_type}: "
                                               f"{LORA_TARGETS.get(model.config.model_type, 'all-linear')}).")


# ---------------------------------------------------------------- model
def lora_targets(model_type: str, requested: list[str] | str | None) -> list[str] | str:
    """``requested`` or the family default (``LORA_TARGETS``; ``"all-linear"`` for other model types)."""
    if requested:
        return requested
    return LORA_TARGETS.get(model_type, "all-linear")


def apply_lora(model: Any, task: str, args: FinetuneArguments) -> Any:
    """Wrap ``model`` in a ``peft`` LoRA ``PeftModel``; the ``classifier`` head is trained and saved in full."""
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


def _auto_class(task: str) -> Any:
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    return AutoModelForSequenceClassification if task == "sequence_classification" else AutoModelForTokenClassification


def _label_kwargs(label_list: list | None, regression: bool) -> dict[str, Any]:
    if regression:
        return {"num_labels": 1, "problem_type": "regression"}
    names = [str(label) for label in label_list]
    return {"num_labels": len(names), "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)}}


def load_finetuned(path: str) -> Any:
    """Reload a ``finetune`` output: a full model folder, or a LoRA adapter (base from its
    ``adapter_config.json``, labels from ``task_config.json``) as a ``PeftModel``."""
    folder = Path(path)
    task_info = json.loads((folder / TASK_CONFIG_FILE).read_text())
    auto_class = _auto_class(task_info["task"])
    if not (folder / "adapter_config.json").exists():
        return auto_class.from_pretrained(folder)
    from peft import PeftConfig, PeftModel

    base_path = PeftConfig.from_pretrained(folder).base_model_name_or_path
    base = auto_class.from_pretrained(base_path, **task_info["label_kwargs"])
    return PeftModel.from_pretrained(base, folder)


# ---------------------------------------------------------------- metrics
def _compute_metrics(task: str, label_list: list | None, regression: bool, per_type: bool) -> Any:
    def compute(prediction: Any) -> dict[str, float]:
        logits, labels = prediction.predictions, prediction.label_ids
        logits = logits[0] if isinstance(logits, tuple) else logits
        if regression:
            return {"mse": float(np.mean((np.squeeze(logits, -1) - labels) ** 2))}
        predicted = np.argmax(logits, axis=-1)
        if task == "sequence_classification":
            return {"accuracy": accuracy(predicted.tolist(), labels.tolist()),
                    "f1": macro_f1(predicted.tolist(), labels.tolist())}
        pred_tags, gold_tags = [], []
        for pred_row, gold_row in zip(predicted, labels):
            keep = gold_row != -100
            pred_tags.append([label_list[i] for i in pred_row[keep]])
            gold_tags.append([label_list[i] for i in gold_row[keep]])
        return entity_scores(pred_tags, gold_tags, per_type=per_type)

    return compute


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
            raise FlagError("early_stopping_patience", f"early_stopping_patience: with {changes}: {error}") from error
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


SHARDED_CHECKPOINT_ERROR = ("Resuming is not supported for models sharded at load time (`DistributedConfig`), so their "
                            "optimizer state cannot be checkpointed. Pass `save_only_model=True` or `save_strategy='no'`.")
"""What ``Trainer.__init__`` raises for a model sharded at load time with checkpoints of optimizer state."""
SHARDED_LOAD_ERROR = ("aten.copy_.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                      "DTensor before calling distributed operators!")
"""What ``Trainer`` raises when it loads a checkpoint into a sharded model (``_load_best_model``,
``_load_from_checkpoint``: ``model.load_state_dict`` of the full tensors of ``model.safetensors``)."""


def check_sharded_finetune(args: FinetuneArguments, training_args: Any) -> None:
    """``FlagError`` for what a sharded finetune (``--fsdp_size``/``--tp_size``/``--dp_replicate_size``) cannot
    do, checked before anything is written:

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
        raise FlagError("tp_size", "tp_size: Trainer hands a tensor-parallel model to accelerate's ParallelismConfig, "
                                   "which refuses CPU processes (DistributedType.MULTI_CPU); on CPU shard with "
                                   "--fsdp_size.")
    sizes = f"{layout.flag()}={getattr(layout, layout.flag())}"
    if training_args.load_best_model_at_end:
        flag = "early_stopping_patience" if args.early_stopping_patience is not None else "load_best_model_at_end"
        raise FlagError(flag, f"{flag}: Trainer cannot load the best checkpoint back into a model sharded at load "
                              f"time ({sizes}; load_best_model_at_end, which early stopping needs): its "
                              f"load_state_dict of the full weights fails with \"{SHARDED_LOAD_ERROR}\"")
    if training_args.resume_from_checkpoint:
        raise FlagError("resume_from_checkpoint", f"resume_from_checkpoint: Trainer cannot resume a model sharded at "
                                                  f"load time ({sizes}): it keeps no optimizer state for it, and its "
                                                  "load_state_dict of the checkpoint's full weights fails with "
                                                  f"\"{SHARDED_LOAD_ERROR}\"")
    strategy = str(getattr(training_args.save_strategy, "value", training_args.save_strategy))
    if strategy != "no" and not training_args.save_only_model:
        raise FlagError("save_strategy", f"save_strategy={strategy!r}: Trainer refuses optimizer-state checkpoints of a "
                                         f"model sharded at load time ({sizes}): \"{SHARDED_CHECKPOINT_ERROR}\" Pass "
                                         "--save_only_model true (model-only checkpoints) or --save_strategy no.")


def _unsharded_model(args: FinetuneArguments, training_args: Any, config: Any) -> Any:
    """The model of a single-process run: the pretrained folder (a new head initialised from the seed), or a
    new model; the seed is set first, so that the initialisation depends on it only."""
    from transformers import set_seed

    auto_class = _auto_class(args.task)
    set_seed(training_args.seed)
    if args.model_name_or_path:
        return load_pretrained(auto_class, args.model_name_or_path, config=config)
    return auto_class.from_config(config)


def _sharded_model(args: FinetuneArguments, training_args: Any, config: Any) -> Any:
    """The model of a sharded run: rank 0 builds the single-process run's model
    (``_unsharded_model``: the same initial weights) into ``output_dir/.initial_model``, then every rank loads
    it sharded by ``DistributedConfig``."""
    model_class = model_class_for(config, _auto_class(args.task))[0]
    folder = Path(training_args.output_dir) / INITIAL_MODEL_DIR
    with training_args.main_process_first(local=False, desc="initial model"):
        if training_args.process_index == 0:
            shutil.rmtree(folder, ignore_errors=True)
            _unsharded_model(args, training_args, config).save_pretrained(folder)
    return load_sharded(model_class, config, folder, args.layout)


def _prepare(args: FinetuneArguments, training_args: Any) -> _Prepared:
    """Check every input and build tokenizer, data, config and model; nothing is written. A bad value raises
    ``FlagError`` naming its flag."""
    from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding, set_seed

    check_training_arguments(training_args)
    if args.model_name_or_path is not None:
        check_model_folder("model_name_or_path", args.model_name_or_path, weights=True)
    if not training_args.do_train and not training_args.do_eval:
        training_args = dataclasses.replace(training_args, do_train=True, do_eval=True)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(args.tokenizer_name or args.model_name_or_path,
                               flag="tokenizer_name" if args.tokenizer_name else "model_name_or_path")
    config = build_config(
        args.model_type, config_name=args.config_name, model_name_or_path=args.model_name_or_path,
        config_overrides=args.config_overrides, tokenizer=tokenizer, max_seq_length=args.max_seq_length,
    )
    raw = _load_splits(args)
    regression = False
    if args.task == "sequence_classification":
        data, label_list, regression = _sequence_features(args, raw, tokenizer)
        collator = DataCollatorWithPadding(tokenizer)
    else:
        data, label_list = _token_features(args, raw, tokenizer)
        collator = DataCollatorForTokenClassification(tokenizer)
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit is not None and len(data[split]) > limit:
            data[split] = data[split].select(range(limit))
    training_args = _with_early_stopping(training_args, args, regression)

    label_kwargs = _label_kwargs(label_list, regression)
    for key, value in label_kwargs.items():
        setattr(config, key, value)
    if args.layout.sharded:
        check_sharded_finetune(args, training_args)
        checked = model_class_for(config, _auto_class(args.task))[1]  # on the meta device
        check_parallel_plans(checked, args.layout)
        model = None  # every rank builds it in finetune(), where the run may write
    else:
        checked = model = _unsharded_model(args, training_args, config)
    if args.lora_r > 0:
        check_lora_targets(checked, lora_targets(checked.config.model_type, args.lora_target_modules))
    return _Prepared(training_args, tokenizer, data, collator, label_list, label_kwargs, regression, config, model)


def finetune(args: FinetuneArguments, training_args: Any) -> FinetuneResult:
    """Finetune (see module docstring); ``training_args`` is a ``transformers.TrainingArguments``.

    With neither ``do_train`` nor ``do_eval`` set, both are done. Every input is checked before anything is
    written (without progress bars, so that a bad value prints its one error line alone): a bad one raises
    ``FlagError`` naming its flag.
    """
    from transformers import EarlyStoppingCallback, Trainer

    with quiet_progress():
        prepared = _prepare(args, training_args)
    training_args, tokenizer, data, model = (prepared.training_args, prepared.tokenizer, prepared.data,
                                             prepared.model)
    label_list, label_kwargs, regression = prepared.label_list, prepared.label_kwargs, prepared.regression
    collator = prepared.collator
    output_dir = Path(training_args.output_dir)  # every input is valid: from here on the run writes
    if model is None:
        model = _sharded_model(args, training_args, prepared.config)
    if args.lora_r > 0:
        if args.model_name_or_path is None:  # a random base must be saved for the adapter to be reloadable
            model.save_pretrained(output_dir / "base_model")
            model.config._name_or_path = str(output_dir / "base_model")
        model = apply_lora(model, args.task, args)

    callbacks = []
    if args.early_stopping_patience is not None:
        callbacks.append(EarlyStoppingCallback(args.early_stopping_patience, args.early_stopping_threshold))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data["validation"] if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=_compute_metrics(args.task, label_list, regression, args.return_entity_level_metrics),
        callbacks=callbacks,
    )
    metrics: dict[str, float] = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()  # sharded: every rank calls save_pretrained, rank 0 writes the gathered weights
        train_metrics = {**train_result.metrics, "train_samples": len(data["train"])}
        trainer.log_metrics("train", train_metrics)
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()
        metrics.update(train_metrics)
    if training_args.do_eval:
        eval_metrics = {**trainer.evaluate(), "eval_samples": len(data["validation"])}
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(output_dir)
        info = {"task": args.task, "label_list": label_list, "label_kwargs": label_kwargs,
                "base_model": args.model_name_or_path, "lora": args.lora_r > 0,
                "train_file": args.train_file, "validation_file": args.validation_file}
        (output_dir / TASK_CONFIG_FILE).write_text(json.dumps(info, indent=2))
        shutil.rmtree(output_dir / INITIAL_MODEL_DIR, ignore_errors=True)
        if args.lora_r > 0 and args.lora_merge:
            merged = trainer.model.merge_and_unload()
            merged.save_pretrained(output_dir / "merged")
            tokenizer.save_pretrained(output_dir / "merged")
    return FinetuneResult(str(output_dir), metrics, trainer.model, trainer, label_list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: ``FinetuneArguments`` + ``TrainingArguments`` (as run_glue's ``HfArgumentParser``)."""
    from transformers import TrainingArguments

    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, FinetuneArguments, TrainingArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: finetune; a bad flag value (``FlagError``, raised before anything is written) gives one
    error line naming the flag and exit status 2."""
    from transformers import TrainingArguments

    from ..cli_utils import dataclasses_from_namespace, fail_flag

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_attn_variants").setLevel(logging.INFO)
    try:
        args, training_args = dataclasses_from_namespace(namespace, FinetuneArguments, TrainingArguments)
        finetune(args, training_args)
    except FlagError as error:
        return fail_flag("finetune", error)
    return 0


__all__ = [
    "LORA_TARGETS",
    "SHARDED_CHECKPOINT_ERROR",
    "SHARDED_LOAD_ERROR",
    "FinetuneArguments",
    "FinetuneResult",
    "add_arguments",
    "apply_lora",
    "check_lora_targets",
    "check_sharded_finetune",
    "check_training_arguments",
    "finetune",
    "load_finetuned",
    "lora_targets",
    "run",
]
