"""The argument dataclasses of ``pretrain`` and ``finetune`` (each field is also a ``--flag``).

``PretrainArguments`` (flags after transformers' ``run_mlm_no_trainer.py``) and ``FinetuneArguments`` (after
``run_glue.py`` / ``run_ner.py``; ``TrainingArguments`` hold the rest) share two bases: ``ShardingArguments``
(the ``DistributedConfig`` sizes of a sharded run under ``torchrun`` and their ``layout``) and
``outputs.OutputDirArguments`` (``--overwrite_output_dir``). Each ``__post_init__`` checks every value that
needs no file and raises ``FlagError`` (a ``ValueError``) naming the flag; paths, data, configs and the output
folder are checked by the command before it writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from transformers import SchedulerType

from ..cli_utils import (
    FlagError,
    check_choice,
    check_field_types,
    check_int,
    check_number,
    check_percentage,
    check_positive,
    check_seed,
)
from ..models import FAMILIES
from .modeling import check_model_type
from .outputs import OutputDirArguments
from .sharded import SIZE_FLAGS, ParallelLayout

FAMILY_CHOICES = "{" + ",".join(FAMILIES) + "}"
"""How ``--help`` shows the values of ``--model_type`` (checked by ``check_model_type``, which names the flag
in the command's one error line, rather than by argparse's ``choices``)."""
SCHEDULER_TYPES = tuple(s.value for s in SchedulerType if s.value not in ("reduce_lr_on_plateau", "greedy"))
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes of ``torch.compile`` (``--torch_compile_mode``; the same as ``TrainingArguments``')."""
TASKS = ("sequence_classification", "token_classification")


def has_accelerator() -> bool:
    """Whether torch has a device besides the CPU to train on (CUDA, XPU, MPS, …): where accelerate and
    ``Trainer`` apply fp16 autocast at all."""
    import torch

    return torch.accelerator.is_available()


def check_adamw(values: Any) -> None:
    """``FlagError`` for a bad AdamW setting of ``values`` (``PretrainArguments`` or ``TrainingArguments``):
    the learning rate > 0, weight decay ≥ 0, β1 and β2 in [0, 1), ε > 0, the clipping norm ≥ 0."""
    check_number("learning_rate", values.learning_rate, 0, open_low=True)
    check_number("weight_decay", values.weight_decay, 0)
    check_number("adam_beta1", values.adam_beta1, 0, 1, open_high=True)
    check_number("adam_beta2", values.adam_beta2, 0, 1, open_high=True)
    check_number("adam_epsilon", values.adam_epsilon, 0, open_low=True)
    check_number("max_grad_norm", values.max_grad_norm, 0)


@dataclass(kw_only=True)
class ShardingArguments:
    """The sizes of a sharded run (``torchrun``, Transformers' ``DistributedConfig``; docs/training.md)."""

    fsdp_size: int = field(
        default=1,
        metadata={"help": "Sharded run (torchrun, Transformers' DistributedConfig; docs/training.md): ranks "
                  "every parameter is FSDP2-sharded over. dp_replicate_size × fsdp_size × tp_size = "
                  "WORLD_SIZE."},
    )
    tp_size: int = field(
        default=1,
        metadata={"help": "Sharded run: tensor-parallel ranks (the family's base_model_tp_plan; finetune: "
                  "GPUs only, accelerate refuses it on CPU)."}
    )
    dp_replicate_size: int = field(
        default=1,
        metadata={"help": "Sharded run: replicas of the FSDP shards (HSDP; e.g. the number of nodes)."}
    )

    @property
    def layout(self) -> ParallelLayout:
        """The process mesh of ``--dp_replicate_size``/``--fsdp_size``/``--tp_size`` (sharded iff one is >
        1)."""
        return ParallelLayout(tp_size=self.tp_size, fsdp_size=self.fsdp_size,
                              dp_replicate_size=self.dp_replicate_size)

    def check_sizes(self) -> None:
        """``FlagError`` unless every size is a positive integer."""
        for name in SIZE_FLAGS:
            check_positive(name, getattr(self, name))

    def sizes_text(self) -> str:
        """The size flag an error about the layout names, with its value (``"fsdp_size=2"``)."""
        flag = self.layout.flag()
        return f"{flag}={getattr(self, flag)}"


@dataclass
class PretrainArguments(ShardingArguments, OutputDirArguments):
    """Arguments of ``pretrain`` (each field is also a ``--flag``; names follow run_mlm_no_trainer.py)."""

    argument_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "model and data": (
            "model_type", "model_name_or_path", "config_name", "config_overrides", "tokenizer_name",
            "objective", "train_file", "validation_file", "dataset_name", "dataset_config_name",
            "text_column_name", "streaming", "packing", "max_seq_length", "validation_split_percentage",
            "mlm_probability", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"),
        "output": (
            "output_dir", "overwrite_output_dir", "write_into_output_dir", "logging_steps", "eval_steps",
            "checkpointing_steps", "checkpointing_minutes", "save_total_limit", "resume_from_checkpoint",
            "with_tracking", "disable_tqdm"),
        "training": (
            "max_train_steps", "num_train_epochs", "per_device_train_batch_size",
            "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type",
            "num_warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
            "mixed_precision", "mixed_length_splits", "torch_compile", "torch_compile_backend",
            "torch_compile_mode", "seed"),
        "scale-out (torchrun, docs/scaling.md)": ("fsdp_size", "tp_size", "dp_replicate_size"),
    }
    """How ``pretrain --help`` groups the flags (``cli_utils.add_dataclass_arguments``)."""

    output_dir: str = field(metadata={"help": "Where the final model, train_log.jsonl and checkpoints go."})
    model_type: str | None = field(
        default=None,
        metadata={"help": "Family to train from scratch (or --model_name_or_path / --config_name).",
                  "metavar": FAMILY_CHOICES}
    )
    config_overrides: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": 'Config fields as "k=v,k=v", e.g. "hidden_size=64,num_hidden_layers=2" '
                  '(lists in brackets: "synthesizer_components=[random,vanilla]"). From Python also a dict.'},
    )
    config_name: str | None = field(default=None,
                                    metadata={"help": "Config folder/file (or Hub id) to start from."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A pretrained model to continue training (else from scratch): a local folder "
                  "or a Hub id (from_pretrained)."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer folder; default: the embedded pydoc WordPiece tokenizer."}
    )
    objective: Literal["mlm", "clm"] = field(
        default="mlm", metadata={"help": "mlm (masked LM, bidirectional) or clm (causal LM)."}
    )
    train_file: str | None = field(
        default=None,
        metadata={"help": "Local .txt/.json/.jsonl/.csv/.parquet: one file, a glob ('corpus/part-*.jsonl') "
                  "or several, comma-separated (from Python also a list); default: the embedded corpus."},
    )
    validation_file: str | None = field(
        default=None,
        metadata={"help": "Local validation file(s) or glob (same format; several comma-separated)."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A datasets dataset instead of files: a Hub name or a local dataset folder "
                  "(datasets.load_dataset); its validation split is used when it has one."},
    )
    dataset_config_name: str | None = field(default=None,
                                            metadata={"help": "The configuration of dataset_name."})
    text_column_name: str | None = field(default=None,
                                         metadata={"help": "Text column (default: text / first)."})
    streaming: bool = field(
        default=False,
        metadata={"help": "Read the data as training goes (datasets IterableDataset, tokenized and packed on "
                  "the fly, each data-parallel rank its own part); needs max_train_steps."},
    )
    packing: Literal["concat", "documents"] = field(
        default="concat",
        metadata={"help": "concat: one token stream cut into blocks (run_mlm's group_texts); documents: also "
                  "position_ids restarting at every document, so attention stays within documents."},
    )
    validation_split_percentage: int = field(
        default=5, metadata={"help": "Held-out %% of train_file when there is no validation_file."}
    )
    max_seq_length: int = field(default=128, metadata={"help": "Block length the texts are grouped into."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per process."})
    per_device_eval_batch_size: int = field(default=8,
                                            metadata={"help": "Evaluation batch size per process."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak AdamW learning rate."})
    weight_decay: float = field(default=0.01,
                                metadata={"help": "AdamW weight decay (not on biases/norms/gains)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW β1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW β2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW ε."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 = off)."})
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": "Learning-rate schedule after warm-up.", "choices": SCHEDULER_TYPES}
    )
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps in total; overrides num_train_epochs."}
    )
    num_train_epochs: int = field(default=3, metadata={"help": "Epochs when max_train_steps is not set."})
    gradient_accumulation_steps: int = field(default=1,
                                             metadata={"help": "Micro-batches per optimizer step."})
    checkpointing_steps: str | None = field(
        default=None,
        metadata={"help": 'Save a checkpoint every N optimizer steps, or "epoch" (besides the one every '
                  "--checkpointing_minutes)."},
    )
    checkpointing_minutes: float = field(
        default=10.0,
        metadata={"help": "Also save a checkpoint once this many minutes have passed since the last one (or "
                  "the start), so that a kill loses at most that much training; 0 = only "
                  "--checkpointing_steps."},
    )
    save_total_limit: int | None = field(
        default=None,
        metadata={"help": "Keep only the newest N checkpoints (and the one the run resumed from)."}
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={"help": 'A checkpoint folder, or "latest" (the newest complete one under '
                  'output_dir/checkpoints). Without it, a rerun into the same output_dir resumes from '
                  "there by itself."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, data order, masks and dropout."})
    with_tracking: bool = field(default=False,
                                metadata={"help": "Log to TensorBoard under output_dir/tensorboard."})
    mixed_precision: Literal["no", "fp16", "bf16"] = field(
        default="no", metadata={"help": "Autocast precision (fp16 needs a GPU; bf16 works on recent CPUs)."}
    )
    torch_compile: bool = field(
        default=False,
        metadata={"help": "Compile the model for training with torch.compile (inductor; the first step "
                  "compiles, which takes a while). Checkpoints and the final model are the plain model's; "
                  "evaluation runs eagerly."},
    )
    torch_compile_backend: str | None = field(
        default=None,
        metadata={"help": "torch.compile's backend with --torch_compile (default: inductor; any of "
                  "torch.compiler.list_backends(exclude_tags=()), e.g. aot_eager to check a model's graphs "
                  "without generating kernels)."},
    )
    torch_compile_mode: str | None = field(
        default=None,
        metadata={"help": "torch.compile's mode with --torch_compile (default: torch's own).",
                  "choices": COMPILE_MODES},
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens selected for MLM."})
    mixed_length_splits: list[int] | None = field(
        default=None,
        metadata={"help": "Mixed-length pretraining (Su 2022's second remedy for relu² GAU): each "
                  "micro-batch's blocks are cut into k equal shorter blocks, k drawn per micro-batch from "
                  "this list (deterministic in seed and step; each k must divide max_seq_length; tokens per "
                  "step unchanged)."},
    )
    logging_steps: int = field(default=10, metadata={"help": "Write a train_log.jsonl row every N steps."})
    eval_steps: int | None = field(
        default=None,
        metadata={"help": "Also evaluate every N steps (always: each epoch end and the last step)."}
    )
    max_train_samples: int | None = field(default=None,
                                          metadata={"help": "Use only the first N train blocks."})
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "Use only the first N validation blocks; with --streaming: the first N validation "
                  "examples, held out of the training stream when there is no validation file or split."},
    )
    preprocessing_num_workers: int | None = field(default=None,
                                                  metadata={"help": "Processes for datasets.map."})
    disable_tqdm: bool = field(default=False,
                               metadata={"help": "No progress bars (training and datasets.map)."})

    def __post_init__(self) -> None:
        """Check every value that needs no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it.
        Paths, data, the model config and the output folder are checked by ``pretrain`` before it writes
        anything."""
        self._from_python()
        check_field_types(self)
        if self.model_type is None and self.config_name is None and self.model_name_or_path is None:
            raise FlagError("model_type", "Pass --model_type (entropy_invariant, gau, synthesizer, …), "
                                          "--config_name or --model_name_or_path.")
        if self.model_type is not None:
            check_model_type(self.model_type)
        check_choice("objective", self.objective, ("mlm", "clm"))
        check_choice("mixed_precision", self.mixed_precision, ("no", "fp16", "bf16"))
        check_choice("lr_scheduler_type", self.lr_scheduler_type, SCHEDULER_TYPES)
        self._check_compile()
        self._check_numbers()
        self.check_sizes()
        if self.layout.sharded and self.mixed_precision == "fp16":
            raise FlagError("mixed_precision",
                            "mixed_precision='fp16' needs a loss scaler, which a sharded run "
                            f"({self.sizes_text()}) has not; use bf16.")
        if self.mixed_precision == "fp16" and not has_accelerator():
            raise FlagError("mixed_precision",
                            "mixed_precision='fp16' needs a GPU: on a CPU accelerate applies none, so the "
                            "run would train in float32; use bf16 (recent CPUs) or no.")
        self._check_data()
        self._check_schedules()

    def _from_python(self) -> None:
        """What a Python caller may pass that the command line spells as one string: several files as a list
        (joined by commas, as ``--train_file a,b``) and a checkpoint cadence as an int."""
        import os

        for name in ("train_file", "validation_file"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                items = [os.fspath(item) if isinstance(item, os.PathLike) else item for item in value]
                if not items or not all(isinstance(item, str) and item for item in items):
                    raise FlagError(name, f"{name} must be file names or globs, got {value!r}.")
                setattr(self, name, ",".join(items))
        if isinstance(self.checkpointing_steps, int) and not isinstance(self.checkpointing_steps, bool):
            self.checkpointing_steps = str(self.checkpointing_steps)

    def _check_compile(self) -> None:
        """``--torch_compile_mode`` is one of ``COMPILE_MODES``, ``--torch_compile_backend`` one of torch's
        backends, and both need ``--torch_compile``."""
        for name in ("torch_compile_backend", "torch_compile_mode"):
            if getattr(self, name) is not None and not self.torch_compile:
                raise FlagError(name, f"{name} needs --torch_compile too.")
        if self.torch_compile_mode is not None:
            check_choice("torch_compile_mode", self.torch_compile_mode, COMPILE_MODES)
        if self.torch_compile_backend is not None:
            import torch

            check_choice("torch_compile_backend", self.torch_compile_backend,
                         torch.compiler.list_backends(exclude_tags=()))

    def _check_data(self) -> None:
        """The data source and how it is read: files or a dataset (not both), and what ``--streaming``
        needs."""
        check_choice("packing", self.packing, ("concat", "documents"))
        for name in ("dataset_name", "dataset_config_name"):
            if getattr(self, name) is not None and not str(getattr(self, name)).strip():
                raise FlagError(name, f"{name} must name a dataset (a local folder or a Hub id), got ''.")
        if self.dataset_name is not None:
            for name in ("train_file", "validation_file"):
                if getattr(self, name) is not None:
                    raise FlagError(name, f"{name} and dataset_name are two sources; pass one of them.")
        elif self.dataset_config_name is not None:
            raise FlagError("dataset_config_name", "dataset_config_name needs a dataset_name.")
        for name in ("validation_file", "text_column_name"):
            if getattr(self, name) is not None and self.train_file is None and self.dataset_name is None:
                raise FlagError(name,
                                f"{name} needs a train_file or dataset_name (the embedded corpus is one text "
                                "column).")
        if self.packing == "documents" and self.mixed_length_splits is not None:
            raise FlagError("mixed_length_splits",
                            "mixed_length_splits cuts blocks into pieces, which would cut "
                            "documents without restarting their positions; use --packing concat.")
        if self.streaming:
            self._check_streaming()

    def _check_streaming(self) -> None:
        """``--streaming`` reads until ``--max_train_steps``; flags about a whole, indexed dataset do not
        apply."""
        if self.max_train_steps is None:
            raise FlagError("max_train_steps",
                            "max_train_steps is required with --streaming (a stream has no "
                            "length to count epochs in).")
        if self.train_file is None and self.dataset_name is None:
            raise FlagError("streaming",
                            "streaming needs a train_file or dataset_name (the embedded corpus is small "
                            "and read whole).")
        if self.checkpointing_steps == "epoch":
            raise FlagError("checkpointing_steps",
                            'checkpointing_steps="epoch" has no meaning with --streaming '
                            "(no epochs); pass a number of steps.")
        for name, reason in (("max_train_samples", "the stream is read until max_train_steps"),
                             ("preprocessing_num_workers", "the stream is tokenized as it is read")):
            if getattr(self, name) is not None:
                raise FlagError(name, f"{name} does not apply with --streaming ({reason}).")

    def _check_numbers(self) -> None:
        """Sizes, counts, rates and probabilities."""
        for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                     "num_train_epochs", "gradient_accumulation_steps", "logging_steps"):
            check_positive(name, getattr(self, name))
        for name in ("max_train_steps", "eval_steps", "max_train_samples", "max_eval_samples",
                     "preprocessing_num_workers", "save_total_limit"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        check_int("num_warmup_steps", self.num_warmup_steps, 0)
        check_percentage("validation_split_percentage", self.validation_split_percentage)
        check_seed("seed", self.seed)
        check_number("mlm_probability", self.mlm_probability, 0, 1, open_low=True, open_high=True)
        check_number("checkpointing_minutes", self.checkpointing_minutes, 0)
        check_adamw(self)

    def _check_schedules(self) -> None:
        """``--mixed_length_splits`` (divisors of the block length) and ``--checkpointing_steps`` (N or
        epoch)."""
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


@dataclass
class FinetuneArguments(ShardingArguments, OutputDirArguments):
    """Model, data, LoRA and early-stopping flags of ``finetune`` (``TrainingArguments`` hold the rest)."""

    argument_groups: ClassVar[dict[str, tuple[str, ...]]] = {
        "model and data": (
            "model_name_or_path", "model_type", "config_name", "config_overrides", "tokenizer_name", "task",
            "train_file", "validation_file", "validation_split_percentage", "text_column_name",
            "text_pair_column_name", "label_column_name", "max_seq_length", "pad_to_max_length",
            "max_train_samples", "max_eval_samples", "label_all_tokens", "return_entity_level_metrics"),
        "output": ("overwrite_output_dir", "write_into_output_dir", "checkpointing_minutes"),
        "LoRA and early stopping": (
            "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_merge",
            "early_stopping_patience", "early_stopping_threshold"),
        "scale-out (torchrun, docs/scaling.md)": ("fsdp_size", "tp_size", "dp_replicate_size"),
    }
    """How ``finetune --help`` groups its own flags; ``TrainingArguments`` follow in a group of their own."""

    task: Literal["sequence_classification", "token_classification"] = field(
        default="sequence_classification",
        metadata={"help": "sequence_classification or token_classification."}
    )
    train_file: str | None = field(default=None,
                                   metadata={"help": "Local csv/json/jsonl/parquet training file."})
    validation_file: str | None = field(default=None,
                                        metadata={"help": "Local validation file (same format)."})
    validation_split_percentage: int = field(
        default=10, metadata={"help": "Held-out %% of train_file when there is no validation_file."}
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Pretrained model: a local folder (e.g. a pretrain output_dir) or a Hub id."}
    )
    model_type: str | None = field(default=None, metadata={"help": "Family to build from scratch instead.",
                                                           "metavar": FAMILY_CHOICES})
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
    pad_to_max_length: bool = field(default=False,
                                    metadata={"help": "Pad to max_seq_length (else per batch)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N train rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N eval rows."})
    label_all_tokens: bool = field(default=False,
                                   metadata={"help": "Label every sub-word, not only the first."})
    return_entity_level_metrics: bool = field(default=False, metadata={"help": "Per-entity-type metrics."})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank; 0 = full finetuning."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA α (update scale α / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA branch."})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Module names to adapt (default per family; 'all-linear' allowed)."}
    )
    lora_merge: bool = field(default=False,
                             metadata={"help": "Also save the merged model to output_dir/merged."})
    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "Stop after N evaluations without improvement."}
    )
    early_stopping_threshold: float = field(default=0.0,
                                            metadata={"help": "Minimum improvement that counts."})
    checkpointing_minutes: float = field(
        default=10.0,
        metadata={"help": "Also save a checkpoint once this many minutes have passed since the last one (or "
                  "the start), so that a kill loses at most that much training; 0 = only Trainer's "
                  "--save_strategy (none with --save_strategy no)."},
    )

    def __post_init__(self) -> None:
        """Check every value that needs no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it.
        Paths, data, config, model and the output folder are checked by ``finetune`` before it writes
        anything."""
        check_field_types(self)
        if self.task not in TASKS:
            raise FlagError("task", f"task must be one of {TASKS}, got {self.task!r}.")
        if self.train_file is None:
            raise FlagError("train_file", "train_file is required (a local csv/json/jsonl/parquet file).")
        if self.model_name_or_path is None and self.model_type is None and self.config_name is None:
            raise FlagError("model_name_or_path",
                            "Pass --model_name_or_path (a pretrained folder) or --model_type "
                            "to start from scratch.")
        if self.model_type is not None:
            check_model_type(self.model_type)
        check_percentage("validation_split_percentage", self.validation_split_percentage)
        check_positive("max_seq_length", self.max_seq_length)
        for name in ("max_train_samples", "max_eval_samples", "early_stopping_patience"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        check_number("early_stopping_threshold", self.early_stopping_threshold, 0)
        check_number("checkpointing_minutes", self.checkpointing_minutes, 0)
        self._check_lora()
        if self.task == "sequence_classification":
            for name in ("label_all_tokens", "return_entity_level_metrics"):
                if getattr(self, name):
                    raise FlagError(name, f"{name} applies to --task token_classification only.")
        self.check_sizes()
        if self.layout.sharded and self.lora_r > 0:
            raise FlagError("lora_r",
                            f"lora_r: LoRA is not supported on a sharded model ({self.sizes_text()}): "
                            "peft's modules_to_save copies the sharded classifier head, which fails with "
                            "\"RuntimeError: Attempted to call copy_() on an invalid python storage.\"")

    def _check_lora(self) -> None:
        """The LoRA flags: rank, α, dropout; targets and merging only with a rank."""
        check_int("lora_r", self.lora_r, 0)
        check_positive("lora_alpha", self.lora_alpha)
        check_number("lora_dropout", self.lora_dropout, 0, 1, open_high=True)
        if self.lora_r == 0:
            for name in ("lora_merge", "lora_target_modules"):
                if getattr(self, name):
                    raise FlagError(name, f"{name} needs LoRA: pass --lora_r > 0 too.")
        if isinstance(self.lora_target_modules, list) and self.lora_target_modules == ["all-linear"]:
            self.lora_target_modules = "all-linear"


__all__ = ["COMPILE_MODES", "SCHEDULER_TYPES", "TASKS", "FinetuneArguments", "PretrainArguments",
           "ShardingArguments", "check_adamw"]
