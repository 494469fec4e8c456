"""The finetune-at-other-lengths experiment of Su (2022), "听说Attention与Softmax更配哦~".

Claim: GAU pretrained at a fixed length m with A = relu²(q·k/√s)/n finetunes *better* on tasks of other
(shorter) lengths when n stays fixed at m than when n is the sample length; softmax (and the
entropy-invariant softmax_plus) does not have this problem.

Here: the GAU variants of a ``lengthgen`` study, pretrained (MLM) at L, are finetuned with
``training.finetune`` (``Trainer``) on a local sequence-classification task whose inputs are much
shorter than L, and their validation accuracy / macro-F1 are compared:

- ``relu2/dynamic``: the relu² model, finetuned with n = the snippet's own number of tokens (padding
  excluded, as bert4keras);
- ``relu2/fixed``: the relu² model finetuned with n = L. With single-length pretraining the two relu²
  variants are trained identically (every row sees n = L keys), so this is exactly the article's
  comparison: same pretrained weights, two choices of n at finetuning;
- ``softmax_plus``, ``softmax``, ``relu2_normalized`` and ``relu2/dynamic + mixed-length pretraining``
  (the article's other remedies) when the study trained them, and ``softmax_plus, no pretraining`` (the
  same architecture from random initialisation: how much of the accuracy pretraining brings).

Two forms of one task ("which pydoc topic is this snippet from?"), chosen with ``finetune_tasks``:

- ``sequence``: sequence classification (the package's heads pool the first token, [CLS]);
- ``token``: token classification — every word carries its snippet's topic as a BIO tag (``B-<topic>``
  on the first word, ``I-<topic>`` after), scored by token accuracy (first sub-words) and entity F1 (the
  whole snippet tagged as one correct span). It needs no pooled [CLS] state: an MLM-pretrained model
  never trains the [CLS] row (it is never a target), and with relu² attention that row can be dead —
  relu(q·k) = 0 for every key, so the [CLS] output does not depend on the input and gets no gradient.

Inputs are truncated to min(longest snippet, L) tokens, so all of them are shorter than or equal to L.

The snippets: the ``finetune_topics`` largest topics of
``pydoc_data.topics`` (by words of their own paragraphs; paragraphs that occur in several topics are
dropped so every label is unambiguous) are cut into non-overlapping snippets of ``finetune_words``
words (the last, shorter piece of a paragraph is kept if it has at least half as many words). A paragraph
goes to the task's validation set when crc32(paragraph) mod 1000 < 300, else to training, so snippets of
one paragraph never straddle the split. The pretraining corpus contains these paragraphs as unlabelled
text (its own 10 % validation split is a subset of the task's validation paragraphs); that is the same
for every variant compared. The topics are related (types, sequence types, string methods, format
strings, …), so it is not solvable by one keyword.
"""

from __future__ import annotations

import json
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ..training.corpus import split_paragraphs
from ..training.preemption import TrainingPreempted
from .arguments import LengthGenArguments
from .results import atomic_write_json, atomic_write_text, describe, read_json, to_csv
from .runfolders import StudyStopped, claim, fingerprint, stop_between_runs
from .variants import VARIANTS, config_fields

VALIDATION_PERMILLE = 300

CONDITIONS: tuple[tuple[str, str | None, dict[str, Any]], ...] = (
    ("relu2/dynamic", "gau_relu2_dynamic", {"relu2_length": "dynamic"}),
    ("relu2/fixed", "gau_relu2_fixed", {"relu2_length": "fixed"}),
    ("softmax_plus", "gau_softmax_plus", {}),
    ("softmax", "gau_softmax", {}),
    ("relu2_normalized", "gau_relu2_normalized", {}),
    ("relu2/dynamic + mixed-length pretraining", "gau_relu2_dynamic+mixed", {"relu2_length": "dynamic"}),
    ("softmax_plus, no pretraining", None, {}),
)
"""(condition, pretrained study variant or ``None`` = from scratch, config overrides at finetuning)."""
FIELDS = ("task", "condition", "pretrained_variant", "seed", "accuracy", "f1", "train_loss", "train_seconds",
          "train_samples", "eval_samples")
FINETUNE_TASKS = ("sequence", "token")


def topic_paragraphs() -> dict[str, list[str]]:
    """``{topic: [paragraph, …]}`` of ``pydoc_data.topics`` without paragraphs shared between topics."""
    from pydoc_data.topics import topics

    found: dict[str, list[str]] = {}
    for name in sorted(topics):
        found[name] = split_paragraphs(topics[name])
    counts = Counter(p for paragraphs in found.values() for p in set(paragraphs))
    return {name: [p for p in paragraphs if counts[p] == 1] for name, paragraphs in found.items()}


def build_topic_task(folder: str | Path, num_topics: int = 8, words: int = 12, level: str = "sequence"
                     ) -> dict[str, Any]:
    """Write ``train.jsonl`` / ``validation.jsonl`` of the topic task; returns its info.

    ``level="sequence"``: rows ``{"text", "label"}``; ``"token"``: rows ``{"tokens": words, "ner_tags":
    ["B-<topic>", "I-<topic>", …]}`` (same snippets).
    """
    if num_topics < 2 or words < 2:
        raise ValueError(f"finetune_topics must be >= 2 and finetune_words >= 2, got {num_topics}, {words}.")
    if level not in FINETUNE_TASKS:
        raise ValueError(f"finetune_tasks must be among {FINETUNE_TASKS}, got {level!r}.")
    paragraphs = topic_paragraphs()
    sizes = sorted(((sum(len(p.split()) for p in ps), name) for name, ps in paragraphs.items()), reverse=True)
    chosen = sorted(name for _, name in sizes[:num_topics])
    splits: dict[str, list[dict[str, str]]] = {"train": [], "validation": []}
    for topic in chosen:
        for paragraph in paragraphs[topic]:
            split = "validation" if zlib.crc32(paragraph.encode()) % 1000 < VALIDATION_PERMILLE else "train"
            tokens = paragraph.split()
            for start in range(0, len(tokens), words):
                piece = tokens[start : start + words]
                if len(piece) * 2 >= words:
                    splits[split].append({"text": " ".join(piece), "label": topic})
    folder = Path(folder)
    for split, rows in splits.items():
        if level == "token":
            rows = [{"tokens": r["text"].split(), "ner_tags": [f"{'B' if i == 0 else 'I'}-{r['label']}"
                                                               for i in range(len(r["text"].split()))]}
                    for r in rows]
        atomic_write_text(folder / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    counts = {split: dict(Counter(r["label"] for r in rows)) for split, rows in splits.items()}
    validation = splits["validation"]
    majority = max(counts["validation"].values()) / max(len(validation), 1)
    return {"level": level, "topics": chosen, "words_per_snippet": words, "counts": counts,
            "train_samples": len(splits["train"]), "validation_samples": len(validation),
            "majority_baseline_accuracy": majority, "chance_accuracy": 1 / len(chosen),
            "train_file": str(folder / "train.jsonl"), "validation_file": str(folder / "validation.jsonl")}


def snippet_token_lengths(task: dict[str, Any], tokenizer: Any) -> dict[str, float]:
    """Mean and max tokens (with [CLS]/[SEP]) of the validation snippets."""
    rows = [json.loads(line) for line in Path(task["validation_file"]).read_text().splitlines()]
    texts = [row["text"] if "text" in row else " ".join(row["tokens"]) for row in rows]
    lengths = [len(ids) for ids in tokenizer(texts, return_attention_mask=False)["input_ids"]]
    return {"mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths)}


def finetune_one(args: LengthGenArguments, task: dict[str, Any], condition: str, variant_name: str | None,
                 overrides: dict[str, Any], seed: int, run_dir: Path, max_seq_length: int,
                 stop: Any = None) -> dict[str, Any]:
    """Finetune one condition × seed with ``training.finetune`` (``stop``: the command line's
    ``StopSignals``, which its training checks); returns the metrics row.

    ``overrides`` (a dict of config fields) are applied on top of the pretrained config of ``variant_name``,
    or, from scratch (``variant_name`` ``None``), on top of ``gau_softmax_plus`` at the study's size."""
    from transformers import TrainingArguments

    from ..training.finetune import FinetuneArguments, finetune

    model_kwargs: dict[str, Any]
    if variant_name is None:
        fields = {**config_fields(VARIANTS["gau_softmax_plus"], args.size, args.train_length), **overrides}
        model_kwargs = {"model_type": "gau", "config_overrides": fields}
    else:
        model_kwargs = {"model_name_or_path": str(pretrained_model_dir(args, variant_name, seed)),
                        "config_overrides": dict(overrides) or None}
    token_level = task["level"] == "token"
    finetune_args = FinetuneArguments(
        task="token_classification" if token_level else "sequence_classification",
        train_file=task["train_file"], validation_file=task["validation_file"],
        max_seq_length=max_seq_length, max_train_samples=args.finetune_max_train_samples,
        # finetuned only when missing or stale (fingerprint): replace what is there
        overwrite_output_dir=True,
        **model_kwargs,
    )
    steps_per_epoch = -(-min(task["train_samples"], args.finetune_max_train_samples or 10**9)
                        // args.finetune_batch_size)
    training_args = TrainingArguments(
        output_dir=str(run_dir / "model"), per_device_train_batch_size=args.finetune_batch_size,
        per_device_eval_batch_size=64, learning_rate=args.finetune_learning_rate,
        num_train_epochs=args.finetune_epochs,
        warmup_steps=max(1, int(0.1 * steps_per_epoch * args.finetune_epochs)),
        weight_decay=0.01, seed=seed, eval_strategy="no", save_strategy="no", report_to="none",
        logging_steps=50, disable_tqdm=True, use_cpu=True, dataloader_num_workers=0,
    )
    started = time.perf_counter()
    result = finetune(finetune_args, training_args, stop)
    metrics = result.metrics
    return {"task": task["level"], "condition": condition, "pretrained_variant": variant_name, "seed": seed,
            "accuracy": metrics.get("eval_accuracy"), "f1": metrics.get("eval_f1"),
            "train_loss": metrics.get("train_loss"),
            "train_seconds": time.perf_counter() - started, "train_samples": metrics.get("train_samples"),
            "eval_samples": metrics.get("eval_samples")}


def pretrained_model_dir(args: LengthGenArguments, variant_name: str, seed: int) -> Path:
    """The folder of the model the study pretrained for ``variant_name`` × ``seed``."""
    return Path(args.output_dir) / "runs" / variant_name / f"seed_{seed}" / "model"


def run_finetune_experiment(args: LengthGenArguments, stop: Any = None) -> dict[str, Any]:
    """Run every available condition × seed of every task in ``args.finetune_tasks``; returns
    ``{task: report}`` (resumable: finished ``result.json`` files are reused). ``stop``: the command line's
    ``StopSignals``, checked by every finetuning and between them (``runfolders.StudyStopped``)."""
    reports = {level: run_finetune_task(args, level, stop) for level in args.finetune_tasks}
    stop_between_runs(stop, "after the finetune experiment")
    return reports


def run_finetune_task(args: LengthGenArguments, level: str, stop: Any = None) -> dict[str, Any]:
    """The experiment for one task form (``sequence`` or ``token``); writes ``finetune/<level>/``."""
    from ..training import load_tokenizer

    root = Path(args.output_dir) / "finetune" / level
    task = build_topic_task(root / "task", args.finetune_topics, args.finetune_words, level)
    task.update(snippet_token_lengths(task, load_tokenizer(None)))
    max_seq_length = max(8, min(int(task["max_tokens"]), args.train_length))
    available = set(args.variants)
    rows, skipped_conditions, pending = [], [], []
    for condition, variant_name, overrides in CONDITIONS:
        if variant_name is not None and variant_name not in available:
            skipped_conditions.append(condition)
            continue
        for seed in args.seeds:
            folder = condition.replace("/", "_").replace(" ", "_").replace(",", "")
            run_dir = root / "runs" / folder / f"seed_{seed}"
            key = fingerprint({"task": {k: task[k]
                                        for k in ("level", "topics", "words_per_snippet", "train_samples")},
                               "variant": variant_name, "overrides": overrides, "seed": seed,
                               "max_seq_length": max_seq_length,
                               "epochs": args.finetune_epochs, "lr": args.finetune_learning_rate,
                               "batch": args.finetune_batch_size,
                               "max_train": args.finetune_max_train_samples,
                               "pretrain": _pretrain_fingerprint(args, variant_name, seed)})
            with claim(run_dir) as mine:
                if not mine:
                    pending.append(f"{condition} seed {seed} (held by another process)")
                    continue
                done = read_json(run_dir / "result.json")
                if done and done.get("fingerprint") == key:
                    rows.append(done["row"])
                    continue
                if variant_name is not None and _pretrain_fingerprint(args, variant_name, seed) is None:
                    pending.append(f"{condition} seed {seed} ({_pretrain_state(args, variant_name, seed)})")
                    continue
                where = f"{condition} seed {seed} ({level})"
                stop_between_runs(stop, f"before finetuning {where}")
                try:
                    row = finetune_one(args, task, condition, variant_name, overrides, seed, run_dir,
                                       max_seq_length, stop)
                except TrainingPreempted as error:  # its checkpoint is not resumed: the rerun redoes it
                    if isinstance(error, StudyStopped):
                        raise
                    raise StudyStopped(error.signal_name, f"while finetuning {where}, which the next run "
                                                          "of the command redoes") from None
                atomic_write_json(run_dir / "result.json", {"fingerprint": key, "row": row})
                rows.append(row)
    summary = summarize_finetune(rows)
    report = {"task": task, "max_seq_length": max_seq_length, "train_length": args.train_length,
              "rows": rows, "summary": summary, "skipped_conditions": skipped_conditions, "pending": pending}
    atomic_write_json(root / "finetune.json", report)
    atomic_write_text(root / "finetune.csv", to_csv(rows, FIELDS))
    return report


def _pretrain_state(args: LengthGenArguments, variant_name: str, seed: int) -> str:
    """Why the pretrained run a condition starts from is missing: it diverged in training (its
    ``result.json`` says so; the study keeps it, so waiting would not help), or it is not finished."""
    result = read_json(pretrained_model_dir(args, variant_name, seed).parent / "result.json") or {}
    if result.get("diverged") == "training":
        return "its pretrained run diverged in training: no model to finetune"
    return "pretrained run not finished"


def _pretrain_fingerprint(args: LengthGenArguments, variant_name: str | None, seed: int) -> str | None:
    """The fingerprint of the finished pretraining run the condition starts from (``None``: from scratch,
    or not finished)."""
    if variant_name is None:
        return None
    train = read_json(pretrained_model_dir(args, variant_name, seed).parent / "train.json") or {}
    return train.get("fingerprint")


def summarize_finetune(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean, std (ddof 1) and per-seed values of accuracy and macro-F1 per condition."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["condition"]].append(row)
    out = []
    for condition, group in groups.items():
        entry: dict[str, Any] = {"condition": condition, "pretrained_variant": group[0]["pretrained_variant"],
                                 "n_seeds": len(group)}
        for metric in ("accuracy", "f1"):
            stats = describe([r[metric] for r in group])
            entry.update({f"{metric}_{k}": v for k, v in stats.items()})
            entry[f"{metric}_per_seed"] = [r[metric] for r in sorted(group, key=lambda r: r["seed"])]
        out.append(entry)
    return out


def _cell(entry: dict[str, Any], metric: str) -> str:
    mean, std = entry[f"{metric}_mean"], entry[f"{metric}_std"]
    if mean is None:
        return "–"
    return f"{mean:.3f} ± {std:.3f}" if entry["n_seeds"] > 1 else f"{mean:.3f}"


def finetune_markdown(reports: dict[str, dict[str, Any]]) -> str:
    """The finetune experiment's tables (markdown), one per task form."""
    return "\n\n".join(_task_markdown(report) for report in reports.values())


def _task_markdown(report: dict[str, Any]) -> str:
    task = report["task"]
    form = ("token classification (every word tagged with its snippet's topic; accuracy over words, F1 over "
            "whole-snippet spans)" if task["level"] == "token" else "sequence classification ([CLS] pooling)")
    lines = [f"## Finetuning at shorter lengths (pretrained at L = {report['train_length']}): {form}", "",
             (f"Task: which of {len(task['topics'])} pydoc topics ({', '.join(task['topics'])}) a "
             f"{task['words_per_snippet']}-word snippet comes from; {task['train_samples']} train / "
             f"{task['validation_samples']} validation snippets of {task['mean_tokens']:.1f} tokens on "
             f"average (max {task['max_tokens']}); majority-class accuracy "
             f"{task['majority_baseline_accuracy']:.3f}, chance {task['chance_accuracy']:.3f}; inputs "
             f"truncated to {report['max_seq_length']} tokens."), "",
             f"| condition | accuracy | {'span F1' if task['level'] == 'token' else 'macro-F1'} | per-seed "
             "accuracy |",
             "|---|---|---|---|"]
    for entry in report["summary"]:
        seeds = ", ".join(f"{v:.3f}" for v in entry["accuracy_per_seed"] if v is not None)
        cells = [entry["condition"], _cell(entry, "accuracy"), _cell(entry, "f1"), seeds]
        lines.append("| " + " | ".join(cells) + " |")
    if report.get("pending"):
        lines += ["", "Not finished yet (rerun the study to complete): " + ", ".join(report["pending"]) + "."]
    if report.get("skipped_conditions"):
        lines += ["", "Not run (their pretrained variant is not in the study): "
                  + ", ".join(report["skipped_conditions"]) + "."]
    return "\n".join(lines)


__all__ = ["CONDITIONS", "FINETUNE_TASKS", "build_topic_task", "finetune_markdown", "pretrained_model_dir",
           "run_finetune_experiment", "run_finetune_task", "summarize_finetune", "topic_paragraphs"]
