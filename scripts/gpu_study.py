#!/usr/bin/env python
"""The length-generalisation study at a real scale (issue 49), part 1: causal language models trained at
L = 512 with 10–30M non-embedding parameters, evaluated out to 32× (16k), in unattended GPU leases; part 2
(``--part 2``): passkey and MQAR models of the same variants and sizes.

Part 2 differs from what follows only where retrieval needs it: no corpus (the examples of
``lengthgen.tasks`` are generated from seeds; the sha256 of some of them and of the task vocabularies take
the corpus's and the tokenizer's place in the fingerprint), the task vocabulary of 64 ids instead of the
tokenizer, one run per variant, task and seed (MQAR's first steps on the copy warm-up, ``task_steps``),
evaluation by ``lengthgen.retrieval.evaluate_task_run`` (accuracy at every length), and its own files
(``FILES[2]``: ``gpu-study-retrieval-*``, committed as ``retrieval-runs.jsonl``; records carry ``part``).

Subcommands (``scripts/gpu_study.sh`` runs ``run``; from the repository root)::

    gpu_study.py run --out DIR [--dry-run] [--budget 360] [--deadline 540]  # one lease's work
    gpu_study.py absorb DIR            # here, after a lease: its new runs into docs/results/gpu-study/
    gpu_study.py publish [--runs F] [--out D]  # results tables, verdicts and a plot of the committed runs
    gpu_study.py plan [--dry-run]      # the variants, their non-embedding parameters, nothing trained

``run``:

1. builds the corpus (``build_corpus``) from the Python files installed with the interpreter that runs it:
   the standard library's ``.py`` files, then the ``transformers`` package's, in sorted path order,
   tokenized with the embedded WordPiece tokenizer the CPU study uses (4,096 ids); documents of at least
   16,384 tokens that are code, not data tables (``table_share``), are held out (every third, up to 8) and
   evaluated on their first 16,384 tokens; records the sources, the Python version and the sha256 of the
   corpus and of the tokenizer;
2. plans the variants (``VARIANTS``) at one shared size, equal in non-embedding parameters within 5 %
   (counted on the real configs, on the meta device);
3. times 10 training steps of every variant (after 3 warm-up steps, which include ``torch.compile``), the
   set-up of a second build (what each run pays: the compiled code is cached in the process by then), and one
   evaluation forward at the longest length after a warm-up one, writing the plan after each variant (a
   variant whose timing would end past ``--deadline`` is not started: the lease stops and the next one times
   again), and sets the step count so that one seed of every variant
   fits ``--budget`` seconds, evaluation included, but not below the settings' ``min_steps`` (part 2:
   1,500, the count its tasks need) — unless committed runs of the same corpus, tokenizer and settings pin it
   already (runs with different step counts could not be pooled over seeds), in which case the timing is
   skipped;
4. trains and evaluates every (variant, seed) that is neither committed (``docs/results/gpu-study/*.jsonl``)
   nor in the output folder already, seed by seed, and appends each finished run at once to
   ``gpu-study-runs.jsonl``; it starts no run that its prediction says would end past ``--deadline``
   seconds after the command started, so the lease's 10-minute limit never cuts a write.

Training is a plain loop here (AdamW, bf16 autocast, ``torch.compile`` per variant where it compiles):
``training.pretrain`` needs ``datasets``, which the GPU image does not have, and would tokenize the corpus
again for every run. The configs, the evaluation (``lengthgen.evaluation.evaluate_at_lengths``, the
evaluation modes of ``lengthgen.study.load_for_eval``) and the entropy measurement
(``entropy.measure.entropy_by_length``) are the CPU study's.

The output folder gets at most five files: ``gpu-study-runs.jsonl`` (one line per finished run),
``gpu-study-plan.json`` (corpus, sizes, timing, steps, what ran and what was skipped and why),
``gpu-study.log`` (written by the shell wrapper), and after ``publish --out`` ``gpu-study-results.md`` and
``gpu-study-perplexity.png``.

Exit status: 0 when every run it started finished; 1 when one failed (the plan file says which); 2 for a bad
argument (one line naming the flag).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch

from hf_attn_variants.lengthgen.arguments import TASK_COPY_WARMUP, TASK_STEPS
from hf_attn_variants.lengthgen.results import atomic_write_json, atomic_write_text
from hf_attn_variants.lengthgen.study import machine_info
from hf_attn_variants.models.compat import version_tuple

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "results" / "gpu-study"
RUNS_FILE = "gpu-study-runs.jsonl"
PLAN_FILE = "gpu-study-plan.json"
RESULTS_FILE = "gpu-study-results.md"
PLOT_FILE = "gpu-study-perplexity.png"


@dataclass(frozen=True)
class PartFiles:
    """One part's file names: in a lease's output folder (``runs``, ``plan``, ``log``; ``results`` and
    ``plot`` after ``publish --out``) and under ``docs/results/gpu-study/`` (``committed``)."""

    runs: str
    plan: str
    results: str
    plot: str
    log: str
    committed: str


FILES = {1: PartFiles(RUNS_FILE, PLAN_FILE, RESULTS_FILE, PLOT_FILE, "gpu-study.log", "runs.jsonl"),
         2: PartFiles("gpu-study-retrieval-runs.jsonl", "gpu-study-retrieval-plan.json",
                      "gpu-study-retrieval-results.md", "gpu-study-retrieval-accuracy.png",
                      "gpu-study-retrieval.log", "retrieval-runs.jsonl")}
"""Part 1, the language model, and part 2, retrieval. Every record holds its ``part`` (part 1's first ones
may not: part 1), and ``read_runs`` never returns another part's."""
TASKS: tuple[str, ...] = ("passkey", "mqar")
"""Part 2's tasks (``lengthgen.tasks``): one model per variant, task and seed."""
FORMAT_VERSION = 1
COMMAND_LIMIT_S = 600.0
"""A lease's limit on one command; ``--deadline`` must stay under it."""

VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("ei_standard", {}),
    ("ei_entropy_invariant", {}),
    ("ei_ssmax", {}),
    ("ei_entropy_invariant_nope_layers+nope_every_4", {}),
    ("gau_softmax_plus", {}),
    ("gau_relu2_fixed", {}),
    ("gau_relu2_dynamic", {}),
    ("gau_flash", {"chunk_size": 128}),
    ("llama", {}),
)
"""Part 1's variants: (``lengthgen`` variant name, config fields changed here). The hybrid is the
entropy-invariant family with every 4th layer without RoPE and log-n on those layers only
(``ei_entropy_invariant_nope_layers`` with the position scheme ``nope_every_4``); FLASH gets chunks of 128
(the dry run: L/4)."""

CLAIMS: tuple[tuple[str, str, str], ...] = (
    ("softmax with log n (`softmax_plus`) beats relu²/n with n = L (`fixed`), GAU", "gau_softmax_plus",
     "gau_relu2_fixed"),
    ("softmax with log n (`softmax_plus`) beats relu²/n with n = the row's keys (`dynamic`), GAU",
     "gau_softmax_plus", "gau_relu2_dynamic"),
    ("log-n scale beats the standard 1/√d, multi-head family", "ei_entropy_invariant", "ei_standard"),
    ("SSMax (learned log-n) beats the standard 1/√d, multi-head family", "ei_ssmax", "ei_standard"),
    ("every 4th layer NoPE with log-n there beats RoPE everywhere",
     "ei_entropy_invariant_nope_layers+nope_every_4", "ei_standard"),
)
"""The seed claims (claim, a, b): "a has lower held-out loss than b", at L and at 32×."""
MIN_SEEDS = 3
"""The issue-29 rule: a verdict other than "not resolved" needs this many seeds."""
MARGIN = 0.02
"""The issue-29 rule's margin, here in nats of loss: the mean over seeds of loss(b) − loss(a) must be at
least this large, with no seed of the other sign."""
TASK_MARGIN = 0.05
"""Part 2's margin, in accuracy: the retrieval study's (``tools/docs_results/retrieval.py``'s ``MARGIN``; with
32 sequences per length and seed one sequence is 0.03)."""


class UsageError(Exception):
    """A bad argument: ``flag`` names it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class ModelSettings:
    """What a run's numbers depend on besides the variant and the seed, in both parts (all in the
    fingerprint)."""

    train_length: int = 512
    eval_lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    attention_key_size: int = 128
    gau_layer_factor: int = 2
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    warmup_fraction: float = 0.1
    dtype: str = "bf16"
    size_tolerance: float = 0.05
    """Every variant's non-embedding parameters within this fraction of their mean."""
    timing_steps: int = 10
    """Steps timed per variant, after ``timing_warmup`` steps (which compile)."""
    timing_warmup: int = 3
    max_steps: int | None = None
    """A cap on the step count the timing gives (the dry run's)."""
    min_steps: int = 1
    """A floor on the step count the timing gives: part 2's runs need enough steps to learn their task at L
    whatever a lease holds; the runs of one seed then spread over more leases."""

    def eval_forwards(self) -> float:
        """An upper bound on a run's evaluation cost per evaluation mode, in forwards of one sequence at the
        longest length (``predicted_seconds``)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Settings(ModelSettings):
    """Part 1's settings: the model sizes and the corpus."""

    heldout_docs: int = 8
    eval_batch_tokens: int = 65536
    entropy_max_gib: float = 24.0
    """The entropy at a length is measured only where one layer's maps of one sequence, and their entropy,
    fit this (``entropy.measure.layer_memory_bytes``: 20 GiB at 16k with 8 heads; the maps are reduced one
    layer at a time)."""
    train_token_cap: int = 40_000_000
    file_cap: int | None = None

    @property
    def eval_doc_tokens(self) -> int:
        return max(self.eval_lengths)

    def eval_forwards(self) -> float:
        """Every held-out document at every length (shorter lengths cost less per token), doubled for the
        entropy and the model's save and reload."""
        return self.heldout_docs * len(self.eval_lengths) * 2


@dataclass(frozen=True)
class TaskSettings(ModelSettings):
    """Part 2's settings: the model sizes of part 1 and the tasks of the CPU retrieval study
    (``lengthgen.tasks``: the task vocabulary of 64 ids, 3 passkey digits, 2 MQAR key-value pairs, BOS)."""

    weight_decay: float = 0.01
    """``lengthgen.tasks.TASK_WEIGHT_DECAY``, as the CPU retrieval study."""
    task_vocab_size: int = 64
    passkey_digits: int = 3
    num_kv_pairs: int = 2
    eval_samples: int = 32
    """Sequences per evaluation length (the same for every run: the stream of ``eval_seed`` and the
    length)."""
    eval_seed: int = 0
    eval_memory_gib: float = 40.0
    """``lengthgen.retrieval.eval_batch_size``'s memory for one evaluation batch."""
    min_steps: int = TASK_STEPS["mqar"]
    """MQAR's calibrated step count (``lengthgen.arguments.TASK_STEPS``; passkey then trains 400, the first
    750 of MQAR's on the copy warm-up). A CPU pilot at L = 512
    (``docs/results/gpu-study/pilot-mqar-cpu.json``, a 0.8M-parameter model) learned neither the copy
    warm-up nor MQAR in the 230 steps that one lease's budget would give."""

    def eval_forwards(self) -> float:
        """``eval_samples`` sequences at each length; a length costs at least twice its half, so all lengths
        together cost at most twice the longest."""
        return self.eval_samples * 2


DRY_SETTINGS = Settings(train_length=32, eval_lengths=(32, 64, 128, 256, 512, 1024), hidden_size=64,
                        num_hidden_layers=4, num_attention_heads=4, attention_key_size=32, batch_size=8,
                        dtype="fp32", heldout_docs=2, eval_batch_tokens=2048, entropy_max_gib=0.01,
                        train_token_cap=60_000, file_cap=120, size_tolerance=0.25,
                        timing_steps=2, timing_warmup=1, max_steps=4)
"""The dry run's sizes: the same steps on CPU in well under a minute (fp32: CPU autocast to bf16 is slow)."""
DRY_TASK_SETTINGS = TaskSettings(train_length=16, eval_lengths=(16, 32, 64, 128, 256, 512), hidden_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, attention_key_size=32,
                                 batch_size=8, dtype="fp32", eval_samples=2, eval_memory_gib=0.25,
                                 size_tolerance=0.25, timing_steps=2, timing_warmup=1, max_steps=4)
"""Part 2's dry run: L = 16 (the shortest that holds an example of each task), to 32×; 2 layers (18 runs,
not 9, in about the time of part 1's)."""


# ---------------------------------------------------------------------------------------------- files
def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(data: Any) -> str:
    return sha256_text(json.dumps(data, sort_keys=True, default=str))


def append_run(path: Path, record: dict[str, Any]) -> None:
    """One finished run as one line, flushed to disk before the next run starts."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_runs(paths: Sequence[Path], part: int | None = 1) -> list[dict[str, Any]]:
    """Every run of ``part`` (``None``: of both) in the given ``.jsonl`` files (folders: their ``*.jsonl``);
    a torn last line is skipped."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.jsonl")) if path.is_dir() else [path] if path.exists() else []
    runs = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                if line.strip():
                    runs.append(json.loads(line))
    return [run for run in runs if part is None or run.get("part", 1) == part]


def check_runs_files(paths: Sequence[Path], flag: str) -> None:
    """``UsageError`` naming ``flag`` when a file among ``paths`` (folders: their ``*.jsonl``) is not a runs
    file: every complete line must be a run (a JSON object with its ``fingerprint``); only a last line
    without its newline (torn by a stopped run) may be anything."""
    for path in paths:
        for file in sorted(path.glob("*.jsonl")) if path.is_dir() else [path] if path.is_file() else []:
            try:
                lines = file.read_text(encoding="utf-8").split("\n")[:-1]  # the last: torn or empty
            except (OSError, UnicodeDecodeError) as error:
                raise UsageError(flag, f"{str(file)!r} cannot be read as a runs file ({error})") from None
            for number, line in enumerate(lines, 1):
                try:
                    record = json.loads(line) if line.strip() else {"fingerprint": ""}
                except json.JSONDecodeError:
                    record = None
                if not isinstance(record, dict) or "fingerprint" not in record:
                    raise UsageError(flag, f"{str(file)!r} line {number} is not a run (a JSON object with "
                                           "its fingerprint): not a runs file")


def log(message: str) -> None:
    print(f"gpu-study: {message}", flush=True)


# ---------------------------------------------------------------------------------------------- corpus
@dataclass
class Corpus:
    train: torch.Tensor
    """All training tokens, documents concatenated (int32)."""
    heldout: torch.Tensor
    """The held-out documents' first ``eval_doc_tokens`` tokens each, concatenated."""
    info: dict[str, Any] = field(default_factory=dict)


def corpus_sources(file_cap: int | None) -> list[tuple[str, Path]]:
    """(name, path) of every corpus file in order: the standard library's ``.py`` files, then the
    ``transformers`` package's (sorted paths; no ``site-packages`` or ``__pycache__`` of the standard
    library). ``file_cap``: the first N only (the dry run)."""
    import transformers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    package = Path(transformers.__file__).parent
    found: list[tuple[str, Path]] = []
    for prefix, root in (("stdlib", stdlib), ("transformers", package)):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if "site-packages" in parts or "__pycache__" in parts or "dist-packages" in parts:
                continue
            found.append((f"{prefix}/{'/'.join(parts)}", path))
            if file_cap is not None and len(found) >= file_cap:
                return found
    return found


DATA_TABLE_SHARE = 0.5
"""A file at least this share of whose code lines are table entries is data, not code: it may train but is
never held out. In the standard library (3.11 and 3.12) that is ``pydoc_data/topics.py``,
``html/entities.py``, ``locale.py``'s alias table and ``_sysconfigdata_*.py`` (1.00, 1.00, 0.66, 1.00); the
next file scores 0.43, most code 0–0.2."""

TABLE_ENTRY = re.compile(r"""^\s*(?:[rbuRBU]?['"]|[-+]?(?:0x)?\d)""")
"""A line that starts with a string or number literal: an entry of a dict or list literal."""
TABLE_ASSIGNMENT = re.compile(
    r"""^\s*[A-Za-z_][\w.]*\s*=\s*(?:[rbuRBU]?'[^']*'|[rbuRBU]?"[^"]*"|[-+]?[\w.]+)\s*,?\s*(?:#.*)?$""")
"""``NAME = atom``: a literal, a name or a dotted name, nothing computed."""


def table_share(text: str) -> float:
    """The share of ``text``'s code lines (not blank, not a comment) that are table entries
    (``TABLE_ENTRY`` or ``TABLE_ASSIGNMENT``): 1.0 for a generated table, about 0.1 for code."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    entries = sum(bool(TABLE_ENTRY.match(line) or TABLE_ASSIGNMENT.match(line)) for line in lines)
    return entries / max(len(lines), 1)


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the tokenizer's vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return fingerprint({"vocab": vocab, "special": tokenizer.all_special_tokens,
                        "class": type(tokenizer).__name__})


def build_corpus(settings: Settings, tokenizer: Any) -> Corpus:
    """The corpus of ``settings`` (deterministic for one Python installation; see the module's docstring)."""
    started = time.perf_counter()
    sources = corpus_sources(settings.file_cap)
    digest = hashlib.sha256()
    need = settings.eval_doc_tokens
    train: list[torch.Tensor] = []
    heldout: list[str] = []
    held: list[torch.Tensor] = []
    train_tokens = long_docs = 0
    for start in range(0, len(sources), 64):
        chunk = sources[start:start + 64]
        texts = [path.read_text(encoding="utf-8", errors="replace") for _, path in chunk]
        ids = tokenizer(texts, return_attention_mask=False)["input_ids"]
        for (name, _), text, row in zip(chunk, texts, ids):
            digest.update(name.encode() + b"\0" + text.encode("utf-8", errors="replace") + b"\0")
            if len(row) >= need and table_share(text) < DATA_TABLE_SHARE:
                long_docs += 1
                if long_docs % 3 == 1 and len(heldout) < settings.heldout_docs:
                    heldout.append(name)
                    held.append(torch.tensor(row[:need], dtype=torch.int32))
                    continue
            if train_tokens < settings.train_token_cap:
                train.append(torch.tensor(row, dtype=torch.int32))
                train_tokens += len(row)
    if len(held) < settings.heldout_docs:
        raise RuntimeError(f"the corpus holds {len(held)} documents of at least {need} tokens, "
                           f"{settings.heldout_docs} are needed for evaluation")
    train_ids = torch.cat(train)[:settings.train_token_cap]
    digest.update(f"heldout={heldout};need={need};cap={settings.train_token_cap}".encode())
    import transformers

    info = {"sha256": digest.hexdigest(), "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "tokenizer": f"embedded WordPiece, {len(tokenizer)} ids (hf_attn_variants.training.embedded_"
                         "tokenizer, as the CPU study)",
            "sources": f"Python {sys.version.split()[0]} standard library *.py, then transformers "
                       f"{transformers.__version__}'s *.py, sorted paths",
            "python": sys.version.split()[0], "transformers": transformers.__version__,
            "files": len(sources), "train_tokens": int(train_ids.numel()),
            "heldout_documents": heldout, "heldout_tokens_each": need,
            "heldout_rule": f"every third document of at least {need} tokens whose table share is below "
                            f"{DATA_TABLE_SHARE} (code, not data tables)",
            "seconds": round(time.perf_counter() - started, 1)}
    return Corpus(train_ids, torch.cat(held), info)


# ---------------------------------------------------------------------------------------------- variants
@dataclass
class Planned:
    """One variant at the study's size: its ``lengthgen`` variant, config fields and parameter counts."""

    name: str
    variant: Any
    fields: dict[str, Any]
    parameters: dict[str, int]


def model_size(settings: ModelSettings, intermediate_size: int | None = None) -> Any:
    from hf_attn_variants.lengthgen.variants import ModelSize

    return ModelSize(hidden_size=settings.hidden_size, num_hidden_layers=settings.num_hidden_layers,
                     num_attention_heads=settings.num_attention_heads, intermediate_size=intermediate_size,
                     attention_key_size=settings.attention_key_size,
                     gau_layer_factor=settings.gau_layer_factor, hidden_dropout_prob=0.0)


def lengthgen_variant(name: str) -> Any:
    from hf_attn_variants.lengthgen.variants import get_variant, with_position

    base, _, scheme = name.partition("+")
    return with_position(get_variant(base), scheme or "rope")


def build_model(variant: Any, fields: dict[str, Any], tokenizer: Any, train_length: int) -> Any:
    """The causal LM of ``variant`` with ``fields``, as ``lengthgen`` builds it for ``training.pretrain``;
    with a task vocabulary size for ``tokenizer`` (part 2), as ``lengthgen.retrieval.build_model`` does."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hf_attn_variants.lengthgen.retrieval import task_config
    from hf_attn_variants.training import build_config

    if isinstance(tokenizer, int):
        config = task_config(variant, fields, tokenizer)
        if variant.model_type == "llama":
            config._attn_implementation = "sdpa"
    elif variant.model_type == "llama":
        config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                             **fields)
    else:
        config = build_config(variant.model_type, config_overrides=dict(fields), tokenizer=tokenizer,
                              max_seq_length=train_length)
    return AutoModelForCausalLM.from_config(config)


def count_parameters(variant: Any, fields: dict[str, Any], tokenizer: Any,
                     train_length: int) -> dict[str, int]:
    with torch.device("meta"):
        model = build_model(variant, fields, tokenizer, train_length)
    return {"total": model.num_parameters(), "non_embedding": model.num_parameters(exclude_embeddings=True)}


def plan_variants(settings: ModelSettings, tokenizer: Any,
                  names: Sequence[str] | None = None) -> list[Planned]:
    """Every variant of ``VARIANTS`` (or ``names``) at the study's size. GAU layers hold fewer parameters than
    attention + FFN layers: GAU gets ``gau_layer_factor`` × the layers (as ``lengthgen``), and the FFN width
    of the multi-head families (and the Llama's SwiGLU from it) is set, in steps of 64, to the width that
    brings their non-embedding parameters nearest GAU softmax_plus's. ``RuntimeError`` when a variant ends
    more than ``size_tolerance`` (5 %; the dry run's tiny sizes 25 %) from the mean."""
    from hf_attn_variants.lengthgen.variants import config_fields

    length = settings.train_length
    gau = lengthgen_variant("gau_softmax_plus")
    target = count_parameters(gau, config_fields(gau, model_size(settings), length), tokenizer,
                              length)["non_embedding"]
    ei = lengthgen_variant("ei_standard")

    def distance(ffn: int) -> int:
        fields = config_fields(ei, model_size(settings, ffn), length)
        return abs(count_parameters(ei, fields, tokenizer, length)["non_embedding"] - target)

    best = min(range(64, 8 * settings.hidden_size + 1, 64), key=distance)
    size = model_size(settings, best)
    planned = []
    for name, changes in VARIANTS:
        if names is not None and name not in names:
            continue
        variant = lengthgen_variant(name)
        fields = {**config_fields(variant, size, length), **changes}
        if "chunk_size" in changes:
            fields["chunk_size"] = min(changes["chunk_size"], max(4, length // 4))
        planned.append(Planned(name, variant, fields, count_parameters(variant, fields, tokenizer, length)))
    counts = [p.parameters["non_embedding"] for p in planned]
    mean = sum(counts) / len(counts)
    off = [p.name for p in planned if abs(p.parameters["non_embedding"] / mean - 1) > settings.size_tolerance]
    if off:
        raise RuntimeError(f"non-embedding parameters differ by more than {settings.size_tolerance:.0%} from "
                           f"the mean {mean:,.0f}: {off}")
    return planned


# ---------------------------------------------------------------------------------------------- train
class Device:
    """What ``training.evaluate_lm`` needs of an accelerator: the device, one process, and autocast."""

    process_index = 0
    num_processes = 1

    def __init__(self, device: torch.device, dtype: str) -> None:
        self.device = device
        self.dtype = dtype

    def autocast(self) -> Any:
        enabled = self.dtype == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)


Batch = tuple[torch.Tensor, torch.Tensor | None]
"""``(input_ids, labels)``; labels ``None``: the input ids (the language model)."""


def batches(stream: torch.Tensor, length: int, batch: int, seed: int) -> Iterator[Batch]:
    """Blocks of ``length`` tokens of the training stream in a seeded random order, epoch after epoch."""
    blocks = stream[: stream.numel() // length * length].view(-1, length)
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(blocks), generator=generator)
        for start in range(0, len(order) - batch + 1, batch):
            yield blocks[order[start:start + batch]].long(), None


def task_batches(settings: TaskSettings, task: str, seed: int, warmup: int) -> Iterator[Batch]:
    """Part 2's training stream: ``lengthgen.tasks.make_batch`` of the run's seed at L, the first ``warmup``
    batches on the copy warm-up (the stream ``lengthgen.retrieval.train_task_model`` trains on)."""
    from hf_attn_variants.lengthgen.tasks import COPY, make_batch

    spec, step = task_spec(settings, task), 0
    while True:
        made = make_batch(spec, settings.train_length, seed, step * settings.batch_size, settings.batch_size,
                          COPY if step < warmup else task)
        step += 1
        yield made["input_ids"], made["labels"]


@dataclass
class Trainer:
    """One model, its optimizer and schedule; ``step`` trains one batch and returns its loss."""

    model: Any
    device: Device
    steps: int
    learning_rate: float
    weight_decay: float
    warmup: int
    compiled: Any = None
    compile_error: str | None = None
    optimizer: Any = None
    done: int = 0

    def __post_init__(self) -> None:
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        fused = {"fused": True} if self.device.device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": self.weight_decay},
                                            {"params": rest, "weight_decay": 0.0}],
                                           lr=self.learning_rate, betas=(0.9, 0.95), **fused)

    def rate(self, step: int) -> float:
        if step < self.warmup:
            return self.learning_rate * (step + 1) / self.warmup
        left = max(1, self.steps - self.warmup)
        return self.learning_rate * (0.1 + 0.9 * max(0.0, 1 - (step - self.warmup) / left))

    def forward(self) -> Any:
        return self.compiled if self.compiled is not None else self.model

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """One optimizer step; its loss, left on the device (reading it each step would wait for the GPU)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.rate(self.done)
        input_ids = input_ids.to(self.device.device, non_blocking=True)
        labels = input_ids if labels is None else labels.to(self.device.device, non_blocking=True)
        with self.device.autocast():
            loss = self.forward()(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.done += 1
        return loss.detach()


STALE_CONFIG_BELOW = (2, 11)
"""Below this torch, dynamo guards no attribute read from a Transformers config (seen on 2.7; 2.8 to 2.10 not
run). Our families read their fields when built, but Transformers' models read some in ``forward``
(``_attn_implementation``, the output flags), and a variant compiled after another could keep those: so
``new_trainer`` clears the compiled code first there; 2.11 (the device's) needs nothing."""


def new_trainer(planned: Planned, settings: ModelSettings, tokenizer: Any, device: Device, steps: int,
                seed: int, compile_model: bool) -> Trainer:
    from transformers import set_seed

    set_seed(seed)
    model = build_model(planned.variant, planned.fields, tokenizer, settings.train_length).to(device.device)
    model.train()
    trainer = Trainer(model, device, steps, settings.learning_rate, settings.weight_decay,
                      max(1, int(steps * settings.warmup_fraction)))
    if compile_model:
        if version_tuple(torch.__version__) < STALE_CONFIG_BELOW:
            torch.compiler.reset()  # else its compiled forward may keep the last one's config reads
        try:
            trainer.compiled = torch.compile(model)
        except Exception as error:  # noqa: BLE001 - recorded, the run goes on eagerly
            trainer.compile_error = f"{type(error).__name__}: {error}"[:300]
    return trainer


def first_step(trainer: Trainer, batch: Batch) -> torch.Tensor:
    """The first step, compiled if it compiles; a compile failure falls back to eager (recorded)."""
    if trainer.compiled is None:
        return trainer.step(*batch)
    try:
        return trainer.step(*batch)
    except Exception as error:  # noqa: BLE001 - a variant that does not compile trains eagerly
        trainer.compile_error = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        trainer.compiled = None
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.done = 0
        return trainer.step(*batch)


def train_steps(trainer: Trainer, data: Iterator[Batch], steps: int) -> tuple[list[float], float]:
    """``steps`` training steps (the first compiling); their losses (read once, at the end) and seconds."""
    started = time.perf_counter()
    losses = [first_step(trainer, next(data))]
    for _ in range(steps - 1):
        losses.append(trainer.step(*next(data)))
    values = torch.stack(losses).float().tolist()  # waits for the last step, as synchronize would
    return values, time.perf_counter() - started


def loss_summary(losses: Sequence[float]) -> dict[str, Any]:
    every = max(1, len(losses) // 20)
    return {"final_train_loss": sum(losses[-10:]) / len(losses[-10:]),
            "loss_curve": [[i + 1, round(loss, 4)] for i, loss in enumerate(losses) if (i + 1) % every == 0]}


def synchronize(device: Device) -> None:
    if device.device.type == "cuda":
        torch.cuda.synchronize()


def time_variant(planned: Planned, settings: ModelSettings, tokenizer: Any, data: Iterator[Batch],
                 block: torch.Tensor, device: Device, compile_model: bool) -> dict[str, Any]:
    """What a run of ``planned`` costs, in seconds:

    - ``first_setup_seconds``: building the model and compiling it, cold (``timing_warmup`` steps, less their
      share of ``seconds_per_step``); paid once per variant and process, here;
    - ``seconds_per_step``: ``timing_steps`` timed steps of ``data``;
    - ``setup_seconds``: what each run pays (a second model built and its first step taken, less a step):
      the compiled code and the kernels are then cached in this process, as they are for the runs;
    - ``eval_forward_seconds``: one evaluation forward of ``block`` (one sequence at the longest length),
      timed after a first one that warms its kernels (they are compiled once, not per forward).
    """
    warmup, steps = settings.timing_warmup, settings.timing_steps
    started = time.perf_counter()
    trainer = new_trainer(planned, settings, tokenizer, device, 1000, 0, compile_model)
    train_steps(trainer, data, warmup)
    warm = time.perf_counter() - started
    _, timed = train_steps(trainer, data, steps)
    per_step = timed / steps
    compiled, compile_error = trainer.compiled is not None, trainer.compile_error
    del trainer
    free_memory(device)
    again = time.perf_counter()
    trainer = new_trainer(planned, settings, tokenizer, device, 1000, 1, compile_model)
    train_steps(trainer, data, 1)
    run_setup = time.perf_counter() - again - per_step
    trainer.model.eval()
    block = block.long().view(1, -1).to(device.device)
    with torch.no_grad(), device.autocast():
        for _ in range(2):  # the second is timed: the first compiles the kernels this length needs
            forward = time.perf_counter()
            trainer.model(input_ids=block).logits.float()
            synchronize(device)
            eval_forward = time.perf_counter() - forward
    result = {"seconds_per_step": per_step, "first_setup_seconds": max(0.0, warm - warmup * per_step),
              "setup_seconds": max(0.0, run_setup), "eval_forward_seconds": eval_forward,
              "compiled": compiled, "compile_error": compile_error}
    del trainer
    free_memory(device)
    return result


def free_memory(device: Device) -> None:
    import gc

    gc.collect()
    if device.device.type == "cuda":
        torch.cuda.empty_cache()


def predicted_seconds(timing: dict[str, Any], steps: float, settings: ModelSettings, modes: int) -> float:
    """A run's predicted seconds: set-up and compile as timed, the steps, and evaluation bounded by
    ``settings.eval_forwards()`` forwards at the longest length per evaluation mode."""
    evaluation = timing["eval_forward_seconds"] * settings.eval_forwards() * modes
    return timing["setup_seconds"] + steps * timing["seconds_per_step"] + evaluation + 2.0


def choose_steps(timings: dict[str, dict[str, Any]], planned: Sequence[Planned], settings: ModelSettings,
                 budget: float, fractions: Sequence[float] = (1.0,)) -> int:
    """The most steps for which one seed of every variant fits ``budget`` seconds: one run per variant and
    entry of ``fractions``, each training that fraction of the steps (part 2: passkey and MQAR); 0 when
    set-up and evaluation alone fill it (the caller then trains its floor, and says so)."""
    fixed = seed_seconds(timings, planned, settings, 0, fractions)
    per_step = seed_seconds(timings, planned, settings, 1, fractions) - fixed
    return max(0, int((budget - fixed) / per_step))


def task_share(task: str) -> float:
    """``task``'s steps per MQAR step: the ratio of ``lengthgen``'s calibrated defaults (``TASK_STEPS``:
    passkey 400 to MQAR's 1,500)."""
    return TASK_STEPS[task] / TASK_STEPS["mqar"]


def part_fractions(part: int) -> list[float]:
    """Each run of a variant's share of the step count: part 1 one run; part 2 a run per task
    (``task_share``)."""
    return [1.0] if part == 1 else [task_share(task) for task in TASKS]


def seed_seconds(timings: dict[str, dict[str, Any]], planned: Sequence[Planned], settings: ModelSettings,
                 steps: float, fractions: Sequence[float] = (1.0,)) -> float:
    """The predicted seconds of one seed of every variant (and entry of ``fractions``) at ``steps``."""
    return sum(predicted_seconds(timings[p.name], steps * fraction, settings, len(p.variant.eval_modes))
               for p in planned for fraction in fractions)


# ---------------------------------------------------------------------------------------------- run
def run_fingerprint(planned: Planned, seed: int, settings: ModelSettings, steps: int,
                    corpus: dict[str, Any], task: str | None = None) -> str:
    """sha256 over the variant, the seed, the settings (sizes, config, steps, L, evaluation lengths, dtype)
    and the sha256 of the corpus (part 2: of the task examples) and of the tokenizer (part 2: of the task
    vocabulary); part 2's also over its task."""
    return fingerprint({"version": FORMAT_VERSION, "variant": planned.name, "seed": seed,
                        "fields": planned.fields, "settings": asdict(settings), "steps": steps,
                        "corpus_sha256": corpus["sha256"], "tokenizer_sha256": corpus["tokenizer_sha256"],
                        **({"task": task} if task is not None else {})})


def base_fingerprint(settings: ModelSettings, corpus: dict[str, Any]) -> str:
    """What pins the step count: the settings and the corpus and tokenizer (not the variant or seed)."""
    return fingerprint({"version": FORMAT_VERSION, "settings": asdict(settings),
                        "corpus_sha256": corpus["sha256"], "tokenizer_sha256": corpus["tokenizer_sha256"]})


def pending(planned: Sequence[Planned], seeds: Sequence[int], settings: ModelSettings, steps: int,
            corpus: dict[str, Any], done: Sequence[dict[str, Any]],
            tasks: Sequence[str | None] = (None,)) -> tuple[list[tuple[Planned, int, str | None]], int, str]:
    """The (variant, seed, task) runs still to do, seed by seed (part 1: task ``None``); how many were
    skipped as done; and a sentence on why runs that exist were not skipped (different fingerprints: corpus,
    tokenizer or settings)."""
    finished = {run["fingerprint"] for run in done}
    todo, skipped, current = [], 0, set()
    for seed in seeds:
        for task in tasks:
            for plan in planned:
                key = run_fingerprint(plan, seed, settings, steps, corpus, task)
                current.add(key)
                if key in finished:
                    skipped += 1
                else:
                    todo.append((plan, seed, task))
    other = [run for run in done if run["fingerprint"] not in current]
    reasons = sorted({why_different(run, settings, corpus) for run in other})
    note = (f"{len(other)} earlier run(s) not reused: " + "; ".join(reasons)) if other else ""
    return todo, skipped, note


def why_different(run: dict[str, Any], settings: ModelSettings, corpus: dict[str, Any]) -> str:
    if run.get("corpus", {}).get("sha256") != corpus["sha256"]:
        return (f"a different corpus (sha256 {str(run.get('corpus', {}).get('sha256'))[:12]}… from Python "
                f"{run.get('corpus', {}).get('python')}, this one {corpus['sha256'][:12]}… from Python "
                f"{corpus['python']})")
    if run.get("corpus", {}).get("tokenizer_sha256") != corpus["tokenizer_sha256"]:
        return "a different tokenizer"
    if run.get("settings") != json.loads(json.dumps(asdict(settings))):
        return "different settings"
    return "a different step count or variant config"


def evaluate(model_dir: Path, planned: Planned, settings: Settings, tokenizer: Any, corpus: Corpus,
             device: Device) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Perplexity at every evaluation length in every evaluation mode of the variant (``load_for_eval``),
    and the attention entropy against log n where the attention maps fit."""
    from hf_attn_variants.lengthgen.evaluation import evaluate_at_lengths
    from hf_attn_variants.lengthgen.study import RunPlan, load_for_eval

    plan = RunPlan(planned.variant, 0, "clm", planned.fields, model_dir.parent, "", "")
    stream = corpus.heldout.tolist()
    rows = []
    for mode in planned.variant.eval_modes:
        model = load_for_eval(plan, mode).to(device.device)
        for length in settings.eval_lengths:
            batch = max(1, settings.eval_batch_tokens // length)
            for point in evaluate_at_lengths(model, stream, [length], objective="clm",
                                             train_length=settings.train_length, batch_size=batch,
                                             accelerator=device):
                rows.append({"series": planned.variant.series(mode), "mode": mode.name,
                             **{k: v for k, v in point.items()}})
        del model
        free_memory(device)
    return rows, measure_entropy(plan, settings, corpus, device)


FLASH_ENTROPY = ("not defined: FLASH's effective weights, relu(q·k)² inside a chunk plus q′·k′ across chunks "
                 "(factors folded into the queries), are not a distribution: q′·k′ takes both signs")
"""Why FLASH has no entropy against log n: its rows are not probabilities, normalised or not."""


def measure_entropy(plan: Any, settings: Settings, corpus: Corpus, device: Device) -> dict[str, Any]:
    """``entropy.measure.entropy_by_length`` of the model as saved (eager attention), one held-out sequence
    per length, at the lengths where one layer's attention maps fit ``entropy_max_gib``
    (``layer_memory_bytes``)."""
    from transformers import AutoModelForCausalLM

    from hf_attn_variants.entropy.cli import normalizes_rows
    from hf_attn_variants.entropy.measure import entropy_by_length, layer_memory_bytes
    from hf_attn_variants.lengthgen.retrieval import attention_heads

    if plan.fields.get("chunk_size") is not None:
        return {"status": FLASH_ENTROPY}
    try:
        model = AutoModelForCausalLM.from_pretrained(plan.model_dir, attn_implementation="eager").eval()
        model = model.to(device.device)
        config = model.config
        lengths = [n for n in settings.eval_lengths
                   if layer_memory_bytes(n, attention_heads(config)) / 2**30 <= settings.entropy_max_gib]
        skipped = [n for n in settings.eval_lengths if n not in lengths]
        if not lengths:
            return {"status": "skipped: no length's attention maps fit entropy_max_gib", "skipped": skipped}

        def sequences(length: int) -> list[torch.Tensor]:
            return [corpus.heldout[:length].long().view(1, -1).to(device.device)]

        with device.autocast():
            points = entropy_by_length(model, sequences, lengths, causal=True,
                                       normalize=normalizes_rows(config))
        del model
        free_memory(device)
        if not all(math.isfinite(p.mean_entropy) for p in points):
            return {"status": "not measured: the attention maps returned are not probabilities (non-finite "
                              "entropy)"}
        return {"status": "ok", "skipped_lengths": skipped,
                "points": [{"length": p.length, "log_keys": p.log_keys, "mean_entropy": p.mean_entropy,
                            "uniform": p.log_keys} for p in points]}  # a uniform row's H is log nᵢ
    except Exception as error:  # noqa: BLE001 - recorded; perplexity stands without it
        return {"status": f"not measured: {type(error).__name__}: {str(error).splitlines()[0][:200]}"}


def train_and_evaluate(planned: Planned, seed: int, settings: Settings, steps: int, tokenizer: Any,
                       corpus: Corpus, device: Device, compile_model: bool) -> dict[str, Any]:
    """One run: train ``steps`` steps, save to a scratch folder, evaluate, measure the entropy."""
    started = time.perf_counter()
    trainer = new_trainer(planned, settings, tokenizer, device, steps, seed, compile_model)
    data = batches(corpus.train, settings.train_length, settings.batch_size, seed)
    losses, train_seconds = train_steps(trainer, data, steps)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        trainer.model.save_pretrained(model_dir)
        compiled, compile_error = trainer.compiled is not None, trainer.compile_error
        del trainer
        free_memory(device)
        rows, entropy = evaluate(model_dir, planned, settings, tokenizer, corpus, device)
    return {"train_seconds": round(train_seconds, 2), "seconds": round(time.perf_counter() - started, 2),
            "compiled": compiled, "compile_error": compile_error, **loss_summary(losses),
            "rows": rows, "entropy": entropy}


# ---------------------------------------------------------------------------------------------- part 2
def task_spec(settings: TaskSettings, task: str) -> Any:
    """The ``lengthgen.tasks.TaskSpec`` of ``task`` under ``settings``."""
    from hf_attn_variants.lengthgen.tasks import TaskSpec

    return TaskSpec(task, settings.task_vocab_size, settings.passkey_digits, settings.num_kv_pairs, True)


def task_steps(steps: int, task: str) -> tuple[int, int]:
    """(training steps, the first of them on the copy warm-up) of ``task`` when MQAR trains ``steps``: its
    ``task_share`` of them and ``lengthgen``'s copy warm-up rule (``TASK_COPY_WARMUP``: MQAR 750, at most half
    the steps; passkey none)."""
    count = steps if task == "mqar" else max(1, round(steps * task_share(task)))
    return count, min(TASK_COPY_WARMUP[task], count // 2)


def task_data(settings: TaskSettings) -> dict[str, Any]:
    """What stands for part 1's corpus in part 2's fingerprints: the sha256 of generated examples (the first
    training batch of each task and of the copy warm-up, the first evaluation batch at L) and of the task
    vocabularies."""
    from hf_attn_variants.lengthgen.retrieval import EVAL_STREAM
    from hf_attn_variants.lengthgen.tasks import COPY, make_batch

    digest, length, vocab = hashlib.sha256(), settings.train_length, {}
    for task in TASKS:
        spec = task_spec(settings, task)
        vocab[task] = asdict(spec.vocab)
        for kind, seed in ((task, 0), (COPY, 0), (task, settings.eval_seed * EVAL_STREAM + length)):
            digest.update(make_batch(spec, length, seed, 0, 4, kind)["input_ids"].numpy().tobytes())
    return {"sha256": digest.hexdigest(), "tokenizer_sha256": fingerprint(vocab),
            "tokenizer": f"the tasks' vocabulary of {settings.task_vocab_size} ids "
                         "(lengthgen.tasks.vocabulary)",
            "sources": "passkey and MQAR examples generated from seeds (lengthgen.tasks.make_batch)",
            "python": sys.version.split()[0], "vocabulary": vocab}


class OnDevice:
    """A model on the device for ``lengthgen.retrieval.evaluate_task_run``, which feeds CPU tensors and
    compares the logits with them: inputs go to the device, the logits come back in fp32 on the CPU (the
    task vocabulary is small); every other attribute is the model's (``config``, ``set_attn_implementation``
    for the Llama's evaluation modes)."""

    def __init__(self, model: Any, device: Device) -> None:
        self.model = model
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, input_ids: torch.Tensor) -> Any:
        from types import SimpleNamespace

        with torch.no_grad(), self.device.autocast():
            logits = self.model(input_ids=input_ids.to(self.device.device)).logits
        return SimpleNamespace(logits=logits.float().cpu())


def train_and_evaluate_task(planned: Planned, seed: int, task: str, settings: TaskSettings, steps: int,
                            device: Device, compile_model: bool) -> dict[str, Any]:
    """One part-2 run: train on ``task`` (MQAR: the copy warm-up first) and evaluate the task metrics at
    every length in every evaluation mode (``lengthgen.retrieval.evaluate_task_run``)."""
    from types import SimpleNamespace

    from hf_attn_variants.lengthgen.retrieval import TaskRunPlan, evaluate_task_run

    started = time.perf_counter()
    count, warmup = task_steps(steps, task)
    trainer = new_trainer(planned, settings, settings.task_vocab_size, device, count, seed, compile_model)
    losses, train_seconds = train_steps(trainer, task_batches(settings, task, seed, warmup), count)
    model, compiled, compile_error = trainer.model.eval(), trainer.compiled is not None, trainer.compile_error
    del trainer
    free_memory(device)
    args = SimpleNamespace(task=task, train_length=settings.train_length, eval_lengths=settings.eval_lengths,
                           eval_samples=settings.eval_samples, eval_seed=settings.eval_seed,
                           eval_memory_gib=settings.eval_memory_gib)
    plan = TaskRunPlan(planned.variant, seed, planned.fields, Path(), "")
    rows = evaluate_task_run(OnDevice(model, device), plan, task_spec(settings, task), args)
    del model
    free_memory(device)
    return {"task_steps": count, "copy_warmup_steps": warmup, "train_seconds": round(train_seconds, 2),
            "seconds": round(time.perf_counter() - started, 2), "compiled": compiled,
            "compile_error": compile_error, **loss_summary(losses), "rows": rows}


@dataclass
class Options:
    out: Path
    dry_run: bool = False
    budget: float = 360.0
    deadline: float = 540.0
    seeds: tuple[int, ...] = (0, 1, 2)
    committed: Path = COMMITTED
    variants: tuple[str, ...] | None = None
    compile: str = "auto"
    retime: bool = False
    steps: int | None = None
    part: int = 1


def parse_part(value: str | int) -> int:
    """``--part``: 1 (the language model) or 2 (retrieval); ``UsageError`` naming the flag otherwise."""
    if str(value) not in ("1", "2"):
        raise UsageError("--part", f"must be 1 (the language model) or 2 (retrieval: passkey and MQAR), "
                         f"got {value!r}")
    return int(value)


def check_options(options: Options) -> None:
    """``UsageError`` naming the flag of the first bad value."""
    parse_part(options.part)
    if options.out.exists() and not options.out.is_dir():
        raise UsageError("--out", f"{str(options.out)!r} is a file, not a folder")
    if not math.isfinite(options.budget) or options.budget <= 0:
        raise UsageError("--budget", f"must be a positive number of seconds, got {options.budget:g}")
    if not math.isfinite(options.deadline) or not 0 < options.deadline < COMMAND_LIMIT_S:
        raise UsageError("--deadline", f"must be between 0 and {COMMAND_LIMIT_S:.0f} seconds (a lease's "
                         f"limit on one command), got {options.deadline:g}")
    if not options.seeds or len(set(options.seeds)) != len(options.seeds) or min(options.seeds) < 0:
        raise UsageError("--seeds", f"must be distinct non-negative integers, got {list(options.seeds)}")
    names = [name for name, _ in VARIANTS]
    for name in options.variants or ():
        if name not in names:
            raise UsageError("--variants", f"unknown variant {name!r}; allowed: {names}")
    if options.steps is not None and options.steps < 1:
        raise UsageError("--steps", f"must be at least 1, got {options.steps}")
    if options.compile not in ("auto", "yes", "no"):
        raise UsageError("--compile", f"must be auto, yes or no, got {options.compile!r}")
    entries = sorted(entry.name for entry in options.out.iterdir()) if options.out.is_dir() else []
    ours = {name for f in FILES.values() for name in (f.runs, f.plan, f.results, f.plot, f.log)}
    if entries and not ours & set(entries):  # a user's folder, not a lease's (or an earlier run's) output
        raise UsageError("--out", f"{str(options.out)!r} holds other files ({', '.join(entries[:5])}); "
                         "name a new folder or an earlier run's")


def run(options: Options) -> int:
    """One lease's work (the module's docstring, ``run``)."""
    from hf_attn_variants.training import embedded_tokenizer

    started = time.monotonic() - since_command_start()
    check_options(options)
    options.out.mkdir(parents=True, exist_ok=True)
    part, files = options.part, FILES[options.part]
    settings: ModelSettings = part_settings(part, options.dry_run)
    cuda = torch.cuda.is_available() and not options.dry_run
    if not cuda and not options.dry_run:
        log("no CUDA device: running on CPU at the full sizes (use --dry-run for the tiny ones)")
    device = Device(torch.device("cuda" if cuda else "cpu"),
                    settings.dtype if cuda or options.dry_run else "fp32")
    compile_model = options.compile == "yes" or (options.compile == "auto" and cuda)
    if compile_model:
        # Every model of this package's families enters through one frame (``compat.accepts_cache_alias``'s
        # wrapper of the shared forwards, as Transformers' ``can_return_tuple`` is one frame for its models),
        # and dynamo keeps at most ``recompile_limit`` (8) compiled versions of a frame: the 8 variants of our
        # families fill it exactly (TORCH_LOGS=recompiles on a dry run), and a ninth config would train
        # eagerly without an error.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    corpus: Corpus | None = None
    tasks: list[str | None] = [None]
    if isinstance(settings, Settings):
        tokenizer: Any = embedded_tokenizer()
        corpus = build_corpus(settings, tokenizer)
        info = corpus.info
        log(f"corpus: {info['train_tokens']:,} training tokens, {len(info['heldout_documents'])} held-out "
            f"documents of {settings.eval_doc_tokens:,} tokens, sha256 {info['sha256'][:16]}…, "
            f"{info['seconds']} s")
    else:
        tokenizer, info, tasks = settings.task_vocab_size, task_data(settings), list(TASKS)
        log(f"tasks {', '.join(TASKS)}: examples generated from seeds, sha256 {info['sha256'][:16]}…")
    planned = plan_variants(settings, tokenizer, options.variants)
    for p in planned:
        log(f"variant {p.name}: {p.parameters['non_embedding']:,} non-embedding parameters")
    plan_path = options.out / files.plan
    runs_path = options.out / files.runs
    done = read_runs([options.committed, runs_path], part)
    base = base_fingerprint(settings, info)
    pinned = pinned_steps(done, base)
    report: dict[str, Any] = {
        "kind": "gpu_study", "format": FORMAT_VERSION, "part": part, "dry_run": options.dry_run,
        "command": "bash scripts/gpu_study.sh" + (" --dry-run" if options.dry_run else "")
                   + (f" --part {part}" if part != 1 else ""),
        "machine": machine(), "settings": asdict(settings), "corpus": info, "tasks": tasks,
        "base_fingerprint": base, "budget_s": options.budget, "deadline_s": options.deadline,
        "variants": [{"name": p.name, "model_type": p.variant.model_type,
                      "description": p.variant.description,
                      "fields": p.fields, "parameters": p.parameters} for p in planned],
    }
    gpu = machine().get("gpu")  # None on a CPU: nothing committed is reused there
    carried = {} if options.retime else committed_timings(options.committed, part, base, gpu)
    timings = {p.name: carried[p.name] for p in planned
               if p.name in carried and carried[p.name].get("timed_as") == timed_as(p, compile_model)}
    report["timing_committed"] = sorted(timings)  # timed by an earlier lease on this GPU, not again
    report["timing"] = timings  # filled as each variant is timed
    warm: set[str] = set()  # variants built (and compiled) in this process
    if options.steps is not None:
        steps, how = options.steps, "--steps"
    elif pinned is not None and not options.retime:
        steps = pinned
        how = "pinned by earlier runs (committed or in --out) of the same corpus, tokenizer and settings"
    else:
        longest = 0.0
        for p in planned:
            if p.name in timings:
                continue
            if time.monotonic() - started + longest + 5 > options.deadline:
                report["timing_stopped"] = (f"{time.monotonic() - started:.0f} s gone, the next timing is "
                                            f"predicted at {longest:.0f} s: stopped before {p.name}")
                atomic_write_json(plan_path, report)
                log(f"deadline: {report['timing_stopped']}; no run started, the next lease times again")
                return 1
            timed_at = time.monotonic()
            data, block = timing_data(settings, corpus)
            timing = time_variant(p, settings, tokenizer, data, block, device, compile_model)
            timings[p.name] = {**timing, "timed_as": timed_as(p, compile_model)}
            warm.add(p.name)
            longest = max(longest, time.monotonic() - timed_at)
            atomic_write_json(plan_path, report)  # a lease stopped while timing keeps what it measured
            log(f"timing {p.name}: {timing['seconds_per_step'] * 1000:.1f} ms a step, set-up "
                f"{timing['first_setup_seconds']:.1f} s cold, {timing['setup_seconds']:.1f} s a run, an "
                f"evaluation forward {timing['eval_forward_seconds']:.2f} s, compiled {timing['compiled']}")
        fractions = part_fractions(part)
        fitted = choose_steps(timings, planned, settings, options.budget, fractions)
        steps = max(fitted, settings.min_steps)
        report["fitted_steps"] = fitted
        how = f"timed: one seed of every variant in {options.budget:.0f} s"
        if fitted < settings.min_steps:
            budgets = seed_seconds(timings, planned, settings, steps, fractions) / options.budget
            how += (f", {fitted} steps, raised to the floor of {settings.min_steps} (one seed then takes "
                    f"{budgets:.1f} budgets)")
        if settings.max_steps is not None:
            steps = min(steps, settings.max_steps)
            how += f" (at most {settings.max_steps})"
    counts = {task: task_steps(steps, task) if task else (steps, 0) for task in tasks}
    tokens = {task: counts[task][0] * settings.batch_size * settings.train_length for task in tasks}
    if timings:
        report["predicted_seconds_per_seed"] = round(seed_seconds(timings, planned, settings, steps,
                                                                  part_fractions(part)), 1)
    report.update(steps=steps, steps_from=how,
                  tokens_per_run=tokens[None] if part == 1 else tokens,
                  tokens_per_parameter={f"{p.name}{'/' + task if task else ''}":
                                        round(tokens[task] / p.parameters["non_embedding"], 3)
                                        for task in tasks for p in planned})
    if part == 1:
        report["epochs"] = round(tokens[None] / info["train_tokens"], 3)
    else:
        report["task_steps"] = {task: {"steps": counts[task][0], "copy_warmup_steps": counts[task][1]}
                                for task in TASKS}
    todo, skipped, note = pending(planned, options.seeds, settings, steps, info, done, tasks)
    report.update(skipped_runs=skipped, not_reused=note, started_runs=[], finished_runs=[], failed_runs=[],
                  not_started=[])
    log(f"{steps} steps ({how}), " + ", ".join(f"{task or 'a run'}: {counts[task][0]} steps, "
                                               f"{tokens[task]:,} tokens" for task in tasks)
        + f"; {skipped} run(s) done earlier, skipped; {len(todo)} to do" + (f"; {note}" if note else ""))
    atomic_write_json(plan_path, report)
    failed = 0
    estimate = {(p.name, task): predicted_seconds(timings[p.name], counts[task][0], settings,
                                                  len(p.variant.eval_modes))
                for p in planned if p.name in timings for task in tasks}
    for index, (p, seed, task) in enumerate(todo):
        name = f"{p.name}{' ' + task if task else ''} seed {seed}"
        elapsed = time.monotonic() - started
        predicted = estimate.get((p.name, task), max(estimate.values(), default=0.0))
        if p.name not in warm and p.name in timings:  # its first run here builds and compiles it cold
            predicted += max(0.0, timings[p.name]["first_setup_seconds"] - timings[p.name]["setup_seconds"])
        if elapsed + predicted + 5 > options.deadline:
            report["not_started"] = [f"{q.name}{' ' + t if t else ''} seed {s}" for q, s, t in todo[index:]]
            log(f"deadline: {elapsed:.0f} s gone, {name} is predicted at {predicted:.0f} s; "
                f"{len(todo) - index} run(s) left for the next lease")
            break
        log(f"run {name}")
        report["started_runs"].append(name)
        try:
            compiles = compile_model and timings.get(p.name, {}).get("compile_error") is None  # not again
            if corpus is not None:
                result = train_and_evaluate(p, seed, cast(Settings, settings), steps, tokenizer, corpus,
                                            device, compiles)
            else:
                result = train_and_evaluate_task(p, seed, str(task), cast(TaskSettings, settings), steps,
                                                 device, compiles)
        except Exception as error:  # noqa: BLE001 - recorded; the next run goes on
            failed += 1
            report["failed_runs"].append({"run": name, "error": "".join(
                traceback.format_exception_only(error)).strip()[:800]})
            log(f"run {name} failed: {error}")
            free_memory(device)
            atomic_write_json(plan_path, report)
            continue
        warm.add(p.name)
        estimate[(p.name, task)] = max(estimate.get((p.name, task), 0.0), result["seconds"])
        diverged = not math.isfinite(result["final_train_loss"])  # seeded: a rerun diverges again
        if diverged:
            report.setdefault("diverged_runs", []).append(name)
            log(f"run {name} diverged (final training loss {result['final_train_loss']}): recorded as "
                "diverged, its verdicts not resolved")
        record = {"fingerprint": run_fingerprint(p, seed, settings, steps, info, task),
                  "base_fingerprint": base, "part": part, **({"task": task} if task else {}),
                  "variant": p.name, "seed": seed, "model_type": p.variant.model_type, "steps": steps,
                  "tokens": tokens[task], "parameters": p.parameters, "fields": p.fields,
                  "settings": asdict(settings), "corpus": info, "dry_run": options.dry_run,
                  "machine": report["machine"], "date": time.strftime("%Y-%m-%d"),
                  **({"diverged": True} if diverged else {}), **result}
        append_run(runs_path, record)
        report["finished_runs"].append(name)
        atomic_write_json(plan_path, report)
        log(f"run {name}: {result['seconds']:.0f} s, " + run_summary(result, settings))
    report["seconds"] = round(time.monotonic() - started, 1)
    atomic_write_json(plan_path, report)
    log(f"done in {report['seconds']} s: {len(report['finished_runs'])} run(s) finished, {failed} failed, "
        f"{len(report['not_started'])} left")
    return 1 if failed else 0


def part_settings(part: int, dry_run: bool) -> ModelSettings:
    if part == 1:
        return DRY_SETTINGS if dry_run else Settings()
    return DRY_TASK_SETTINGS if dry_run else TaskSettings()


def timing_data(settings: ModelSettings, corpus: Corpus | None) -> tuple[Iterator[Batch], torch.Tensor]:
    """The timing's training batches and its evaluation sequence at the longest length: the corpus's
    (part 1), or passkey examples (part 2: both tasks train the same model on sequences of L)."""
    if corpus is not None:
        return (batches(corpus.train, settings.train_length, settings.batch_size, 0),
                corpus.heldout[: max(settings.eval_lengths)])
    from hf_attn_variants.lengthgen.tasks import make_batch

    task_settings = cast(TaskSettings, settings)
    spec = task_spec(task_settings, "passkey")
    return (task_batches(task_settings, "passkey", 0, 0),
            make_batch(spec, max(settings.eval_lengths), 0, 0, 1)["input_ids"][0])


def run_summary(result: dict[str, Any], settings: ModelSettings) -> str:
    """The log's line on a finished run: perplexity (part 1) or accuracy (part 2) at L and the longest."""
    at = {row["length"]: row for row in result["rows"] if row["mode"] in ("default", "sdpa")}
    key, label = ("accuracy", "accuracy") if "task_steps" in result else ("perplexity", "perplexity")
    value = {n: f"{row[key]:.2f}" if row.get("status", "ok") == "ok" else "n/a" for n, row in at.items()}
    return f"{label} at L {value[settings.train_length]}, at {max(at)}: {value[max(at)]}"


def machine() -> dict[str, Any]:
    """``lengthgen``'s record of the machine and versions, and the GPU's name on a device."""
    info = machine_info()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# ---------------------------------------------------------------------------------------------- publish
def series_losses(runs: Sequence[dict[str, Any]], series: str, length: int,
                  key: str = "loss") -> dict[int, float]:
    """Seed → held-out loss (``key``: another metric of the rows, part 2's ``accuracy``) of ``series`` at
    ``length``."""
    found = {}
    for run in runs:
        for row in run["rows"]:
            if row["series"] == series and row["length"] == length and row.get("status", "ok") == "ok":
                found[run["seed"]] = row[key]
    return found


def verdict(runs: Sequence[dict[str, Any]], a: str, b: str, length: int,
            key: str = "loss") -> tuple[str, list[float]]:
    """The issue-29 rule on "a has lower loss than b at ``length``": per seed d = loss(b) − loss(a);
    **holds** with at least ``MIN_SEEDS`` seeds, a mean of at least ``MARGIN`` and no negative seed;
    **fails** the other way round; else not resolved (saying why). ``key="accuracy"`` (part 2): "a has
    higher accuracy", d = accuracy(a) − accuracy(b), with ``TASK_MARGIN``."""
    la, lb = series_losses(runs, a, length, key), series_losses(runs, b, length, key)
    seeds = sorted(set(la) & set(lb))
    diffs = [lb[s] - la[s] if key == "loss" else la[s] - lb[s] for s in seeds]
    margin = MARGIN if key == "loss" else TASK_MARGIN
    if not diffs:
        return "not run", diffs
    if not all(math.isfinite(d) for d in diffs):
        return "not resolved (a loss is not finite)", diffs
    if len(diffs) < MIN_SEEDS:
        return f"not resolved ({len(diffs)} of {MIN_SEEDS} seeds)", diffs
    mean = sum(diffs) / len(diffs)
    if abs(mean) < margin:
        return f"not resolved (mean difference below {margin})", diffs
    sign = 1 if mean > 0 else -1
    if any(d * sign < 0 for d in diffs):
        return "not resolved (sign differs between seeds)", diffs
    return ("**holds**" if sign > 0 else "**fails**"), diffs


def pinned_steps(runs: Sequence[dict[str, Any]], base: str) -> int | None:
    """The step count earlier runs of the base fingerprint ``base`` pin: the newest one's, the count
    ``publishable`` keeps (the largest would differ after a ``--steps`` lease, and runs at it would never be
    published); ``None`` without such runs."""
    steps = [run["steps"] for run in runs if run.get("base_fingerprint") == base]
    return steps[-1] if steps else None


def publishable(runs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The runs of the newest base fingerprint and step count (never mixed with others: a seed's run of one
    would replace another's), and a note on the rest."""
    if not runs:
        return [], ""
    newest = runs[-1]["base_fingerprint"], runs[-1]["steps"]
    kept = [run for run in runs if (run["base_fingerprint"], run["steps"]) == newest]
    other = len(runs) - len(kept)
    note = (f"{other} run(s) of other settings, another corpus or another step count are left out: runs "
            "with different fingerprints or step counts are never mixed.") if other else ""
    return kept, note


def results_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The tables and verdicts of ``runs`` ("no runs yet" without any)."""
    lines, kept, note = results_start(runs, 1)
    if not kept:
        return no_runs(lines, 1)
    first, settings = kept[0], kept[0]["settings"]
    length, lengths, longest = study_lengths(settings)
    lines += [f"{len(kept)} run(s); {first['steps']} steps × {settings['batch_size']} × {length} tokens "
              f"({first['tokens']:,} tokens a run), {settings['dtype']}; corpus " + provenance(first), ""]
    if note:
        lines += [note, ""]
    series = list(dict.fromkeys(row["series"] for run in kept for row in run["rows"]))
    lines += ["## Held-out perplexity by evaluation length (exp of the mean loss over seeds: the seeds' "
              "geometric mean)", "",
              "| series | seeds | non-embedding parameters | " + " | ".join(map(str, lengths)) + " |",
              "|---|---|---|" + "---|" * len(lengths)]
    for name in series:
        cells = []
        for n in lengths:
            values = list(series_losses(kept, name, n).values())
            cells.append(f"{math.exp(sum(values) / len(values)):.2f}" if values else "–")
        variant = name.split("/")[0]
        params = next(run["parameters"]["non_embedding"] for run in kept if run["variant"] == variant)
        seeds = len(series_losses(kept, name, length))
        lines.append(f"| `{name}` | {seeds} | {params:,} | " + " | ".join(cells) + " |")
    lines += ["", f"## Verdicts (issue-29 rule: {MIN_SEEDS} seeds, mean loss difference at least {MARGIN} "
                  "nats, no seed of the other sign)", "",
              "| claim | a − b | at | loss(b) − loss(a) per seed | verdict |", "|---|---|---|---|---|"]
    for claim, a, b in CLAIMS:
        for at, label in ((length, f"L = {length}"), (longest, f"{longest // length}× ({longest})")):
            result, diffs = verdict(kept, a, b, at)
            values = ", ".join(f"{d:+.3f}" for d in diffs) or "–"
            lines.append(f"| {claim} | `{a}` − `{b}` | {label} | {values} "
                         f"| {result} |")
    entropy = [(run["variant"], run["seed"], run["entropy"]) for run in kept]
    lines += ["", "## Attention entropy against log n (mean over layers and heads, nats)", ""]
    for variant, seed, found in entropy:
        if found.get("status") == "ok":
            points = ", ".join(f"{p['length']}: {p['mean_entropy']:.2f} (log n {p['log_keys']:.2f})"
                               for p in found["points"])
            lines.append(f"- `{variant}` seed {seed}: {points}")
        else:
            lines.append(f"- `{variant}` seed {seed}: {found.get('status')}")
    return "\n".join(lines) + "\n"


def results_start(runs: Sequence[dict[str, Any]],
                  part: int) -> tuple[list[str], list[dict[str, Any]], str]:
    """The results' title, the runs to publish and the note on the others (``publishable``)."""
    title = ["part 1", "part 2: retrieval"][part - 1]
    kept, note = publishable(runs)
    diverged = [f"`{run['variant']}`{' ' + run['task'] if run.get('task') else ''} seed {run['seed']}"
                for run in kept if run.get("diverged")]
    if diverged:
        note = (note + " " if note else "") + (f"Diverged (training loss not finite; recorded, so not "
                                               f"retrained, and every verdict it enters is not resolved): "
                                               f"{', '.join(diverged)}.")
    return [f"# The length-generalisation study at L = 512 (issue 49), {title}", ""], kept, note


def study_lengths(settings: dict[str, Any]) -> tuple[int, list[int], int]:
    """L, the evaluation lengths and the longest."""
    return settings["train_length"], settings["eval_lengths"], max(settings["eval_lengths"])


def no_runs(lines: list[str], part: int) -> str:
    command = "bash scripts/gpu_study.sh" + (f" --part {part}" if part != 1 else "")
    return "\n".join(lines + [f"No runs yet: part {part} has not run on a GPU. `{command}` on a lease runs "
                              "it (CONTRIBUTING.md, \"The GPU study\")."]) + "\n"


def provenance(first: dict[str, Any]) -> str:
    """The results' line on where the runs come from: the data's sha256 and sources, the machine."""
    corpus = first["corpus"]
    return (f"sha256 {corpus['sha256'][:16]}… ({corpus['sources']}); "
            + ", ".join(f"{key} {value}" for key, value in first["machine"].items()) + "."
            + (" **Dry run.**" if first["dry_run"] else ""))


def learned_threshold(task: str, settings: dict[str, Any]) -> float:
    """The accuracy at L that counts as having learned ``task``: the retrieval study's
    (``tools/docs_results/retrieval.py``: passkey 0.5; MQAR halfway between answering by elimination and
    1)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tools.docs_results.retrieval import learned_threshold as threshold

    return threshold({"settings": {"task": task, "num_kv_pairs": settings["num_kv_pairs"]}})


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    spread = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(spread)


def task_results_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """Part 2's tables (accuracy by length per series and task, mean ± std over seeds) and verdicts ("no
    runs yet" without any)."""
    lines, kept, note = results_start(runs, 2)
    if not kept:
        return no_runs(lines, 2)
    first, settings = kept[0], kept[0]["settings"]
    length, lengths, longest = study_lengths(settings)
    counts = {task: task_steps(first["steps"], task) for task in TASKS}
    lines += [f"{len(kept)} run(s); " + ", ".join(
        f"{task} {count} steps" + (f" (the first {warmup} on the copy warm-up)" if warmup else "")
        for task, (count, warmup) in counts.items())
        + f", × {settings['batch_size']} sequences of {length} tokens, {settings['dtype']}; "
          f"{settings['eval_samples']} sequences per length; task examples " + provenance(first), ""]
    if note:
        lines += [note, ""]
    head = " | ".join(f"{n} ({n // length}L)" if n != length else f"{n} (L)" for n in lengths)
    learned: dict[tuple[str, str], float] = {}
    for task in TASKS:
        of_task = [run for run in kept if run["task"] == task]
        metric = ("exact-match accuracy" if task == "passkey"
                  else f"accuracy per query, {settings['num_kv_pairs']} key-value pairs")
        lines += [f"## {task} ({metric}; mean ± std over seeds; at least "
                  f"{learned_threshold(task, settings):.3g} at L counts as learned)", "",
                  f"| series | seeds | non-embedding parameters | {head} |",
                  "|---|---|---|" + "---|" * len(lengths)]
        for name in dict.fromkeys(row["series"] for run in of_task for row in run["rows"]):
            cells = []
            for n in lengths:
                values = list(series_losses(of_task, name, n, "accuracy").values())
                cells.append("{:.2f} ± {:.2f}".format(*mean_std(values)) if values else "–")
                if n == length and values:
                    learned[(task, name)] = mean_std(values)[0]
            params = next(run["parameters"]["non_embedding"] for run in of_task
                          if run["variant"] == name.split("/")[0])
            seeds = len(series_losses(of_task, name, length, "accuracy"))
            lines.append(f"| `{name}` | {seeds} | {params:,} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"## Verdicts (issue-29 rule on accuracy: {MIN_SEEDS} seeds, mean difference at least "
              f"{TASK_MARGIN}, no seed of the other sign; at {longest // length}× only where both models "
              "learned the task at L)", "",
              "| claim | task | a − b | at | accuracy(a) − accuracy(b) per seed | verdict |",
              "|---|---|---|---|---|---|"]
    for claim, a, b in CLAIMS:
        for task in TASKS:
            of_task = [run for run in kept if run["task"] == task]
            bar = learned_threshold(task, settings)
            for at, label in ((length, f"L = {length}"), (longest, f"{longest // length}× ({longest})")):
                result, diffs = verdict(of_task, a, b, at, "accuracy")
                worst = min(learned.get((task, a), 0.0), learned.get((task, b), 0.0))
                if at != length and diffs and worst < bar:
                    result = "not resolved (not learned at L)"
                values = ", ".join(f"{d:+.2f}" for d in diffs) or "–"
                lines.append(f"| {claim} | {task} | `{a}` − `{b}` | {label} | {values} | {result} |")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[dict[str, Any]], path: Path, part: int = 1) -> Path | None:
    """Part 1: held-out perplexity against the evaluation length, one line per series; part 2: accuracy, one
    panel per task (``None`` without runs or matplotlib)."""
    kept, _ = publishable(runs)
    if not kept:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    lengths = kept[0]["settings"]["eval_lengths"]
    panels = ([("held-out perplexity", kept, "loss")] if part == 1 else
              [(f"{task} accuracy", [run for run in kept if run["task"] == task], "accuracy")
               for task in TASKS])
    figure, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 5), squeeze=False)
    for axis, (label, of_panel, key) in zip(axes[0], panels):
        for name in dict.fromkeys(row["series"] for run in of_panel for row in run["rows"]):
            points = [(n, sum(v) / len(v)) for n in lengths
                      if (v := list(series_losses(of_panel, name, n, key).values()))]
            axis.plot([n for n, _ in points], [math.exp(v) if key == "loss" else v for _, v in points],
                      marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log" if key == "loss" else "linear")
        axis.axvline(kept[0]["settings"]["train_length"], color="grey", linestyle=":")
        axis.set_xlabel("evaluation length (tokens)")
        axis.set_ylabel(label)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def publish(runs_paths: Sequence[Path], out: Path | None, part: int = 1) -> str:
    runs = read_runs(runs_paths, part)
    text = results_markdown(runs) if part == 1 else task_results_markdown(runs)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / FILES[part].results, text)
        plot(runs, out / FILES[part].plot, part)
    return text


TIMING_FILES = {1: "timing.json", 2: "retrieval-timing.json"}
"""Per part, under the committed folder: each variant's timing from the lease absorbed last that timed it,
for one base fingerprint (corpus, tokenizer, settings) and GPU (and, per timing, ``timed_as``), so that a
later lease on that GPU neither times it again (a lease spent timing trained nothing, and the next one timed
again) nor predicts a run without it."""


def timed_as(planned: Planned, compile_model: bool) -> dict[str, Any]:
    """What a timing holds for, beside its base fingerprint and GPU: the variant's config fields, whether it
    was compiled, and the torch and package versions (a timing of other code or another mode is not
    reused)."""
    from hf_attn_variants.models.version import __version__

    mode = {"fields": planned.fields, "compile": compile_model, "torch": torch.__version__,
            "hf_attn_variants": __version__}
    return json.loads(json.dumps(mode, default=str))


def since_command_start() -> float:
    """Seconds since ``gpu_study.sh`` started (``GPU_STUDY_T0``, its ``date +%s``), which the lease's command
    limit counts from, imports included; 0 without it."""
    start = os.environ.get("GPU_STUDY_T0", "")
    return max(0.0, time.time() - float(start)) if start.isdigit() else 0.0


def committed_timings(committed: Path, part: int, base: str, gpu: str | None) -> dict[str, dict[str, Any]]:
    """The committed timings of ``part`` (``TIMING_FILES``) if they are for ``base`` on ``gpu``, else none."""
    path = committed / TIMING_FILES[part]
    if gpu is None or not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if (data.get("base_fingerprint"), data.get("gpu")) != (base, gpu):
        return {}
    return dict(data.get("timing", {}))


def absorb_timings(folder: Path, committed: Path = COMMITTED) -> int:
    """The timings in a lease's plan files into ``TIMING_FILES`` (those of the same base fingerprint and GPU
    kept beside them, others replaced); returns how many variants' timings were new."""
    added = 0
    for part, files in FILES.items():
        plan = folder / files.plan
        if not plan.is_file():
            continue
        report = json.loads(plan.read_text(encoding="utf-8"))
        gpu, timing = report.get("machine", {}).get("gpu"), report.get("timing") or {}
        if report.get("dry_run") or gpu is None or not timing:
            continue
        kept = committed_timings(committed, part, report["base_fingerprint"], gpu)
        new = [name for name in timing if kept.get(name) != timing[name]]
        if new:
            committed.mkdir(parents=True, exist_ok=True)
            atomic_write_json(committed / TIMING_FILES[part], {
                "kind": "gpu_study_timing", "part": part, "base_fingerprint": report["base_fingerprint"],
                "gpu": gpu, "timing": {**kept, **timing}})
            added += len(new)
    return added


def absorb(folder: Path, committed: Path = COMMITTED) -> int:
    """Append the new runs of a lease's runs files (``gpu-study-runs.jsonl``, part 1, and
    ``gpu-study-retrieval-runs.jsonl``, part 2) to their part's file under ``committed`` (``runs.jsonl``,
    ``retrieval-runs.jsonl``; dry runs refused, fingerprints already there skipped); returns how many were
    added."""
    sources = ([folder / FILES[part].runs for part in FILES if (folder / FILES[part].runs).is_file()]
               if folder.is_dir() else [folder] if folder.is_file() else [])
    if not sources:
        if folder.is_dir() and any((folder / f.plan).is_file() for f in FILES.values()):
            return 0  # a lease that only timed: its timings are absorb_timings'
        raise UsageError("absorb", f"no {' or '.join(f.runs for f in FILES.values())} in {str(folder)!r}")
    known = {run["fingerprint"] for run in read_runs([committed], None)}
    added = 0
    for record in read_runs(sources, None):
        if record.get("dry_run"):
            raise UsageError("absorb", f"{str(folder)!r} holds dry-run results, which are never committed")
        if record["fingerprint"] not in known:
            committed.mkdir(parents=True, exist_ok=True)
            append_run(committed / FILES[record.get("part", 1)].committed, record)
            known.add(record["fingerprint"])
            added += 1
    return added


# ---------------------------------------------------------------------------------------------- command line
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_study.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="one lease's work")
    go.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu-study"))
    go.add_argument("--dry-run", action="store_true")
    go.add_argument("--budget", type=float, default=360.0,
                    help="seconds for one seed of every variant, evaluation included (default 360)")
    go.add_argument("--deadline", type=float, default=540.0,
                    help="start no run predicted to end later than this many seconds after the start (540)")
    go.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="seeds, in order (default 0 1 2; the dry run 0)")
    go.add_argument("--committed", type=Path, default=COMMITTED,
                    help="folder of committed runs (*.jsonl) to skip (default docs/results/gpu-study)")
    go.add_argument("--variants", nargs="+", default=None)
    go.add_argument("--compile", default="auto", help="torch.compile: auto (on CUDA), yes or no")
    go.add_argument("--retime", action="store_true", help="time the variants even where committed runs "
                    "pin the step count (the step count stays pinned only if --steps says so)")
    go.add_argument("--steps", type=int, default=None, help="set the step count instead of timing (part 2: "
                    "MQAR's; passkey trains 400/1500 of it)")
    take = commands.add_parser("absorb", help="a lease's runs (both parts) into docs/results/gpu-study/")
    take.add_argument("folder", type=Path)
    show = commands.add_parser("publish", help="tables, verdicts and a plot of the runs")
    show.add_argument("--runs", type=Path, nargs="+", default=[COMMITTED],
                      help="runs files or folders (their *.jsonl; only the part's runs are read)")
    show.add_argument("--out", type=Path, default=None)
    sizes = commands.add_parser("plan", help="the variants and their non-embedding parameters")
    sizes.add_argument("--dry-run", action="store_true")
    for command in (go, show, sizes):
        command.add_argument("--part", default="1",
                             help="1: the language model (default); 2: retrieval, passkey and MQAR")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        part = parse_part(getattr(args, "part", 1))
        if args.command == "run":
            return run(Options(out=args.out, dry_run=args.dry_run, budget=args.budget, deadline=args.deadline,
                               seeds=tuple(args.seeds or ([0] if args.dry_run else [0, 1, 2])),
                               committed=args.committed,
                               variants=tuple(args.variants) if args.variants else None, compile=args.compile,
                               retime=args.retime, steps=args.steps, part=part))
        if args.command == "absorb":
            check_runs_files([args.folder / FILES[p].runs for p in FILES] if args.folder.is_dir()
                             else [args.folder], "absorb")
            runs = absorb(args.folder)
            log(f"{runs} new run(s) and {absorb_timings(args.folder)} new variant timing(s) added under "
                f"{COMMITTED}")
            return 0
        if args.command == "publish":
            if args.out is not None and args.out.exists() and not args.out.is_dir():
                raise UsageError("--out", f"{str(args.out)!r} is a file, not a folder")
            missing = [str(path) for path in args.runs if not path.exists()]
            if missing:
                raise UsageError("--runs", f"no such runs file or folder: {', '.join(map(repr, missing))}")
            check_runs_files(args.runs, "--runs")
            print(publish(args.runs, args.out, part), end="")
            return 0
        from hf_attn_variants.training import embedded_tokenizer

        settings = part_settings(part, args.dry_run)
        vocabulary = embedded_tokenizer() if part == 1 else cast(TaskSettings, settings).task_vocab_size
        for p in plan_variants(settings, vocabulary):
            print(f"{p.name}\t{p.parameters['non_embedding']}\t{p.parameters['total']}\t{p.fields}")
        return 0
    except UsageError as error:
        print(f"gpu_study.py: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CLAIMS", "DRY_SETTINGS", "DRY_TASK_SETTINGS", "FILES", "Options", "Settings", "TaskSettings",
           "UsageError", "absorb", "build_corpus", "main", "pending", "pinned_steps", "plan_variants",
           "publish",
           "replace", "results_markdown", "run", "task_results_markdown", "task_steps", "verdict"]
