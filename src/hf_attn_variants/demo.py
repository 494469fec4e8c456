"""``hf-attn-variants demo`` (``make demo``): the project's main job end to end, on a CPU, in minutes.

For every family in ``FAMILIES`` (entropy_invariant, gau, synthesizer):

1. pretrain a tiny masked LM (hidden 64, 2 layers) with ``training.pretrain`` on the embedded corpus
   (``pydoc_data.topics``) at training length L (default 64);
2. evaluate validation MLM loss and masked-token accuracy at L, 2L and 4L (``evaluate_lm``; the same
   validation paragraphs regrouped into longer blocks; the Synthesizer is built with
   ``max_position_embeddings = 4L`` since its random attention matrix has one row/column per position);
3. export the hub-ready folder ``runs/demo/<family>/`` (``hub.export``: safetensors, remote code,
   tokenizer, model card with these results);
4. reload every exported folder with ``trust_remote_code=True`` in a fresh Python process (which never
   imports this package) and run a ``fill-mask`` pipeline on one sentence;
5. print one table (also written to ``runs/demo/results.md`` and ``results.json``).

What to expect: after a few hundred steps on ~100k tokens the models predict frequent words; the point is
the length columns — the entropy-invariant scale (log n / log L) and GAU-α's softmax_plus are built to keep
the loss flat from L to 4L, the Synthesizer's random attention rows beyond L were never trained.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cli_utils import (
    FlagError,
    check_field_types,
    check_int,
    check_number,
    check_output_dir,
    check_positive,
    check_seed,
    names_in_message,
)
from .models import FAMILIES

SENTENCE = "the [MASK] statement raises an exception."

FAMILY_OVERRIDES = {
    "entropy_invariant": "num_attention_heads=4,intermediate_size=128,attention_scale=entropy_invariant",
    "gau": "expansion_factor=2,attention_key_size=32,attention_normalization=softmax_plus",
    "synthesizer": "num_attention_heads=4,intermediate_size=128,synthesizer_components=[random,vanilla]",
}
"""Tiny settings per family on top of hidden_size / num_hidden_layers (the Synthesizer also gets
max_position_embeddings = 4L). A family without an entry gets only the shared settings."""

CHILD = r"""
import json, sys
import transformers
from transformers import pipeline
transformers.utils.logging.set_verbosity_error()
out = {}
for family, folder in json.loads(sys.argv[1]).items():
    fill = pipeline("fill-mask", model=folder, trust_remote_code=True, device="cpu")
    top = fill(sys.argv[2], top_k=3)
    out[family] = {"tokens": [t["token_str"] for t in top], "scores": [round(t["score"], 4) for t in top],
                   "class": type(fill.model).__module__ + "." + type(fill.model).__name__}
assert "hf_attn_variants" not in sys.modules, "the fresh process must not import hf_attn_variants"
print("RESULT " + json.dumps(out))
"""


@dataclass
class DemoArguments:
    """Arguments of ``demo`` (each is also a ``--flag``)."""

    output_dir: str = field(default="runs/demo", metadata={"help": "Exports go to <output_dir>/<family>/."})
    families: list[str] | None = field(default=None, metadata={"help": "Families to run (default: all)."})
    max_seq_length: int = field(default=64, metadata={"help": "Training length L."})
    length_multipliers: list[int] = field(default_factory=lambda: [1, 2, 4],
                                          metadata={"help": "Eval at k·L."})
    max_train_steps: int = field(default=800, metadata={"help": "Optimizer steps per family."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Batch size."})
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate (linear decay)."})
    num_warmup_steps: int = field(default=50, metadata={"help": "Warm-up steps."})
    hidden_size: int = field(default=64, metadata={"help": "Model width of every family."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Layers of every family."})
    seed: int = field(default=0, metadata={"help": "Seed."})
    sentence: str = field(default=SENTENCE, metadata={"help": "fill-mask input (with [MASK])."})
    num_threads: int = field(
        default=1,
        metadata={"help": "torch intra-op threads; 0 = torch's default. The demo models are tiny: one thread "
                  "wastes little on an idle CPU and avoids OpenMP spin-waiting when the cores are shared."},
    )

    def __post_init__(self) -> None:
        """Check every value; a bad one raises ``FlagError`` (a ``ValueError``) naming it."""
        check_field_types(self)
        families = self.families or list(FAMILIES)
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise FlagError("families", f"families must be among {tuple(FAMILIES)}, got {unknown}.")
        self.families = list(dict.fromkeys(families))
        if self.sentence.count("[MASK]") != 1:
            raise FlagError("sentence", f"sentence must contain [MASK] exactly once, got {self.sentence!r}.")
        check_output_dir("output_dir", self.output_dir)
        check_demo_folder(Path(self.output_dir))
        check_int("max_seq_length", self.max_seq_length, 8)
        if not self.length_multipliers:
            raise FlagError("length_multipliers", "length_multipliers must not be empty.")
        for k in self.length_multipliers:
            check_positive("length_multipliers", k)
        for name in ("max_train_steps", "per_device_train_batch_size", "hidden_size", "num_hidden_layers"):
            check_positive(name, getattr(self, name))
        check_number("learning_rate", self.learning_rate, 0, open_low=True)
        check_int("num_warmup_steps", self.num_warmup_steps, 0)
        check_seed("seed", self.seed)
        check_int("num_threads", self.num_threads, 0)
        check_family_configs(self)
        check_corpus_lengths(self)


DEMO_FILES = ("_pretrain", "results.json", "results.md")
"""What the demo writes into its folder besides one export folder per family."""


EXPORTS_FILE = "exports.json"
"""``_pretrain/exports.json``: the files of each family's export, as written (``record_export``)."""


def demo_repo_id(family: str) -> str:
    """The repository id the demo's export of ``family`` names in its card."""
    return f"hf-attn-variants/demo-{family.replace('_', '-')}-tiny-mlm"


def folder_files(folder: Path) -> list[str]:
    """Every file under ``folder``, relative and sorted."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


def record_export(root: Path, family: str) -> None:
    """Add the files of ``root/<family>`` (an export just written) to ``root/_pretrain/exports.json``."""
    from .cli_utils import atomic_write_text

    record = exported_files(root)
    record[family] = folder_files(root / family)
    atomic_write_text(root / "_pretrain" / EXPORTS_FILE, json.dumps(record, indent=2))


def exported_files(root: Path) -> dict[str, list[str]]:
    """``record_export``'s record (empty when there is none, or it cannot be read)."""
    try:
        record = json.loads((root / "_pretrain" / EXPORTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def is_demo_export(root: Path, family: str) -> bool:
    """Whether ``root/<family>`` is empty or holds the demo's export and nothing else: every file is one
    ``record_export`` recorded (a folder from before the record: its card names the demo's repository)."""
    path = root / family
    files = folder_files(path)
    if not files:
        return True
    recorded = exported_files(root).get(family)
    if recorded is not None:
        return set(files) <= set(recorded)
    try:
        return demo_repo_id(family) in (path / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def is_demo_results(path: Path) -> bool:
    """Whether ``path`` is the demo's ``results.json`` (its rows, table and arguments)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"rows", "table", "args"} <= set(data)


def check_demo_folder(folder: Path) -> None:
    """``FlagError`` naming ``--output_dir`` when ``folder`` holds anything the demo did not write.

    The demo retrains and re-exports into its own names, which would replace a person's files of those
    names. Allowed: ``_pretrain``; ``results.json`` and ``results.md`` when the first is the demo's
    (``is_demo_results``); named after a family, a folder holding nothing or the demo's export and nothing
    else (``is_demo_export``: a note put into it would be lost with the old export).
    """
    if not folder.is_dir():
        return
    from .cli_utils import check_result_files

    results = {"results file": folder / "results.json", "table": folder / "results.md"}
    check_result_files("output_dir", results, ours=is_demo_results, tool="hf-attn-variants demo")
    foreign = sorted(
        path.name for path in folder.iterdir() if not path.name.startswith(".")
        and path.name not in DEMO_FILES
        and not (path.name in FAMILIES and path.is_dir() and is_demo_export(folder, path.name))
    )
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise FlagError("output_dir", f"--output_dir {str(folder)!r} holds files that the demo did not "
                                      f"write ({shown}); the demo replaces its own folders there, so choose "
                                      "another --output_dir.")


def resumes(train_dir: Path, arguments: Any) -> bool:
    """Whether ``train_dir`` holds an unfinished ``pretrain`` of the same ``arguments`` (a demo stopped by a
    signal, which said that the same command resumes): then it resumes instead of training from scratch.
    ``pretrain``'s own folder rule decides (``outputs.check_output_folder``); whatever it would refuse, a
    finished run or other flags, the demo retrains."""
    from .training.outputs import check_output_folder, json_arguments
    from .training.pretrain import PRETRAIN_RULE

    try:
        return check_output_folder(PRETRAIN_RULE, train_dir, json_arguments(arguments)).same_run
    except FlagError:
        return False


DEMO_FLAG_OF_CONFIG_FIELD = {"hidden_size": "hidden_size", "num_hidden_layers": "num_hidden_layers",
                              "max_position_embeddings": "max_seq_length", "base_length": "max_seq_length"}
"""Which demo flag sets each config field the demo derives from its flags (the rest are fixed per family)."""


def check_family_configs(args: DemoArguments) -> None:
    """Build every family's demo config (cheap, no model) so that sizes the config rejects fail up front;
    ``FlagError`` naming the demo flag behind the rejected field."""
    from .training import build_config, embedded_tokenizer

    tokenizer = embedded_tokenizer()
    for family in args.families:
        try:
            build_config(family, config_overrides=family_overrides(family, args), tokenizer=tokenizer,
                         max_seq_length=args.max_seq_length)
        except FlagError as error:
            named = names_in_message(str(error), list(DEMO_FLAG_OF_CONFIG_FIELD))
            flag = DEMO_FLAG_OF_CONFIG_FIELD[named[0]] if named else "hidden_size"
            reason = str(error).removeprefix("config_overrides: ")
            raise FlagError(flag, f"{flag}: the {family} demo config rejects it: {reason}") from error


def check_corpus_lengths(args: DemoArguments) -> None:
    """The embedded corpus holds a block of L tokens to train on and one of max(k)·L to evaluate: a length it
    cannot fill failed after every family had trained (evaluation) or deep in pretraining (training).
    ``FlagError`` naming ``max_seq_length``, or ``length_multipliers`` when only the longest k·L is too
    long."""
    from .training import corpus_splits, embedded_tokenizer
    from .training.data import holds_tokens, tokenize_texts

    tokenizer, splits = embedded_tokenizer(), corpus_splits()
    if not holds_tokens(({"text": text} for text in splits["train"]), tokenizer, args.max_seq_length):
        raise FlagError("max_seq_length", f"max_seq_length={args.max_seq_length} is longer than the embedded "
                                          "corpus's training text: no block of that length to train on.")
    longest = args.max_seq_length * max(args.length_multipliers)
    if holds_tokens(({"text": text} for text in splits["validation"]), tokenizer, longest):
        return
    tokens = sum(len(ids) for ids in tokenize_texts(tokenizer, list(splits["validation"]), None))
    flag = "length_multipliers" if tokens >= args.max_seq_length else "max_seq_length"
    raise FlagError(flag, f"{flag}: the longest evaluation length, {max(args.length_multipliers)} × "
                          f"{args.max_seq_length} = {longest} tokens, is longer than the embedded corpus's "
                          f"validation text ({tokens} tokens).")


def family_overrides(family: str, args: DemoArguments) -> str:
    """``--config_overrides`` of the demo model of ``family``."""
    overrides = [f"hidden_size={args.hidden_size}", f"num_hidden_layers={args.num_hidden_layers}"]
    if FAMILY_OVERRIDES.get(family):
        overrides.append(FAMILY_OVERRIDES[family])
    if family == "synthesizer":
        overrides.append(f"max_position_embeddings={args.max_seq_length * max(args.length_multipliers)}")
    return ",".join(overrides)


def evaluate_lengths(folder: str, args: DemoArguments) -> dict[str, Any]:
    """MLM loss/accuracy of the model in ``folder`` on the validation split regrouped at k·L tokens."""
    import torch
    from transformers import AutoModelForMaskedLM

    from .training import corpus_splits, evaluate_lm, load_tokenizer, text_blocks

    tokenizer = load_tokenizer(folder)
    model = AutoModelForMaskedLM.from_pretrained(folder).eval()
    texts = corpus_splits()["validation"]
    results = []
    for k in args.length_multipliers:
        length = k * args.max_seq_length
        blocks = text_blocks(texts, tokenizer, length)
        with torch.no_grad():
            metrics = evaluate_lm(model, blocks, objective="mlm", tokenizer=tokenizer, batch_size=8,
                                  seed=args.seed)
        results.append({"length": length, "multiplier": k, "loss": metrics["loss"],
                        "accuracy": metrics["accuracy"], "blocks": int(metrics["blocks"])})
    return {"train_length": args.max_seq_length, "results": results,
            "num_parameters": sum(p.numel() for p in model.parameters())}


def reload_in_fresh_process(folders: dict[str, str], sentence: str) -> dict[str, Any]:
    """Load every folder with ``pipeline("fill-mask", trust_remote_code=True)`` in a new interpreter."""
    with tempfile.TemporaryDirectory() as modules:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": modules,
               "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(folders), sentence],
                                capture_output=True, text=True, env=env, cwd=modules, timeout=600,
                                check=False)
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"Reloading the exports failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def format_table(rows: list[dict[str, Any]], multipliers: list[int], length: int) -> str:
    """The demo's result table (markdown)."""
    loss_heads = [f"loss@{k * length}" for k in multipliers]
    acc_heads = [f"acc@{k * length}" for k in multipliers]
    head = ["family", "params", "train s", *loss_heads, *acc_heads, "fill-mask top-3", "reload"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        by_k = {r["multiplier"]: r for r in row["lengths"]}
        cells = [row["family"], f"{row['params'] / 1e6:.2f}M", f"{row['train_seconds']:.0f}",
                 *[f"{by_k[k]['loss']:.3f}" for k in multipliers],
                 *[f"{by_k[k]['accuracy']:.3f}" for k in multipliers],
                 ", ".join(row["fill_mask"]), row["reload"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def demo(args: DemoArguments, *, ctrl_c_stops: bool = False) -> dict[str, Any]:
    """Run the demo (module docstring); returns ``{"rows": [...], "table": str, "seconds": float}``. With
    ``ctrl_c_stops`` (the command line) Ctrl-C during a family's training is a stop, as for ``pretrain``:
    that step's checkpoint, then ``TrainingPreempted``, and the same command resumes the family; elsewhere,
    and from Python, it stays a ``KeyboardInterrupt``."""
    import torch

    started = time.perf_counter()
    previous_threads = torch.get_num_threads()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    try:
        return _run_demo(args, started, ctrl_c_stops)
    finally:
        torch.set_num_threads(previous_threads)


def _run_demo(args: DemoArguments, started: float, ctrl_c_stops: bool = False) -> dict[str, Any]:
    from .hub import ExportArguments, export
    from .cli_utils import atomic_write_text
    from .training import PretrainArguments, embedded_tokenizer_path, pretrain
    from .training.preemption import COMMAND_STOP_SIGNALS, STOP_SIGNALS, StopSignals

    root = Path(args.output_dir)
    embedded_tokenizer_path()
    rows, folders = [], {}
    print(f"[demo] {len(args.families)} famil{'ies' if len(args.families) > 1 else 'y'} "
          f"({', '.join(args.families)}): pretrain {args.max_train_steps} steps each at L = "
          f"{args.max_seq_length}, evaluate at {', '.join(f'{k}L' for k in args.length_multipliers)}, export "
          f"to {root}/<family>, reload in a fresh process", flush=True)
    for family in args.families:
        train_dir = root / "_pretrain" / family
        print(f"[demo] {family}: training ...", flush=True)
        t0 = time.perf_counter()
        arguments = PretrainArguments(
            output_dir=str(train_dir), model_type=family, config_overrides=family_overrides(family, args),
            objective="mlm", max_seq_length=args.max_seq_length,
            per_device_train_batch_size=args.per_device_train_batch_size, learning_rate=args.learning_rate,
            num_warmup_steps=args.num_warmup_steps, max_train_steps=args.max_train_steps,
            logging_steps=max(1, args.max_train_steps // 10), seed=args.seed, disable_tqdm=True,
        )
        # the demo retrains every time it runs, but continues a family that a signal stopped
        arguments.overwrite_output_dir = not resumes(train_dir, arguments)
        with StopSignals(COMMAND_STOP_SIGNALS if ctrl_c_stops else STOP_SIGNALS) as stop:
            result = pretrain(arguments, stop)
        train_seconds = time.perf_counter() - t0
        lengths = evaluate_lengths(str(train_dir), args)
        atomic_write_text(train_dir / "eval_by_length.json", json.dumps(lengths, indent=2))
        folder = export(ExportArguments(
            model_name_or_path=str(train_dir), output_dir=str(root / family),
            repo_id=demo_repo_id(family), overwrite=True,
        ))
        record_export(root, family)
        folders[family] = str(folder.resolve())
        rows.append({"family": family, "params": lengths["num_parameters"], "train_seconds": train_seconds,
                     "steps": result.completed_steps, "lengths": lengths["results"], "folder": str(folder)})
        summary = ", ".join(f"loss@{r['length']}={r['loss']:.3f}" for r in lengths["results"])
        print(f"[demo] {family}: {result.completed_steps} steps in {train_seconds:.0f}s; {summary}",
              flush=True)
    reloaded = reload_in_fresh_process(folders, args.sentence)
    for row in rows:
        info = reloaded.get(row["family"], {})
        row["fill_mask"] = info.get("tokens", ["-"])
        row["reload"] = "ok" if info.get("class", "").startswith("transformers_modules") else "FAILED"
        row["reload_class"] = info.get("class")
    seconds = time.perf_counter() - started
    table = format_table(rows, args.length_multipliers, args.max_seq_length)
    report = {"rows": rows, "table": table, "seconds": seconds, "sentence": args.sentence,
              "args": asdict(args)}
    atomic_write_text(root / "results.json", json.dumps(report, indent=2))
    atomic_write_text(root / "results.md",
                      f"fill-mask sentence: `{args.sentence}`\n\n{table}\n\nTotal time: {seconds:.0f} s\n")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``DemoArguments`` field."""
    from .cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, DemoArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: run the demo and print the table."""
    import logging

    from .cli_utils import dataclasses_from_namespace, fail, fail_flag
    from .training.preemption import TrainingPreempted

    logging.basicConfig(level=logging.WARNING)
    for name in ("transformers", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        (args,) = dataclasses_from_namespace(namespace, DemoArguments)
    except FlagError as error:
        return fail_flag("demo", error)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        report = demo(args, ctrl_c_stops=True)
    except FlagError as error:  # an input only a run finds (pretrain's own checks): one line, no traceback
        return fail_flag("demo", error)
    except TrainingPreempted as stopped:
        # the family in training wrote its checkpoint; the same command resumes it
        fail("demo", str(stopped), label="interrupted" if stopped.signal_name == "SIGINT" else "preempted")
        return stopped.exit_code
    bad = [row["family"] for row in report["rows"] if row["reload"] != "ok"]
    print(f"\nfill-mask sentence: {args.sentence!r}\n")
    print(report["table"])
    root = Path(args.output_dir)
    print(f"\nExports: {', '.join(row['folder'] for row in report['rows'])}  |  total "
          f"{report['seconds']:.0f} s")
    print(f"wrote this table to {root / 'results.md'} and {root / 'results.json'}")
    if report["rows"]:
        print(f"next: AutoModelForMaskedLM.from_pretrained({json.dumps(report['rows'][0]['folder'])}, "
              "trust_remote_code=True), or hf-attn-variants push --folder "
              f"{report['rows'][0]['folder']} --repo_id <you>/<name>")
    return 1 if bad else 0


__all__ = [
    "FAMILY_OVERRIDES",
    "DemoArguments",
    "check_corpus_lengths",
    "check_family_configs",
    "demo",
    "evaluate_lengths",
    "family_overrides",
    "run",
]
