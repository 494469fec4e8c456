"""The arguments of a length-generalisation study (``LengthGenArguments``) and their checks.

``LengthGenArguments`` validates every value that needs no file in ``__post_init__``;
``check_study_inputs`` checks the rest (output folder, data files, every variant's config at the study's
size) before anything is written. A bad value raises ``FlagError`` naming its flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Literal

from ..cli_utils import (
    FlagError,
    check_field_types,
    check_number,
    check_output_dir,
    check_seed,
    names_in_message,
)
from .tasks import COPY, TASK_WEIGHT_DECAY, TASKS, min_length, vocabulary
from .variants import (
    DEFAULT_VARIANTS,
    NOPE_INTERVAL,
    POSITION_SCHEMES,
    QUICK_VARIANTS,
    TASK_VARIANTS,
    ModelSize,
    config_fields,
    get_variant,
    max_length_of,
    position_applies,
)

QUICK_SETTINGS: dict[str, Any] = {
    "train_length": 16, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_train_steps": 3, "per_device_train_batch_size": 4, "num_warmup_steps": 0, "max_train_samples": 32,
    "eval_mask_repeats": 1, "max_eval_tokens": 512, "finetune_epochs": 1.0, "finetune_max_train_samples": 64,
}
"""What ``--quick`` sets (a smoke test in seconds, not a measurement)."""

LM_DEFAULTS: dict[str, Any] = {
    "train_length": 64, "max_train_steps": 400, "per_device_train_batch_size": 16, "learning_rate": 2e-3,
    "num_warmup_steps": 30, "hidden_dropout_prob": 0.1,
}
"""The language-model study's defaults of the flags whose default depends on ``--task``."""
TASK_DEFAULTS: dict[str, Any] = {
    "train_length": 32, "per_device_train_batch_size": 64, "learning_rate": 3e-3, "num_warmup_steps": 50,
    "hidden_dropout_prob": 0.0,
}
"""The retrieval tasks' defaults of the same flags (calibrated in docs/length_generalization.md:
``ei_standard`` with RoPE learns each task at L within this budget, and the whole study fits about 30 minutes
on 2 shared cores)."""
TASK_STEPS = {"passkey": 400, "mqar": 1500}
"""The retrieval tasks' default ``max_train_steps``."""
TASK_COPY_WARMUP = {"passkey": 0, "mqar": 750}
"""The retrieval tasks' default ``copy_warmup_steps`` (at most half of ``max_train_steps``): MQAR is
learned at L only after the copy warm-up (docs/length_generalization.md, "MQAR at L")."""
TASK_EVAL_RATIOS = (1, 2, 4, 8, 16, 32, 64)
"""The retrieval tasks' default evaluation lengths, in multiples of L (L … 64L)."""
QUICK_TASK_SETTINGS: dict[str, Any] = {
    "train_length": 16, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_train_steps": 3,
    "per_device_train_batch_size": 4, "num_warmup_steps": 0, "num_kv_pairs": 2, "eval_samples": 4,
}
"""What ``--quick`` sets for ``--task passkey|mqar`` (eval lengths L, 2L, 4L; variants as for lm)."""
TASK_ONLY_FIELDS = ("task", "position_embedding_types", "num_kv_pairs", "passkey_digits", "task_vocab_size",
                    "eval_samples", "eval_memory_gib", "task_bos", "weight_decay", "copy_warmup_steps",
                    "save_models")
"""Flags of the retrieval tasks only: ``--task lm`` leaves them out of ``run.json`` (as before they
existed)."""
LM_ONLY_FLAGS = {"mixed_length": False, "finetune": False, "train_file": None, "validation_file": None}
"""Flags of the language-model study that the retrieval tasks refuse (their value there must be this)."""


@dataclass
class LengthGenArguments:
    """Arguments of ``lengthgen`` (each field is also a ``--flag``)."""

    output_dir: str = field(default="runs/lengthgen", metadata={"help": "Where runs, results and plots go."})
    variants: list[str] | None = field(
        default=None, metadata={"help": f"Variant names (default: all of {list(DEFAULT_VARIANTS)}); append "
                                "'+mixed' to a name for its mixed-length-pretrained copy."})
    task: Literal["lm", "passkey", "mqar"] = field(
        default="lm",
        metadata={"help": "lm: language modelling on the corpus (MLM/CLM loss by length); passkey: "
                                "passkey retrieval; mqar: multi-query associative recall (exact-match "
                                "accuracy by length; generated from the seed, loss on the answers only, "
                                "causal LMs)."})
    train_length: int | None = field(default=None, metadata={"help": "Training length L (tokens per block; "
                                                               "default lm 64, tasks 32)."})
    eval_lengths: list[int] | None = field(
        default=None,
        metadata={"help": "Evaluation lengths (default lm: L/4, L/2, L, 2L, 4L, 8L; tasks: L, 2L … 64L)."})
    max_train_steps: int | None = field(default=None,
                                        metadata={"help": "Optimizer steps of every run (default lm "
                                                                   f"{LM_DEFAULTS['max_train_steps']}, tasks "
                                                                   f"{TASK_STEPS})."})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Seeds; several → mean ± std."})
    mixed_length: bool = field(
        default=False,
        metadata={"help": "Also train a mixed-length copy ('+mixed') of every selected variant."})
    mixed_length_splits: list[int] = field(
        default_factory=lambda: [1, 2, 4],
        metadata={"help": "Mixed-length pretraining: each batch's L-token blocks are cut into k pieces, "
                  "k drawn from this list per batch (lengths L, L/2, L/4; same tokens per step)."})
    objective: Literal["mlm", "clm"] = field(
        default="mlm", metadata={"help": "Objective of the family variants (the stock Llama is always clm)."})
    hidden_size: int = field(default=64, metadata={"help": "Hidden size of every variant."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Layers (GAU: gau_layer_factor × this)."})
    num_attention_heads: int = field(default=4, metadata={"help": "Heads of the multi-head variants."})
    intermediate_size: int | None = field(default=None, metadata={"help": "FFN width (default 4·hidden)."})
    attention_key_size: int | None = field(default=None,
                                           metadata={"help": "GAU key size s (default hidden/2)."})
    gau_layer_factor: int = field(default=2,
                                  metadata={"help": "GAU layers per attention+FFN layer (FLASH: 2)."})
    synthesizer_length_factor: int = field(
        default=2, metadata={"help": "Synthesizer max_position_embeddings = this × L (longer: n/a)."})
    hidden_dropout_prob: float | None = field(
        default=None, metadata={"help": "Dropout of the family variants (default lm 0.1, tasks 0)."})
    initializer_range: float | None = field(
        default=None, metadata={"help": "Init std of every variant (default: each config's own, 0.02; GAU's "
                                "projections then follow its gau_init, GAU-α's by default)."})
    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={"help": f"Training batch size (default lm {LM_DEFAULTS['per_device_train_batch_size']}, "
                                f"tasks {TASK_DEFAULTS['per_device_train_batch_size']})."})
    learning_rate: float | None = field(
        default=None, metadata={"help": "Peak AdamW learning rate, linear decay (default lm "
                                        f"{LM_DEFAULTS['learning_rate']}, "
                                f"tasks {TASK_DEFAULTS['learning_rate']})."})
    num_warmup_steps: int | None = field(
        default=None, metadata={"help": f"Warm-up steps (default lm {LM_DEFAULTS['num_warmup_steps']}, tasks "
                                f"{TASK_DEFAULTS['num_warmup_steps']})."})
    position_embedding_types: list[str] | None = field(
        default=None,
        metadata={"help": "Position schemes, a study axis of the tasks: rope, none (series "
                                "'<variant>+nope') and/or nope_every_4 (RoPE with every 4th layer without, "
                                "entropy-invariant family only; series '<variant>+nope_every_4'); the stock "
                                "Llama is RoPE only. Default lm: rope; tasks: rope none."})
    num_kv_pairs: int = field(default=2,
                              metadata={"help": "mqar: key-value pairs per example (all queried)."})
    passkey_digits: int = field(default=3, metadata={"help": "passkey: digits of the passkey."})
    task_vocab_size: int = field(default=64,
                                 metadata={"help": "Tasks: vocabulary size (4 special tokens, digits or "
                                                       "keys and values, filler)."})
    task_bos: bool | None = field(
        default=None, metadata={"help": "Tasks: start every sequence with BOS (default yes; false: filler "
                                        "from the first token on)."})
    weight_decay: float | None = field(
        default=None, metadata={"help": f"Tasks: AdamW weight decay (default {TASK_WEIGHT_DECAY})."})
    copy_warmup_steps: int | None = field(
        default=None, metadata={"help": "Tasks: the first N of max_train_steps train on a copy task (the "
                                        "last third of each sequence repeats an earlier span), which builds "
                                        "the induction circuit MQAR needs. Default: passkey 0; mqar "
                                        f"{TASK_COPY_WARMUP['mqar']}, at most half the steps."})
    save_models: bool = field(
        default=False, metadata={"help": "Tasks: keep each trained model in runs/<series>/seed_<s>/model "
                                         "(for hf-attn-variants entropy); a finished run without one is "
                                         "redone."})
    eval_samples: int = field(default=32,
                              metadata={"help": "Tasks: evaluation sequences per length (the same for "
                                                    "every run: seeded by eval_seed)."})
    eval_memory_gib: float = field(default=24.0,
                                   metadata={"help": "Tasks: evaluation batches at each length sized "
                                                           "to fit this much memory (attention maps)."})
    train_file: str | None = field(default=None,
                                   metadata={"help": "Local text file (default: embedded corpus)."})
    validation_file: str | None = field(default=None, metadata={"help": "Local validation text file."})
    max_train_samples: int | None = field(default=None,
                                          metadata={"help": "Use only the first N train blocks."})
    eval_batch_size: int = field(default=8, metadata={"help": "Evaluation batch size."})
    eval_mask_repeats: int = field(default=2,
                                   metadata={"help": "MLM: maskings of the validation text pooled."})
    eval_seed: int = field(default=1234,
                           metadata={"help": "Seed of the evaluation masks (same for all runs)."})
    max_eval_tokens: int | None = field(default=None,
                                        metadata={"help": "Use only the first N validation tokens."})
    checkpointing_steps: int | None = field(
        default=None,
        metadata={"help": "Checkpoint every N steps so an interrupted run resumes mid-training."})
    finetune: bool = field(
        default=False,
        metadata={"help": "Afterwards run the finetune-at-other-lengths experiment (GAU variants)."})
    finetune_tasks: list[str] = field(
        default_factory=lambda: ["sequence", "token"],
        metadata={"help": "Finetune task forms: sequence (classification from [CLS]) and/or token (every "
                          "word "
                  "tagged with its snippet's topic)."})
    finetune_topics: int = field(default=8,
                                 metadata={"help": "Finetune task: number of pydoc topics (classes)."})
    finetune_words: int = field(default=12, metadata={"help": "Finetune task: words per snippet."})
    finetune_epochs: float = field(default=3.0, metadata={"help": "Finetune epochs."})
    finetune_learning_rate: float = field(default=1e-3, metadata={"help": "Finetune learning rate."})
    finetune_batch_size: int = field(default=32, metadata={"help": "Finetune batch size."})
    finetune_max_train_samples: int | None = field(default=None,
                                                   metadata={"help": "Finetune: first N snippets."})
    num_threads: int | None = field(default=None,
                                    metadata={"help": "torch.set_num_threads (default: torch's)."})
    quick: bool = field(default=False,
                        metadata={"help": f"Smoke-test sizes: {QUICK_SETTINGS}, each only where its flag is "
                                                 "left at its default (a given value wins); default variants "
                                                 f"{list(QUICK_VARIANTS)}, eval lengths L/2…4L."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bars."})
    no_plot: bool = field(default=False, metadata={"help": "Skip the PNG plots."})

    @property
    def is_task(self) -> bool:
        """Whether the study is a retrieval task (passkey, mqar) rather than language modelling."""
        return self.task != "lm"

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.task not in ("lm", *TASKS):
            raise FlagError("task", f"task must be one of ('lm', 'passkey', 'mqar'), got {self.task!r}.")
        self._apply_defaults()
        names = list(self.variants or (TASK_VARIANTS if self.is_task else DEFAULT_VARIANTS))
        for name in names:
            get_variant(name)
        if self.mixed_length:
            names += [get_variant(n).mixed().name for n in names if not get_variant(n).mixed_length]
        self.variants = list(dict.fromkeys(names))
        _positive("train_length", self.train_length, 4)
        if self.eval_lengths is None:
            length = self.train_length
            ratios = TASK_EVAL_RATIOS if self.is_task else (0.25, 0.5, 1, 2, 4, 8)
            self.eval_lengths = [int(length * r) for r in ratios if length * r >= 2]
        if not self.eval_lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 2
                                        for n in self.eval_lengths):
            raise FlagError("eval_lengths",
                            "eval_lengths must be a non-empty list of integers >= 2, got "
                            f"{self.eval_lengths}.")
        self.eval_lengths = sorted(set(self.eval_lengths))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise FlagError("seeds",
                            f"seeds must be a non-empty list of distinct integers, got {self.seeds}.")
        for seed in self.seeds:
            check_seed("seeds", seed)
        check_seed("eval_seed", self.eval_seed)
        for name in ("max_train_steps", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "gau_layer_factor", "synthesizer_length_factor", "per_device_train_batch_size",
                     "eval_batch_size", "eval_mask_repeats", "finetune_topics", "finetune_words",
                     "finetune_batch_size"):
            _positive(name, getattr(self, name))
        for name in ("intermediate_size", "attention_key_size", "max_train_samples", "max_eval_tokens",
                     "checkpointing_steps", "num_threads", "finetune_max_train_samples"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        _positive("num_warmup_steps", self.num_warmup_steps, 0)
        if self.hidden_size % self.num_attention_heads:
            raise FlagError("num_attention_heads", f"hidden_size ({self.hidden_size}) must be divisible by "
                                                   f"num_attention_heads ({self.num_attention_heads}).")
        if (not self.mixed_length_splits or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                                for k in self.mixed_length_splits)
                or any(self.train_length % k for k in self.mixed_length_splits)):
            raise FlagError("mixed_length_splits", f"mixed_length_splits must be positive integers dividing "
                                                   f"train_length={self.train_length}, got "
                                                   f"{self.mixed_length_splits}.")
        if not self.finetune_tasks or any(t not in ("sequence", "token") for t in self.finetune_tasks):
            raise FlagError("finetune_tasks", "finetune_tasks must be a non-empty list of "
                                              f"'sequence'/'token', got {self.finetune_tasks}.")
        if self.objective not in ("mlm", "clm"):
            raise FlagError("objective", f"objective must be one of ('mlm', 'clm'), got {self.objective!r}.")
        check_number("hidden_dropout_prob", self.hidden_dropout_prob, 0, 1, open_high=True)
        if self.initializer_range is not None:
            check_number("initializer_range", self.initializer_range, 0, 1, open_low=True, open_high=True)
        for name in ("learning_rate", "finetune_learning_rate", "finetune_epochs"):
            check_number(name, getattr(self, name), 0, open_low=True)
        if self.validation_file is not None and self.train_file is None:
            raise FlagError("validation_file", "validation_file needs a train_file (without either, the "
                                               "embedded corpus is used).")
        self._check_evaluation()
        self._check_task()

    def _apply_defaults(self) -> None:
        """``--quick``'s settings, then the defaults of the flags that depend on ``--task`` where none was
        given."""
        if self.quick:
            self._apply_quick()
        defaults = {**TASK_DEFAULTS,
                    "max_train_steps": TASK_STEPS[self.task]} if self.is_task else LM_DEFAULTS
        for key, value in defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.is_task and self.copy_warmup_steps is None:
            self.copy_warmup_steps = min(TASK_COPY_WARMUP[self.task], self.max_train_steps // 2)
        if self.position_embedding_types is None:
            self.position_embedding_types = ["rope", "none"] if self.is_task else ["rope"]

    def _apply_quick(self) -> None:
        """``--quick``: its settings (``QUICK_SETTINGS``, ``QUICK_TASK_SETTINGS``) for every flag left at its
        default value; a flag given another value keeps it (``--quick --max_train_steps 50`` trains 50
        steps), so ``--quick`` only shrinks what was not asked for. Its ``max_eval_tokens`` grows to the
        longest explicit evaluation length (fewer tokens than one block would be refused)."""
        defaults = {item.name: item.default for item in dataclass_fields(self)}
        settings = QUICK_TASK_SETTINGS if self.is_task else QUICK_SETTINGS
        applied = [key for key in settings if getattr(self, key) == defaults[key]]
        for key in applied:
            setattr(self, key, settings[key])
        if "nope_every_4" in (self.position_embedding_types or ()):  # the scheme needs its 4 layers
            self.num_hidden_layers = max(self.num_hidden_layers, NOPE_INTERVAL)
        if self.variants is None:
            self.variants = list(QUICK_VARIANTS)
        if self.eval_lengths is None:
            length = self.train_length
            self.eval_lengths = ([length, 2 * length, 4 * length] if self.is_task
                                 else [length // 2, length, 2 * length, 4 * length])
        if "max_eval_tokens" in applied:  # at least one block of the longest length
            longest = max((n for n in self.eval_lengths or () if isinstance(n, int)), default=0)
            self.max_eval_tokens = max(settings["max_eval_tokens"], longest)

    def _check_evaluation(self) -> None:
        """``max_eval_tokens`` holds one block of the longest evaluation length (it was raised silently
        before), and ``--finetune`` follows an MLM pretraining (``--objective mlm``)."""
        longest = max(self.eval_lengths)
        if self.max_eval_tokens is not None and self.max_eval_tokens < longest:
            raise FlagError("max_eval_tokens",
                            f"max_eval_tokens={self.max_eval_tokens} is fewer than the longest of "
                            f"eval_lengths ({longest}): no block of that length would fit; raise it or leave "
                            "it unset (all tokens).")
        if self.finetune and self.objective != "mlm":
            raise FlagError("finetune", f"finetune needs --objective mlm (got {self.objective!r}): the "
                                        "experiment finetunes the GAU variants bidirectionally (Su's setup, "
                                        "classification from [CLS]), which a causally pretrained model never "
                                        "saw in training.")

    def _check_task(self) -> None:
        """The task flags: positive sizes, an example that fits in L, position schemes, no lm-only flag."""
        types = self.position_embedding_types
        if (not types or len(set(types)) != len(types) or any(t not in POSITION_SCHEMES for t in types)
                or (not self.is_task and types != ["rope"])):
            allowed = (f"distinct values of {', '.join(map(repr, POSITION_SCHEMES))}" if self.is_task
                       else "['rope'] for --task lm")
            raise FlagError("position_embedding_types",
                            f"position_embedding_types must be {allowed}, got {types}.")
        if "nope_every_4" in types and self.num_hidden_layers < NOPE_INTERVAL:
            raise FlagError("num_hidden_layers", f"num_hidden_layers={self.num_hidden_layers}: the position "
                            f"scheme nope_every_4 needs at least {NOPE_INTERVAL} layers.")
        for name in ("num_kv_pairs", "passkey_digits", "eval_samples"):
            _positive(name, getattr(self, name))
        _positive("task_vocab_size", self.task_vocab_size, 2)
        check_number("eval_memory_gib", self.eval_memory_gib, 0, open_low=True)
        if self.weight_decay is not None:
            check_number("weight_decay", self.weight_decay, 0)
        if not self.is_task:
            defaults = {f.name: f.default for f in dataclass_fields(self)}
            for name in ("task_bos", "weight_decay", "copy_warmup_steps", "num_kv_pairs", "passkey_digits",
                         "task_vocab_size", "eval_samples", "eval_memory_gib"):
                if getattr(self, name) != defaults[name]:
                    raise FlagError(name, f"{name} applies to --task passkey|mqar only.")
            if self.save_models:
                raise FlagError("save_models", "save_models applies to --task passkey|mqar only (the lm "
                                               "study keeps its models).")
            return
        for name, default in LM_ONLY_FLAGS.items():
            if getattr(self, name) != default:
                raise FlagError(name, f"{name} applies to --task lm only, not to --task {self.task}.")
        if any(get_variant(name).mixed_length for name in self.variants):
            raise FlagError("variants",
                            f"variants: '+mixed' copies apply to --task lm only, not to --task {self.task}.")
        for name in self.variants:  # each runs with the schemes that apply to it (the Llama: RoPE only)
            if not any(position_applies(get_variant(name), position) for position in types):
                raise FlagError("variants", f"variants: {name} runs with none of position_embedding_types "
                                f"{types}.")
        try:
            vocabulary(self.task, self.task_vocab_size, self.num_kv_pairs)
        except ValueError as error:
            raise FlagError("task_vocab_size", str(error)) from None
        _positive("copy_warmup_steps", self.copy_warmup_steps, 0)
        if self.copy_warmup_steps >= self.max_train_steps:
            raise FlagError("copy_warmup_steps", f"copy_warmup_steps={self.copy_warmup_steps} leaves no step "
                                                 f"of the task in max_train_steps={self.max_train_steps}.")
        copy_need = min_length(COPY) - int(self.task_bos is False)
        if self.copy_warmup_steps and self.train_length < copy_need:
            raise FlagError("copy_warmup_steps", f"copy_warmup_steps: a copy example needs {copy_need} "
                                                 f"tokens, more than train_length={self.train_length}.")
        need = min_length(self.task, digits=self.passkey_digits, num_kv_pairs=self.num_kv_pairs)
        if self.train_length < need:
            flag = "passkey_digits" if self.task == "passkey" else "num_kv_pairs"
            raise FlagError(flag, f"{flag}: one {self.task} example needs {need} tokens, more than "
                                  f"train_length={self.train_length}; lower --{flag} or raise "
                                  "--train_length.")
        if min(self.eval_lengths) < need:
            raise FlagError("eval_lengths", f"eval_lengths: {min(self.eval_lengths)} is shorter than one "
                                            f"{self.task} example ({need} tokens).")

    @property
    def size(self) -> ModelSize:
        """The shared ``ModelSize``."""
        return ModelSize(self.hidden_size, self.num_hidden_layers, self.num_attention_heads,
                         self.intermediate_size,
                         self.attention_key_size, self.gau_layer_factor, self.synthesizer_length_factor,
                         self.hidden_dropout_prob, self.initializer_range)


def _positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FlagError(name, f"{name} must be an integer >= {minimum}, got {value!r}.")


STUDY_FLAG_OF_CONFIG_FIELD = {
    "hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size", "attention_key_size": "attention_key_size",
    "hidden_dropout_prob": "hidden_dropout_prob", "initializer_range": "initializer_range",
    "max_position_embeddings": "train_length", "base_length": "train_length",
}
"""Which study flag sets each config field ``config_fields`` derives from the study's flags."""


def _config_error(name: str, error: Exception) -> FlagError:
    """The ``FlagError`` of a config class's ``ValueError`` for variant ``name``: the study flag that set the
    field."""
    named = names_in_message(str(error), list(STUDY_FLAG_OF_CONFIG_FIELD))
    flag = STUDY_FLAG_OF_CONFIG_FIELD[named[0]] if named else "variants"
    reason = str(error).removeprefix("config_overrides: ")
    return FlagError(flag, f"{flag}: variant {name!r} at this size: {reason}")


def _check_task_configs(args: LengthGenArguments) -> None:
    """Every variant × position scheme of a retrieval study builds its config at the study's size."""
    from .retrieval import study_variants, task_config

    for variant in study_variants(args):
        try:
            task_config(variant, config_fields(variant, args.size, args.train_length), args.task_vocab_size)
        except (ValueError, TypeError) as error:
            raise _config_error(variant.name, error) from error


def check_study_inputs(args: LengthGenArguments) -> None:
    """Check what ``LengthGenArguments`` cannot check without files or configs, before anything is written:
    the output folder, the data files (readable, with at least ``train_length`` tokens) and every
    variant's config at the study's size. ``FlagError`` naming the flag of a bad value."""
    from transformers import LlamaConfig

    from ..training import build_config, load_tokenizer
    from ..training.data import holds_tokens
    from .evaluation import validation_datasets

    check_output_dir("output_dir", args.output_dir)
    if args.is_task:
        _check_task_configs(args)
        return
    tokenizer = load_tokenizer(None)
    for name in args.variants:
        variant = get_variant(name)
        fields = config_fields(variant, args.size, args.train_length)
        try:
            if variant.model_type == "llama":
                LlamaConfig(**{k: v for k, v in fields.items() if k != "base_length"})
            else:
                build_config(variant.model_type, config_overrides=fields, tokenizer=tokenizer,
                             max_seq_length=args.train_length)
        except (ValueError, TypeError) as error:  # the config class's own validation, naming the field
            raise _config_error(name, error) from error
    raw = validation_datasets(args.train_file, args.validation_file)
    if not holds_tokens(raw["train"], tokenizer, args.train_length):
        if args.train_file is not None:
            raise FlagError("train_file",
                            f"train_file holds fewer than train_length={args.train_length} tokens.")
        raise FlagError("train_length", f"train_length={args.train_length} is longer than the embedded "
                                        "corpus's training text; lower it, or pass a --train_file that holds "
                                        "that many tokens.")
    _check_validation_text(args, raw["validation"], tokenizer)


def _check_validation_text(args: LengthGenArguments, rows: Any, tokenizer: Any) -> None:
    """The validation text holds one block of the longest evaluation length that some variant runs (the
    Synthesizer's points beyond its length are not run): checked before training, not found by the
    evaluation after it. Names ``validation_file`` (or ``train_file``, whose held-out part it is) when no
    evaluation length fits at all, else ``eval_lengths``."""
    from ..training.data import holds_tokens
    from .evaluation import token_stream

    limits = [max_length_of(v, config_fields(v, args.size, args.train_length))
              for v in map(get_variant, args.variants)]
    run = [n for n in args.eval_lengths if any(limit is None or n <= limit for limit in limits)]
    if not run or holds_tokens(rows, tokenizer, max(run)):
        return
    tokens = len(token_stream([row["text"] for row in rows], tokenizer))
    source = ("validation_file" if args.validation_file else
              "the part of train_file that pretraining holds out (its last 5 %)" if args.train_file
              else "the embedded corpus's validation split")
    if tokens < min(run):
        flag = ("validation_file" if args.validation_file else "train_file" if args.train_file
                else "eval_lengths")
        raise FlagError(flag, f"{flag}: the validation text ({source}) holds {tokens} tokens, fewer than the "
                              f"shortest of eval_lengths ({min(run)}).")
    raise FlagError("eval_lengths", f"eval_lengths: {max(run)} is longer than the validation text ({source}, "
                                    f"{tokens} tokens); the longest that fits is {tokens}.")


__all__ = [
    "LM_DEFAULTS",
    "QUICK_SETTINGS",
    "QUICK_TASK_SETTINGS",
    "STUDY_FLAG_OF_CONFIG_FIELD",
    "TASK_DEFAULTS",
    "TASK_COPY_WARMUP",
    "TASK_ONLY_FIELDS",
    "TASK_STEPS",
    "LengthGenArguments",
    "check_study_inputs",
]
