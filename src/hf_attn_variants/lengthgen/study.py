"""The length-generalisation study: train every variant × seed at length L, evaluate at many lengths.

For each seed (outer loop) and variant (inner loop, so an interrupted study has every variant at the
first seeds): ``training.pretrain`` trains the variant on the embedded corpus (or ``train_file``) in
blocks of L tokens under one shared budget (steps, batch, learning-rate schedule); then
``evaluation.evaluate_at_lengths`` measures it on the validation text (``evaluation.validation_datasets``:
the corpus's held-out split, ``validation_file``, or the part of ``train_file`` pretraining holds out) at
every evaluation length, once per
evaluation mode (the stock Llama: ``sdpa``, ``entropy_invariant_all`` and ``entropy_invariant_beyond_L``
on the same weights, see ``variants.LLAMA_EVAL_MODES``).

Resumability. ``<output_dir>/runs/<variant>/seed_<s>/`` holds the trained model (``model/``),
``train.json`` (written when training finished) and ``result.json`` (when evaluation finished), each
written atomically and stamped with a fingerprint of the settings that produced it (the full resolved
config included, so a changed library default makes a stored run stale, and the sha256 of the data and the
tokenizer, so an edited file does too). A rerun skips runs whose ``result.json`` matches, re-evaluates
without retraining when only the evaluation settings changed (``cli.EVALUATION_ONLY``), and (with
``checkpointing_steps``) resumes an interrupted training from its last checkpoint when that was written
under the same training fingerprint (``CHECKPOINT_STAMP``). A stop signal outside training (during an
evaluation, or the finetune phase) stops the study before its next run (``runfolders.StudyStopped``).
Several processes may work on one ``output_dir`` at once (``scripts/run_length_study.sh`` with ``WORKERS=2``):
each run folder is claimed with a non-blocking file lock (``runfolders.claim``; released by the OS if its
process dies), and a process skips runs another one holds — so rerun the command once after all workers
finished to write the complete outputs. After every run the study-level files are regenerated:
``results.json``, ``results.csv`` (one row per series × seed × length), ``summary.csv`` (mean ± std over
seeds), ``results.md`` and the plots ``lengthgen_mlm.png`` / ``lengthgen_clm.png``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .arguments import QUICK_SETTINGS, LengthGenArguments, check_study_inputs
from .evaluation import evaluate_at_lengths, token_stream, validation_datasets
from .finetune_lengths import finetune_markdown, run_finetune_experiment
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
from ..training.preemption import TrainingDiverged
from .runfolders import claim, fingerprint, stop_between_runs
from .variants import EvalMode, Variant, config_fields, get_variant, max_length_of, resolved_config

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3
"""Bumped when the meaning of stored results changes, so stale runs are redone (2: the stock Llama's eval
modes are ``EvalMode``s with an explicit ``entropy_invariant_scope``; the resolved config is
fingerprinted; 3: the sha256 of the data files' contents, of the embedded corpus and of the tokenizer are
fingerprinted, and a ``train_file`` study evaluates on the part of it that pretraining holds out)."""
CHECKPOINT_STAMP = "checkpoints.json"
"""Beside a run's ``model/`` folder: the training fingerprint its ``model/checkpoints/`` were written with (a
checkpoint is resumed only under the same fingerprint)."""


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


@functools.lru_cache(maxsize=16)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """``training.checkpoints.file_digest`` of the file, cached per path, size and modification time (a study
    plans many runs)."""
    from ..training.checkpoints import file_digest

    return file_digest(Path(path))


def _one_file_sha256(path: str | Path) -> str:
    """sha256 of one file's bytes, read again only when its size or modification time changed."""
    status = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), status.st_size, status.st_mtime_ns)


def content_sha256(value: str | None, flag: str = "train_file") -> str | None:
    """sha256 of the contents of the local data file(s) ``value`` names (``None`` for none): one path, a glob
    or a comma-separated list, as ``--train_file`` takes them (``training.data.expand_data_files``; the
    digests of several files are hashed in their order). A data file is fingerprinted by what it holds, not
    by its name, so an edited file makes the runs that read it stale."""
    if value is None:
        return None
    from ..training.data import expand_data_files

    digests = [_one_file_sha256(path) for path in expand_data_files(value, flag)]
    return digests[0] if len(digests) == 1 else hashlib.sha256(" ".join(digests).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def embedded_digests() -> dict[str, str]:
    """sha256 of the embedded corpus (both splits: the split is a function of each paragraph) and of the
    embedded tokenizer's ``tokenizer.json``; they differ between Python versions, whose docs differ."""
    from ..training.corpus import corpus_fingerprint, embedded_tokenizer_path

    return {"corpus": corpus_fingerprint(),
            "tokenizer": _one_file_sha256(embedded_tokenizer_path() / "tokenizer.json")}


def data_keys(args: LengthGenArguments) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data parts of the training and evaluation fingerprints: the contents (sha256) of what the runs
    train and evaluate on and of the tokenizer, and where the evaluation text comes from."""
    embedded = embedded_digests()
    train_data = content_sha256(args.train_file) if args.train_file is not None else embedded["corpus"]
    train = {"train_data": train_data, "tokenizer": embedded["tokenizer"]}
    if args.validation_file:
        evaluation = {"eval_text": "validation_file",
                      "validation_data": content_sha256(args.validation_file, "validation_file")}
    else:  # the held-out part of the training data, whose contents are in the training fingerprint
        evaluation = {"eval_text": "train_file held out" if args.train_file else "corpus validation split"}
    return train, evaluation


def plan_run(variant: Variant, seed: int, args: LengthGenArguments) -> RunPlan:
    """The ``RunPlan`` of ``variant`` × ``seed`` (paths and fingerprints)."""
    train_data, eval_data = data_keys(args)
    objective = variant.objective or args.objective
    fields = config_fields(variant, args.size, args.train_length)
    train_key = {
        "version": FORMAT_VERSION, "variant": variant.name, "model_type": variant.model_type,
        "fields": fields,
        "config": resolved_config(variant, fields),
        "objective": objective, "mixed": args.mixed_length_splits if variant.mixed_length else None,
        "train_length": args.train_length, "steps": args.max_train_steps, "seed": seed,
        "batch": args.per_device_train_batch_size, "lr": args.learning_rate, "warmup": args.num_warmup_steps,
        "train_file": args.train_file, "max_train_samples": args.max_train_samples, **train_data,
    }
    train_fp = fingerprint(train_key)
    eval_fp = fingerprint({"train": train_fp, "lengths": args.eval_lengths, "repeats": args.eval_mask_repeats,
                           "eval_seed": args.eval_seed, "max_eval_tokens": args.max_eval_tokens,
                           "validation_file": args.validation_file, **eval_data,
                           "modes": [asdict(mode) for mode in variant.eval_modes]})
    run_dir = Path(args.output_dir) / "runs" / variant.name / f"seed_{seed}"
    return RunPlan(variant, seed, objective, fields, run_dir, train_fp, eval_fp)


def _pretrain_arguments(plan: RunPlan, args: LengthGenArguments, tokenizer: Any) -> Any:
    """The ``PretrainArguments`` of ``plan``: the family variants pass their config fields as a dict of
    overrides; the stock Llama's config is written to ``llama_config/`` and passed as ``config_name``."""
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
    common.update(_resume_or_restart(plan))
    if plan.variant.model_type == "llama":
        from transformers import LlamaConfig

        # base_length (= L) is kept as an extra attribute: attn_implementation="entropy_invariant" reads it
        config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                             **plan.fields)
        config_dir = plan.run_dir / "llama_config"
        config.save_pretrained(config_dir)
        return PretrainArguments(config_name=str(config_dir), **common)
    return PretrainArguments(model_type=plan.variant.model_type, config_overrides=dict(plan.fields), **common)


def _resume_or_restart(plan: RunPlan) -> dict[str, Any]:
    """How ``pretrain`` starts the run: ``resume_from_checkpoint="latest"`` when ``model/checkpoints/`` holds
    one (periodic, or written on SIGTERM / Ctrl-C) written under this run's training fingerprint
    (``CHECKPOINT_STAMP``), else ``overwrite_output_dir`` (the study trains a run only when its stored model
    is missing or stale). Checkpoints of other settings (a changed flag, or library default such as
    ``gau_init``) are deleted with one warning: resuming them would train a mix of the two settings under
    the new fingerprint. The stamp is written before training, so its checkpoints carry it; it also keeps
    the training seconds of the segments that ended in a checkpoint (``train_run``)."""
    checkpoints = plan.model_dir / "checkpoints"
    stamp = plan.run_dir / CHECKPOINT_STAMP
    found = any(checkpoints.glob("*/training_state.json"))
    written_under = (read_json(stamp) or {}).get("fingerprint")
    if found and written_under == plan.train_fingerprint:
        return {"resume_from_checkpoint": "latest"}
    atomic_write_json(stamp, {"fingerprint": plan.train_fingerprint, "seconds": 0.0})
    if found:
        logger.warning("%s seed %d: its checkpoints were written with other training settings (fingerprint "
                       "%s, now %s): deleted, training from the start", plan.variant.name, plan.seed,
                       written_under or "unknown", plan.train_fingerprint)
        shutil.rmtree(checkpoints)
    return {"overwrite_output_dir": True}


def train_run(plan: RunPlan, args: LengthGenArguments, tokenizer: Any, stop: Any = None) -> dict[str, Any]:
    """Train (or resume) one run with ``training.pretrain`` (``stop``: the caller's ``StopSignals``, else
    pretrain's own); returns and stores ``train.json``. Its ``seconds`` cover every segment of a resumed run:
    a segment stopped by a signal adds its time to the checkpoint stamp before the stop goes on."""
    from ..training import pretrain
    from ..training.preemption import TrainingPreempted

    pretrain_args = _pretrain_arguments(plan, args, tokenizer)
    stamp_file = plan.run_dir / CHECKPOINT_STAMP
    stamp = read_json(stamp_file) or {"fingerprint": plan.train_fingerprint}
    started = time.perf_counter()
    try:
        result = pretrain(pretrain_args, stop)
    except TrainingPreempted:
        stamp["seconds"] = stamp.get("seconds", 0.0) + time.perf_counter() - started
        atomic_write_json(stamp_file, stamp)
        raise
    seconds = stamp.get("seconds", 0.0) + time.perf_counter() - started
    log = [json.loads(line) for line in Path(result.log_file).read_text().splitlines() if line.strip()]
    info = {
        "fingerprint": plan.train_fingerprint, "steps": result.completed_steps, "seconds": seconds,
        "final_train_loss": log[-1]["loss"] if log else None,
        "eval_at_train_length": result.metrics, "loss_curve": [(row["step"], row["loss"]) for row in log],
    }
    atomic_write_json(plan.run_dir / "train.json", info)
    shutil.rmtree(plan.model_dir / "checkpoints", ignore_errors=True)
    stamp_file.unlink(missing_ok=True)
    return info


def load_for_eval(plan: RunPlan, mode: EvalMode) -> Any:
    """The trained model of ``plan`` loaded for evaluation mode ``mode``: as saved (no attention
    implementation given), or with ``mode.attn_implementation`` and ``mode.config_updates`` on a config whose
    ``base_length`` is the training length (read by ``attn_implementation="entropy_invariant"``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForCausalLM if plan.objective == "clm" else AutoModelForMaskedLM
    if mode.attn_implementation is None and not mode.config_updates:
        return auto.from_pretrained(plan.model_dir).eval()
    config = AutoConfig.from_pretrained(plan.model_dir)
    config.base_length = plan.fields.get("base_length", config.max_position_embeddings)
    for key, value in mode.config_updates.items():
        setattr(config, key, value)
    kwargs = {"attn_implementation": mode.attn_implementation} if mode.attn_implementation else {}
    return auto.from_pretrained(plan.model_dir, config=config, **kwargs).eval()


def parameter_counts(model: Any) -> dict[str, int]:
    """``{"total", "non_embedding"}``: ``model.num_parameters`` with and without the embedding matrices
    (``exclude_embeddings=True``: every ``nn.Embedding``; a tied LM head is counted once, with them)."""
    return {"total": model.num_parameters(), "non_embedding": model.num_parameters(exclude_embeddings=True)}


def evaluate_run(plan: RunPlan, args: LengthGenArguments, tokenizer: Any, stream: list[int],
                 train: dict[str, Any],
                 progress: Any = None) -> dict[str, Any]:
    """Evaluate one trained run in every mode at every length; returns and stores ``result.json`` (with
    ``diverged``, the lengths without a finite loss, when there are any: ``_mark_divergence``)."""
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
                         "model_type": plan.variant.model_type, "mode": mode.name,
                         "objective": plan.objective,
                         "seed": plan.seed, **point})
    result = {
        "fingerprint": plan.eval_fingerprint, "variant": plan.variant.name, "seed": plan.seed,
        "model_type": plan.variant.model_type, "description": plan.variant.description,
        "objective": plan.objective, "config_fields": plan.fields, "mixed_length": plan.variant.mixed_length,
        "parameters": params, "train": {k: v for k, v in train.items() if k != "loss_curve"},
        "loss_curve": train.get("loss_curve"), "rows": rows,
    }
    _mark_divergence(result, f"{plan.variant.name} seed {plan.seed}")
    atomic_write_json(plan.run_dir / "result.json", result)
    return result


def machine_info() -> dict[str, Any]:
    """Machine and library versions, recorded with the results, and the environment variables that change
    numerics (``records.numerics_environment``)."""
    import torch
    import transformers

    from ..records import numerics_environment

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "environment": numerics_environment()}
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
            "variant": result["variant"], "model_type": result["model_type"],
            "description": result["description"],
            "objective": result["objective"], "parameters": result["parameters"],
            "config_fields": result["config_fields"], "seeds": [], "train_seconds": [],
            "final_train_loss": []})
        entry["seeds"].append(result["seed"])
        entry["train_seconds"].append(result["train"]["seconds"])
        entry["final_train_loss"].append(result["train"]["final_train_loss"])
    return list(table.values())


def results_markdown(args: LengthGenArguments, report: dict[str, Any]) -> str:
    """The study's tables as markdown (variants, then one table per metric)."""
    lengths, summary = args.eval_lengths, report["summary"]
    lines = [f"# Length generalisation: trained at L = {args.train_length}", "",
             (f"{args.max_train_steps} steps × batch {args.per_device_train_batch_size}, lr "
              f"{args.learning_rate}, "
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
    diverged = [f"`{r['variant']}` seed {r['seed']} ({divergence(r)})" for r in report["runs"]
                if divergence(r)]
    if diverged:
        lines += ["", "**Diverged** (a training or evaluation loss not finite; such cells are left out of "
                      "the means, or read – or the status): " + ", ".join(diverged) + "."]
    for objective, metrics in (("mlm", ("loss", "loss_delta", "accuracy")),
                               ("clm",
                                ("loss", "loss_delta", "perplexity", "perplexity_beyond_train", "accuracy"))):
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
        lines += ["", finetune_markdown(report["finetune"])]
    return "\n".join(lines) + "\n"


def diverged_lengths(result: dict[str, Any]) -> list[int]:
    """The evaluation lengths at which a run that evaluated (status ``ok``) has no finite loss: a diverged run
    (``--learning_rate`` far too high), whose cells would otherwise only read "–"."""
    return sorted({int(row["length"]) for row in result["rows"] if row.get("status") == "ok"
                   and not (isinstance(row.get("loss"), (int, float)) and math.isfinite(row["loss"]))})


def divergence(result: dict[str, Any]) -> str | None:
    """How the run diverged, for ``results.md`` and the command's last lines: ``"in training"`` (its
    training loss became NaN or infinite: ``_diverged_in_training``), ``"at lengths [...]"`` (its evaluation
    loss is not finite there), or ``None``."""
    if result.get("diverged") == "training":
        return "in training"
    lengths = diverged_lengths(result)
    return f"at lengths {lengths}" if lengths else None


def _diverged_in_training(plan: RunPlan, args: LengthGenArguments, error: TrainingDiverged, seconds: float,
                          label: str) -> dict[str, Any]:
    """The stored result of a run whose training diverged (``TrainingDiverged``: pretrain saved no model):
    every point gets the status ``diverged in training (…)``, which the tables print in its cells, and the
    study goes on with the other runs. A rerun with the same settings would diverge again, so it is kept
    (fingerprinted) like a finished run."""
    logger.warning("%s: diverged in training: its training loss at step %d is %s, so it saved no model; "
                   "the study keeps it as diverged and goes on (lower --learning_rate or raise "
                   "--num_warmup_steps to train it again)", label, error.step, error.loss)
    status = f"diverged in training (loss {error.loss} at step {error.step})"
    rows = [{"series": plan.variant.series(mode), "variant": plan.variant.name,
             "model_type": plan.variant.model_type, "mode": mode.name, "objective": plan.objective,
             "seed": plan.seed, "length": n, "ratio": n / args.train_length, "status": status, "tokens": 0,
             "blocks": 0} for mode in plan.variant.eval_modes for n in args.eval_lengths]
    result = {
        "fingerprint": plan.eval_fingerprint, "variant": plan.variant.name, "seed": plan.seed,
        "model_type": plan.variant.model_type, "description": plan.variant.description,
        "objective": plan.objective, "config_fields": plan.fields, "mixed_length": plan.variant.mixed_length,
        "parameters": None, "train": {"fingerprint": plan.train_fingerprint, "seconds": seconds,
                                      "final_train_loss": None, "diverged": str(error)},
        "loss_curve": None, "rows": rows, "diverged": "training",
    }
    atomic_write_json(plan.run_dir / "result.json", result)
    return result


def _mark_divergence(result: dict[str, Any], label: str) -> None:
    """Warn, naming the variant and seed, when the run's evaluation loss is not finite, and record it in the
    result (``diverged``: the lengths), which ``results.md`` lists."""
    lengths = diverged_lengths(result)
    if lengths:
        result["diverged"] = lengths
        logger.warning("%s: diverged: its evaluation loss is not finite at lengths %s (lower --learning_rate "
                       "or raise --num_warmup_steps)", label, lengths)


def _run_one(plan: RunPlan, label: str, args: LengthGenArguments, tokenizer: Any, stream: list[int],
             stop: Any, bar: Any) -> tuple[str, dict[str, Any] | None]:
    """One claimed run: ``("elsewhere", None)`` when another process holds it, ``("skipped", result)`` when
    it finished earlier with these settings, else ``("done", result)`` after training (unless a model of the
    same training fingerprint is stored: re-evaluated only) and evaluation."""
    points = len(plan.variant.eval_modes) * len(args.eval_lengths)
    with claim(plan.run_dir) as mine:
        if not mine:
            logger.info("%s: held by another process, skipped", label)
            bar.update(points)
            return "elsewhere", None
        done = read_json(plan.run_dir / "result.json")
        if done and done.get("fingerprint") == plan.eval_fingerprint:
            logger.info("%s: finished earlier, skipped", label)
            bar.update(points)
            return "skipped", done
        train = read_json(plan.run_dir / "train.json")
        if not (train and train.get("fingerprint") == plan.train_fingerprint
                and (plan.model_dir / "model.safetensors").exists()):
            logger.info("%s: training", label)
            started = time.perf_counter()
            try:
                train = train_run(plan, args, tokenizer, stop)
            except TrainingDiverged as error:
                return "done", _diverged_in_training(plan, args, error, time.perf_counter() - started, label)
        else:
            logger.info("%s: trained earlier, evaluating only", label)
        return "done", evaluate_run(plan, args, tokenizer, stream, train, progress=bar)


def run_study(args: LengthGenArguments, stop: Any = None) -> dict[str, Any]:
    """Run (or resume) the study described by ``args``; returns the report written to ``results.json``.
    ``stop``: the command line's ``StopSignals`` (Ctrl-C included), which every run's training checks, and
    which is checked between runs and before the finetune phase (``StudyStopped``). The evaluation text is
    ``evaluation.validation_datasets``' (the user's data whenever a ``train_file`` is given)."""
    import torch
    from tqdm.auto import tqdm

    from ..training import load_tokenizer

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    tokenizer = load_tokenizer(None)
    texts = validation_datasets(args.train_file, args.validation_file)["validation"]["text"]
    stream = token_stream(texts, tokenizer)
    variants = [get_variant(name) for name in args.variants]
    plans = [plan_run(v, seed, args) for seed in args.seeds for v in variants]
    results: list[dict[str, Any]] = []
    total_points = sum(len(p.variant.eval_modes) for p in plans) * len(args.eval_lengths)
    bar = tqdm(total=total_points, desc="lengthgen eval points", disable=args.disable_tqdm)
    counts = {"skipped": 0, "elsewhere": 0, "done": 0}
    for index, plan in enumerate(plans, 1):
        label = f"[{index}/{len(plans)}] {plan.variant.name} seed {plan.seed}"
        outcome, result = _run_one(plan, label, args, tokenizer, stream, stop, bar)
        counts[outcome] += 1
        if result is not None:
            results.append(result)
        if outcome == "done":
            write_outputs(args, results, machine)
        stop_between_runs(stop, f"after run {label} (its evaluation finished)")
    bar.close()
    extra: dict[str, Any] = {"skipped_runs": counts["skipped"], "runs_held_elsewhere": counts["elsewhere"],
                             "diverged_runs": [f"{r['variant']} seed {r['seed']} ({divergence(r)})"
                                               for r in results if divergence(r)]}
    if counts["elsewhere"]:
        logger.warning("%d run(s) were held by other processes: rerun when they finish for complete outputs",
                       counts["elsewhere"])
    if args.finetune:
        extra["finetune"] = run_finetune_experiment(args, stop)
    return write_outputs(args, results, machine, extra)


__all__ = [
    "FORMAT_VERSION",
    "QUICK_SETTINGS",
    "LengthGenArguments",
    "RunPlan",
    "check_study_inputs",
    "evaluate_run",
    "load_for_eval",
    "machine_info",
    "parameter_counts",
    "plan_run",
    "run_study",
    "train_run",
    "write_outputs",
]
