"""The length-generalisation study: train every variant × seed at length L, evaluate at many lengths.

For each seed (outer loop) and variant (inner loop, so an interrupted study has every variant at the
first seeds): ``training.pretrain`` trains the variant on the embedded corpus (or ``train_file``) in
blocks of L tokens under one shared budget (steps, batch, learning-rate schedule); then
``evaluation.evaluate_at_lengths`` measures it on the validation text at every evaluation length, once per
evaluation mode (the stock Llama: ``sdpa``, ``entropy_invariant_all`` and ``entropy_invariant_beyond_L``
on the same weights, see ``variants.LLAMA_EVAL_MODES``).

Resumability. ``<output_dir>/runs/<variant>/seed_<s>/`` holds the trained model (``model/``),
``train.json`` (written when training finished) and ``result.json`` (when evaluation finished), each
written atomically and stamped with a fingerprint of the settings that produced it (the full resolved
config included, so a changed library default makes a stored run stale). A rerun skips runs whose
``result.json`` matches, re-evaluates without retraining when only the evaluation settings changed, and
(with ``checkpointing_steps``) resumes an interrupted training from its last checkpoint. Several processes
may work on one ``output_dir`` at once (``scripts/run_length_study.sh`` with ``WORKERS=2``): each run folder
is claimed with a non-blocking file lock (``runfolders.claim``; released by the OS if its process dies), and
a process skips runs another one holds — so rerun the command once after all workers finished to write the
complete outputs. After every run the study-level files are regenerated: ``results.json``,
``results.csv`` (one row per series × seed × length), ``summary.csv`` (mean ± std over seeds),
``results.md`` and the plots ``lengthgen_mlm.png`` / ``lengthgen_clm.png``.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .arguments import QUICK_SETTINGS, LengthGenArguments, check_study_inputs
from .evaluation import evaluate_at_lengths, token_stream
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
from .runfolders import claim, fingerprint
from .variants import EvalMode, Variant, config_fields, get_variant, max_length_of, resolved_config

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Bumped when the meaning of stored results changes, so stale runs are redone (2: the stock Llama's eval
modes are ``EvalMode``s with an explicit ``entropy_invariant_scope``; the resolved config is
fingerprinted)."""


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
        "version": FORMAT_VERSION, "variant": variant.name, "model_type": variant.model_type,
        "fields": fields,
        "config": resolved_config(variant, fields),
        "objective": objective, "mixed": args.mixed_length_splits if variant.mixed_length else None,
        "train_length": args.train_length, "steps": args.max_train_steps, "seed": seed,
        "batch": args.per_device_train_batch_size, "lr": args.learning_rate, "warmup": args.num_warmup_steps,
        "train_file": args.train_file, "max_train_samples": args.max_train_samples,
    }
    train_fp = fingerprint(train_key)
    eval_fp = fingerprint({"train": train_fp, "lengths": args.eval_lengths, "repeats": args.eval_mask_repeats,
                           "eval_seed": args.eval_seed, "max_eval_tokens": args.max_eval_tokens,
                           "validation_file": args.validation_file,
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
    if any((plan.model_dir / "checkpoints").glob("*/training_state.json")):  # periodic, or written on SIGTERM
        common["resume_from_checkpoint"] = "latest"
    else:  # the study trains a run only when its stored model is missing or stale (fingerprint): replace it
        common["overwrite_output_dir"] = True
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


def train_run(plan: RunPlan, args: LengthGenArguments, tokenizer: Any, stop: Any = None) -> dict[str, Any]:
    """Train (or resume) one run with ``training.pretrain`` (``stop``: the caller's ``StopSignals``, else
    pretrain's own); returns and stores ``train.json``."""
    from ..training import pretrain

    started = time.perf_counter()
    result = pretrain(_pretrain_arguments(plan, args, tokenizer), stop)
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


def run_study(args: LengthGenArguments, stop: Any = None) -> dict[str, Any]:
    """Run (or resume) the study described by ``args``; returns the report written to ``results.json``.
    ``stop``: the command line's ``StopSignals`` (Ctrl-C included), which every run's training checks."""
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
                train = train_run(plan, args, tokenizer, stop)
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
        extra["finetune"] = run_finetune_experiment(args)
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
