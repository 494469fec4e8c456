"""The length-generalisation study: train every variant × seed at length L, evaluate at many lengths.

For each seed (outer loop) and variant (inner loop, so an interrupted study has every variant at the
first seeds): ``training.pretrain`` trains the variant on the embedded corpus (or ``train_file``) in
blocks of L tokens under one shared budget (steps, batch, learning-rate schedule); then
``evaluation.evaluate_at_lengths`` measures it on the validation text at every evaluation length, once per
evaluation mode (the stock Llama: ``sdpa`` and ``entropy_invariant`` on the same weights).

Resumability. ``<output_dir>/runs/<variant>/seed_<s>/`` holds the trained model (``model/``),
``train.json`` (written when training finished) and ``result.json`` (when evaluation finished), each
written atomically and stamped with a fingerprint of the settings that produced it. A rerun skips runs
whose ``result.json`` matches, re-evaluates without retraining when only the evaluation settings changed,
and (with ``checkpointing_steps``) resumes an interrupted training from its last checkpoint. Several
processes may work on one ``output_dir`` at once (``scripts/run_length_study.sh`` with ``WORKERS=2``):
each run folder is claimed with a ``.lock`` file holding the owner's pid (created with ``O_EXCL``; a lock
whose process is gone is taken over), and a process skips runs another live process holds — so rerun the
command once after all workers finished to write the complete outputs. After every
run the study-level files are regenerated: ``results.json``, ``results.csv`` (one row per series × seed ×
length), ``summary.csv`` (mean ± std over seeds), ``results.md`` and the plots ``lengthgen_mlm.png`` /
``lengthgen_clm.png``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..training.cli_utils import (
    FlagError,
    check_number,
    check_output_dir,
    check_seed,
    names_in_message,
    quiet_progress,
)
from .evaluation import evaluate_at_lengths, token_stream
from .results import (
    ROW_FIELDS,
    SUMMARY_FIELDS,
    add_deltas,
    atomic_write_json,
    atomic_write_text,
    markdown_table,
    read_json,
    summarize,
    to_csv,
)
from .variants import (
    CLAMPED_MODE,
    DEFAULT_VARIANTS,
    QUICK_VARIANTS,
    ModelSize,
    Variant,
    config_fields,
    get_variant,
    max_length_of,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped when the meaning of stored results changes, so stale runs are redone."""
QUICK_SETTINGS: dict[str, Any] = {
    "train_length": 16, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_train_steps": 3, "per_device_train_batch_size": 4, "num_warmup_steps": 0, "max_train_samples": 32,
    "eval_mask_repeats": 1, "max_eval_tokens": 512, "finetune_epochs": 1.0, "finetune_max_train_samples": 64,
}
"""What ``--quick`` sets (a smoke test in seconds, not a measurement)."""


@dataclass
class LengthGenArguments:
    """Arguments of ``lengthgen`` (each field is also a ``--flag``)."""

    output_dir: str = field(default="runs/lengthgen", metadata={"help": "Where runs, results and plots go."})
    variants: list[str] | None = field(
        default=None, metadata={"help": f"Variant names (default: all of {list(DEFAULT_VARIANTS)}); append "
                                "'+mixed' to a name for its mixed-length-pretrained copy."})
    train_length: int = field(default=64, metadata={"help": "Training length L (tokens per block)."})
    eval_lengths: list[int] | None = field(
        default=None, metadata={"help": "Evaluation lengths (default: L/4, L/2, L, 2L, 4L, 8L)."})
    max_train_steps: int = field(default=400, metadata={"help": "Optimizer steps of every run."})
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Seeds; several → mean ± std."})
    mixed_length: bool = field(
        default=False, metadata={"help": "Also train a mixed-length copy ('+mixed') of every selected variant."})
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
    attention_key_size: int | None = field(default=None, metadata={"help": "GAU key size s (default hidden/2)."})
    gau_layer_factor: int = field(default=2, metadata={"help": "GAU layers per attention+FFN layer (FLASH: 2)."})
    synthesizer_length_factor: int = field(
        default=2, metadata={"help": "Synthesizer max_position_embeddings = this × L (longer: n/a)."})
    hidden_dropout_prob: float = field(default=0.1, metadata={"help": "Dropout of the family variants."})
    initializer_range: float | None = field(
        default=None, metadata={"help": "Init std of every variant (default: the configs' 0.02)."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training batch size."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak AdamW learning rate (linear decay)."})
    num_warmup_steps: int = field(default=30, metadata={"help": "Warm-up steps."})
    train_file: str | None = field(default=None, metadata={"help": "Local text file (default: embedded corpus)."})
    validation_file: str | None = field(default=None, metadata={"help": "Local validation text file."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N train blocks."})
    eval_batch_size: int = field(default=8, metadata={"help": "Evaluation batch size."})
    eval_mask_repeats: int = field(default=2, metadata={"help": "MLM: maskings of the validation text pooled."})
    eval_seed: int = field(default=1234, metadata={"help": "Seed of the evaluation masks (same for all runs)."})
    max_eval_tokens: int | None = field(default=None, metadata={"help": "Use only the first N validation tokens."})
    checkpointing_steps: int | None = field(
        default=None, metadata={"help": "Checkpoint every N steps so an interrupted run resumes mid-training."})
    finetune: bool = field(
        default=False, metadata={"help": "Afterwards run the finetune-at-other-lengths experiment (GAU variants)."})
    finetune_tasks: list[str] = field(
        default_factory=lambda: ["sequence", "token"],
        metadata={"help": "Finetune task forms: sequence (classification from [CLS]) and/or token (every word "
                  "tagged with its snippet's topic)."})
    finetune_topics: int = field(default=8, metadata={"help": "Finetune task: number of pydoc topics (classes)."})
    finetune_words: int = field(default=12, metadata={"help": "Finetune task: words per snippet."})
    finetune_epochs: float = field(default=3.0, metadata={"help": "Finetune epochs."})
    finetune_learning_rate: float = field(default=1e-3, metadata={"help": "Finetune learning rate."})
    finetune_batch_size: int = field(default=32, metadata={"help": "Finetune batch size."})
    finetune_max_train_samples: int | None = field(default=None, metadata={"help": "Finetune: first N snippets."})
    num_threads: int | None = field(default=None, metadata={"help": "torch.set_num_threads (default: torch's)."})
    quick: bool = field(default=False, metadata={"help": f"Smoke-test sizes: {QUICK_SETTINGS}; default variants "
                                                 f"{list(QUICK_VARIANTS)}, eval lengths L/2…4L."})
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bars."})
    no_plot: bool = field(default=False, metadata={"help": "Skip the PNG plots."})

    def __post_init__(self) -> None:
        if self.quick:
            for key, value in QUICK_SETTINGS.items():
                setattr(self, key, value)
            if self.variants is None:
                self.variants = list(QUICK_VARIANTS)
            if self.eval_lengths is None:
                length = self.train_length
                self.eval_lengths = [length // 2, length, 2 * length, 4 * length]
        names = list(self.variants or DEFAULT_VARIANTS)
        for name in names:
            get_variant(name)
        if self.mixed_length:
            names += [get_variant(n).mixed().name for n in names if not get_variant(n).mixed_length]
        self.variants = list(dict.fromkeys(names))
        _positive("train_length", self.train_length, 4)
        if self.eval_lengths is None:
            length = self.train_length
            self.eval_lengths = [n for n in (length // 4, length // 2, length, 2 * length, 4 * length, 8 * length)
                                 if n >= 2]
        if not self.eval_lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 2
                                        for n in self.eval_lengths):
            raise FlagError("eval_lengths",
                            f"eval_lengths must be a non-empty list of integers >= 2, got {self.eval_lengths}.")
        self.eval_lengths = sorted(set(self.eval_lengths))
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise FlagError("seeds", f"seeds must be a non-empty list of distinct integers, got {self.seeds}.")
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
                                                   f"train_length={self.train_length}, got {self.mixed_length_splits}.")
        if not self.finetune_tasks or any(t not in ("sequence", "token") for t in self.finetune_tasks):
            raise FlagError("finetune_tasks", f"finetune_tasks must be a non-empty list of 'sequence'/'token', "
                                              f"got {self.finetune_tasks}.")
        if self.objective not in ("mlm", "clm"):
            raise FlagError("objective", f"objective must be one of ('mlm', 'clm'), got {self.objective!r}.")
        check_number("hidden_dropout_prob", self.hidden_dropout_prob, 0, 1, open_high=True)
        if self.initializer_range is not None:
            check_number("initializer_range", self.initializer_range, 0, 1, open_low=True, open_high=True)
        for name in ("learning_rate", "finetune_learning_rate", "finetune_epochs"):
            check_number(name, getattr(self, name), 0, open_low=True)
        if self.validation_file is not None and self.train_file is None:
            raise FlagError("validation_file", "validation_file needs a train_file (without either, the embedded "
                                               "corpus is used).")

    @property
    def size(self) -> ModelSize:
        """The shared ``ModelSize``."""
        return ModelSize(self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size,
                         self.attention_key_size, self.gau_layer_factor, self.synthesizer_length_factor,
                         self.hidden_dropout_prob, self.initializer_range)


def _pid_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return True  # being written right now by its creator
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def claim(folder: Path) -> Iterator[bool]:
    """Claim ``folder`` for this process with ``folder/.lock`` (O_EXCL, holding the pid) until the block ends.

    Yields ``False`` (and claims nothing) when another live process holds it; a lock left by a process that
    no longer exists is removed and taken over.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".lock"
    for _ in range(3):
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _pid_alive(path):
                break
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(handle, "w") as stream:
            stream.write(str(os.getpid()))
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
        return
    yield False


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


def check_study_inputs(args: LengthGenArguments) -> None:
    """Check what ``LengthGenArguments`` cannot check without files or configs, before anything is written:
    the output folder, the data files (readable, with at least ``train_length`` tokens) and every
    variant's config at the study's size. ``FlagError`` naming the flag of a bad value."""
    from transformers import LlamaConfig

    from ..training import build_config, load_text_datasets, load_tokenizer
    from ..training.data import holds_tokens

    check_output_dir("output_dir", args.output_dir)
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
            named = names_in_message(str(error), list(STUDY_FLAG_OF_CONFIG_FIELD))
            flag = STUDY_FLAG_OF_CONFIG_FIELD[named[0]] if named else "variants"
            reason = str(error).removeprefix("config_overrides: ")
            raise FlagError(flag, f"{flag}: variant {name!r} at this size: {reason}") from error
    if args.train_file is not None:
        with quiet_progress():
            raw = load_text_datasets(args.train_file, args.validation_file)
        if not holds_tokens(raw["train"], tokenizer, args.train_length):
            raise FlagError("train_file", f"train_file holds fewer than train_length={args.train_length} tokens.")


def fingerprint(data: Any) -> str:
    """Short sha256 of the canonical JSON of ``data``."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def format_overrides(fields: dict[str, Any]) -> str:
    """``{"a": 1, "b": ["x", "y"]}`` → ``"a=1,b=[x,y]"`` (the ``--config_overrides`` syntax)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "none"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(value(x) for x in v) + "]"
        return str(v)

    return ",".join(f"{k}={value(v)}" for k, v in fields.items())


@dataclass
class RunPlan:
    """Everything that identifies one variant × seed run."""

    variant: Variant
    seed: int
    objective: str
    fields: dict[str, Any]
    run_dir: Path
    train_fingerprint: str
    eval_fingerprint: str

    @property
    def model_dir(self) -> Path:
        return self.run_dir / "model"


def plan_run(variant: Variant, seed: int, args: LengthGenArguments) -> RunPlan:
    """The ``RunPlan`` of ``variant`` × ``seed`` (paths and fingerprints)."""
    objective = variant.objective or args.objective
    fields = config_fields(variant, args.size, args.train_length)
    train_key = {
        "version": FORMAT_VERSION, "variant": variant.name, "model_type": variant.model_type, "fields": fields,
        "objective": objective, "mixed": args.mixed_length_splits if variant.mixed_length else None,
        "train_length": args.train_length, "steps": args.max_train_steps, "seed": seed,
        "batch": args.per_device_train_batch_size, "lr": args.learning_rate, "warmup": args.num_warmup_steps,
        "train_file": args.train_file, "max_train_samples": args.max_train_samples,
    }
    train_fp = fingerprint(train_key)
    eval_fp = fingerprint({"train": train_fp, "lengths": args.eval_lengths, "repeats": args.eval_mask_repeats,
                           "eval_seed": args.eval_seed, "max_eval_tokens": args.max_eval_tokens,
                           "validation_file": args.validation_file, "modes": variant.eval_modes})
    run_dir = Path(args.output_dir) / "runs" / variant.name / f"seed_{seed}"
    return RunPlan(variant, seed, objective, fields, run_dir, train_fp, eval_fp)


def _pretrain_arguments(plan: RunPlan, args: LengthGenArguments, tokenizer: Any) -> Any:
    from ..training import PretrainArguments

    common: dict[str, Any] = {
        "output_dir": str(plan.model_dir), "objective": plan.objective, "max_seq_length": args.train_length,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "per_device_eval_batch_size": args.eval_batch_size, "learning_rate": args.learning_rate,
        "num_warmup_steps": args.num_warmup_steps, "max_train_steps": args.max_train_steps, "seed": plan.seed,
        "logging_steps": max(1, args.max_train_steps // 20), "train_file": args.train_file,
        "validation_file": args.validation_file, "max_train_samples": args.max_train_samples,
        "max_eval_samples": 64, "disable_tqdm": args.disable_tqdm,
        "mixed_length_splits": list(args.mixed_length_splits) if plan.variant.mixed_length else None,
        "checkpointing_steps": str(args.checkpointing_steps) if args.checkpointing_steps else None,
    }
    if args.checkpointing_steps and any((plan.model_dir / "checkpoints").glob("*/training_state.json")):
        common["resume_from_checkpoint"] = "latest"
    if plan.variant.model_type == "llama":
        from transformers import LlamaConfig

        fields = dict(plan.fields)
        base_length = fields.pop("base_length")
        config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, **fields)
        config.base_length = base_length  # read by attn_implementation="entropy_invariant"
        config_dir = plan.run_dir / "llama_config"
        config.save_pretrained(config_dir)
        return PretrainArguments(config_name=str(config_dir), **common)
    return PretrainArguments(model_type=plan.variant.model_type, config_overrides=format_overrides(plan.fields),
                             **common)


def train_run(plan: RunPlan, args: LengthGenArguments, tokenizer: Any) -> dict[str, Any]:
    """Train (or resume) one run with ``training.pretrain``; returns and stores ``train.json``."""
    from ..training import pretrain

    started = time.perf_counter()
    result = pretrain(_pretrain_arguments(plan, args, tokenizer))
    seconds = time.perf_counter() - started
    log = [json.loads(line) for line in Path(result.log_file).read_text().splitlines() if line.strip()]
    info = {
        "fingerprint": plan.train_fingerprint, "steps": result.completed_steps, "seconds": seconds,
        "final_train_loss": log[-1]["loss"] if log else None,
        "eval_at_train_length": result.metrics, "loss_curve": [(row["step"], row["loss"]) for row in log],
    }
    atomic_write_json(plan.run_dir / "train.json", info)
    shutil.rmtree(plan.model_dir / "checkpoints", ignore_errors=True)
    return info


def load_for_eval(plan: RunPlan, mode: str) -> Any:
    """The trained model of ``plan`` for evaluation mode ``mode``: ``"default"``, an attention implementation
    (``base_length`` = L), or ``CLAMPED_MODE`` (``entropy_invariant`` with ``entropy_min_length`` = L)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForCausalLM if plan.objective == "clm" else AutoModelForMaskedLM
    if mode == "default":
        return auto.from_pretrained(plan.model_dir).eval()
    config = AutoConfig.from_pretrained(plan.model_dir)
    config.base_length = plan.fields.get("base_length", config.max_position_embeddings)
    implementation = mode
    if mode == CLAMPED_MODE:  # factor max(1, log n / log L): rows within the training length unchanged
        implementation, config.entropy_min_length = "entropy_invariant", config.base_length
    return auto.from_pretrained(plan.model_dir, config=config, attn_implementation=implementation).eval()


def parameter_counts(model: Any) -> dict[str, int]:
    """``{"total", "non_embedding"}``: all parameters, and without the token embedding (tied LM head)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - embedding}


def evaluate_run(plan: RunPlan, args: LengthGenArguments, tokenizer: Any, stream: list[int], train: dict[str, Any],
                 progress: Any = None) -> dict[str, Any]:
    """Evaluate one trained run in every mode at every length; returns and stores ``result.json``."""
    rows, params = [], None
    for mode in plan.variant.eval_modes:
        model = load_for_eval(plan, mode)
        params = params or parameter_counts(model)
        points = evaluate_at_lengths(
            model, stream, args.eval_lengths, objective=plan.objective, tokenizer=tokenizer,
            train_length=args.train_length, max_length=max_length_of(plan.variant, plan.fields),
            mask_repeats=args.eval_mask_repeats, seed=args.eval_seed, batch_size=args.eval_batch_size,
            max_tokens=args.max_eval_tokens, progress=progress,
        )
        for point in points:
            rows.append({"series": plan.variant.series(mode), "variant": plan.variant.name,
                         "model_type": plan.variant.model_type, "mode": mode, "objective": plan.objective,
                         "seed": plan.seed, **point})
    result = {
        "fingerprint": plan.eval_fingerprint, "variant": plan.variant.name, "seed": plan.seed,
        "model_type": plan.variant.model_type, "description": plan.variant.description,
        "objective": plan.objective, "config_fields": plan.fields, "mixed_length": plan.variant.mixed_length,
        "parameters": params, "train": {k: v for k, v in train.items() if k != "loss_curve"},
        "loss_curve": train.get("loss_curve"), "rows": rows,
    }
    atomic_write_json(plan.run_dir / "result.json", result)
    return result


def machine_info() -> dict[str, Any]:
    """Machine and library versions, recorded with the results."""
    import torch
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available()}
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def write_outputs(args: LengthGenArguments, results: list[dict[str, Any]], machine: dict[str, Any],
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Regenerate ``results.json``, ``results.csv``, ``summary.csv``, ``results.md`` and the plots."""
    out = Path(args.output_dir)
    rows = add_deltas([row for result in results for row in result["rows"]], args.train_length)
    summary = summarize(rows)
    report = {"args": asdict(args), "machine": machine, "variants": variant_table(results),
              "summary": summary, "runs": results, **(extra or {})}
    atomic_write_json(out / "results.json", report)
    atomic_write_text(out / "results.csv", to_csv(rows, ROW_FIELDS))
    atomic_write_text(out / "summary.csv", to_csv(summary, SUMMARY_FIELDS))
    atomic_write_text(out / "results.md", results_markdown(args, report))
    if not args.no_plot:
        from .plotting import plot_summary

        for objective in ("mlm", "clm"):
            plot_summary(summary, out / f"lengthgen_{objective}.png", objective=objective,
                         train_length=args.train_length,
                         title=f"trained at L = {args.train_length}, {args.max_train_steps} steps, "
                               f"seeds {sorted({r['seed'] for r in results})}")
    return report


def variant_table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant: parameters, training time and final training loss (mean over seeds)."""
    table: dict[str, dict[str, Any]] = {}
    for result in results:
        entry = table.setdefault(result["variant"], {
            "variant": result["variant"], "model_type": result["model_type"], "description": result["description"],
            "objective": result["objective"], "parameters": result["parameters"],
            "config_fields": result["config_fields"], "seeds": [], "train_seconds": [], "final_train_loss": []})
        entry["seeds"].append(result["seed"])
        entry["train_seconds"].append(result["train"]["seconds"])
        entry["final_train_loss"].append(result["train"]["final_train_loss"])
    return list(table.values())


def results_markdown(args: LengthGenArguments, report: dict[str, Any]) -> str:
    """The study's tables as markdown (variants, then one table per metric)."""
    lengths, summary = args.eval_lengths, report["summary"]
    lines = [f"# Length generalisation: trained at L = {args.train_length}", "",
             (f"{args.max_train_steps} steps × batch {args.per_device_train_batch_size}, lr {args.learning_rate}, "
             f"seeds {args.seeds}; cells are mean ± std over seeds."), "",
             "| variant | family | objective | params (non-embedding) | train s | final train loss |",
             "|---|---|---|---|---|---|"]
    for entry in report["variants"]:
        losses = [x for x in entry["final_train_loss"] if x is not None]
        secs = entry["train_seconds"]
        params = entry["parameters"] or {}
        lines.append(f"| `{entry['variant']}` | {entry['model_type']} | {entry['objective']} | "
                     f"{params.get('total', 0):,} ({params.get('non_embedding', 0):,}) | "
                     f"{sum(secs) / len(secs):.0f} | {sum(losses) / max(len(losses), 1):.3f} |")
    for objective, metrics in (("mlm", ("loss", "loss_delta", "accuracy")),
                               ("clm", ("loss", "loss_delta", "perplexity", "perplexity_beyond_train", "accuracy"))):
        names = list(dict.fromkeys(r["series"] for r in summary if r["objective"] == objective))
        if not names:
            continue
        for metric in metrics:
            heading = (f"{metric[:-6]} minus the same run's {metric[:-6]} at L (paired per seed)"
                       if metric.endswith("_delta") else metric)
            lines += ["", f"## {objective.upper()} {heading} by evaluation length", "",
                      markdown_table(summary, metric, lengths, names, 2 if "perplexity" in metric else 3,
                                     args.train_length)]
        counts = {int(r["length"]): (r["blocks"], r["tokens"]) for r in summary
                  if r["objective"] == objective and r["status"] == "ok"}
        lines += ["", "Blocks / target tokens per point (per seed): " + ", ".join(
            f"{n}: {b} / {t}" for n, (b, t) in sorted(counts.items()))]
    if report.get("finetune"):
        from .finetune_lengths import finetune_markdown

        lines += ["", finetune_markdown(report["finetune"])]
    return "\n".join(lines) + "\n"


def run_study(args: LengthGenArguments) -> dict[str, Any]:
    """Run (or resume) the study described by ``args``; returns the report written to ``results.json``."""
    import torch
    from tqdm.auto import tqdm

    from ..training import corpus_splits, load_tokenizer

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    tokenizer = load_tokenizer(None)
    if args.validation_file:
        texts = [line for line in Path(args.validation_file).read_text().splitlines() if line.strip()]
    else:
        texts = corpus_splits()["validation"]
    stream = token_stream(texts, tokenizer)
    variants = [get_variant(name) for name in args.variants]
    plans = [plan_run(v, seed, args) for seed in args.seeds for v in variants]
    results: list[dict[str, Any]] = []
    total_points = sum(len(p.variant.eval_modes) for p in plans) * len(args.eval_lengths)
    bar = tqdm(total=total_points, desc="lengthgen eval points", disable=args.disable_tqdm)
    skipped = elsewhere = 0
    for index, plan in enumerate(plans, 1):
        label = f"[{index}/{len(plans)}] {plan.variant.name} seed {plan.seed}"
        points = len(plan.variant.eval_modes) * len(args.eval_lengths)
        with claim(plan.run_dir) as mine:
            if not mine:
                logger.info("%s: held by another process, skipped", label)
                elsewhere += 1
                bar.update(points)
                continue
            done = read_json(plan.run_dir / "result.json")
            if done and done.get("fingerprint") == plan.eval_fingerprint:
                logger.info("%s: finished earlier, skipped", label)
                results.append(done)
                skipped += 1
                bar.update(points)
                continue
            train = read_json(plan.run_dir / "train.json")
            if not (train and train.get("fingerprint") == plan.train_fingerprint
                    and (plan.model_dir / "model.safetensors").exists()):
                logger.info("%s: training", label)
                train = train_run(plan, args, tokenizer)
            else:
                logger.info("%s: trained earlier, evaluating only", label)
            results.append(evaluate_run(plan, args, tokenizer, stream, train, progress=bar))
        write_outputs(args, results, machine)
    bar.close()
    extra: dict[str, Any] = {"skipped_runs": skipped, "runs_held_elsewhere": elsewhere}
    if elsewhere:
        logger.warning("%d run(s) were held by other processes: rerun when they finish for complete outputs",
                       elsewhere)
    if args.finetune:
        from .finetune_lengths import run_finetune_experiment

        extra["finetune"] = run_finetune_experiment(args)
    return write_outputs(args, results, machine, extra)


__all__ = [
    "QUICK_SETTINGS",
    "LengthGenArguments",
    "RunPlan",
    "check_study_inputs",
    "claim",
    "evaluate_run",
    "fingerprint",
    "format_overrides",
    "load_for_eval",
    "machine_info",
    "parameter_counts",
    "plan_run",
    "run_study",
    "train_run",
    "write_outputs",
]
