"""Tokens per second of ``pretrain --streaming --packing documents`` on this machine, one process: the CPU
numbers of docs/training.md's "Pretraining a real model", written to
``docs/results/pretrain-throughput-cpu.json``.

For each family: a causal model of hidden 256 and 4 layers (GAU: FLASH with chunks of 128; the Synthesizer:
dense + vanilla heads), blocks of 512 tokens, batch 4, AdamW, ``--steps`` optimizer steps over the embedded
corpus written as 8 jsonl shards; ``tokens_per_second`` of ``train_log.jsonl``'s rows after the first (which
holds the warm-up), median and range.

Usage (from the repository root, on an otherwise idle machine; a few minutes)::

    .venv/bin/python scripts/pretrain_throughput.py && .venv/bin/python tools/render_docs.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hf_attn_variants.training import PretrainArguments, pretrain
from hf_attn_variants.training.corpus import corpus_splits

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import format_results  # noqa: E402
from tools.docs_results._common import load_average, machine_description, run_metadata  # noqa: E402
from scripts.script_paths import output_file_problem  # noqa: E402

RESULTS = Path("docs/results/pretrain-throughput-cpu.json")
HIDDEN, LAYERS, BLOCK, BATCH = 256, 4, 512, 4
OVERRIDES = {
    "gau": f"hidden_size={HIDDEN},num_hidden_layers={LAYERS},attention_normalization=relu2,chunk_size=128",
    "entropy_invariant": f"hidden_size={HIDDEN},num_hidden_layers={LAYERS},num_attention_heads=4,"
                         f"intermediate_size={4 * HIDDEN}",
    "synthesizer": f"hidden_size={HIDDEN},num_hidden_layers={LAYERS},num_attention_heads=4,intermediate_size="
                   f"{4 * HIDDEN},synthesizer_components=[dense,vanilla],max_position_embeddings={BLOCK}",
}


def write_corpus(folder: Path, shards: int = 8) -> str:
    """The embedded corpus's training paragraphs as ``shards`` jsonl files; returns their glob."""
    texts = corpus_splits()["train"]
    for shard in range(shards):
        rows = "".join(json.dumps({"text": text}) + "\n" for text in texts[shard::shards])
        (folder / f"part-{shard:05d}.jsonl").write_text(rows)
    return str(folder / "part-*.jsonl")


def measure(family: str, corpus: str, steps: int, folder: Path) -> dict:
    """One run; the tokens/s of its rows after the first."""
    args = PretrainArguments(output_dir=str(folder / family), model_type=family, objective="clm",
                             config_overrides=OVERRIDES[family], train_file=corpus, streaming=True,
                             packing="documents", max_train_steps=steps, max_seq_length=BLOCK,
                             per_device_train_batch_size=BATCH, logging_steps=2, disable_tqdm=True)
    result = pretrain(args)
    rows = [json.loads(line) for line in Path(result.log_file).read_text().splitlines() if line.strip()]
    rates = [row["tokens_per_second"] for row in rows[1:]]
    info = json.loads((folder / family / "pretrain_args.json").read_text())
    return {"family": family, "parameters": info["num_parameters"],
            "tokens_per_second": statistics.median(rates),
            "low": min(rates), "high": max(rates), "windows": len(rates), "final_loss": rows[-1]["loss"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12,
                        help="optimizer steps per family, at least 4 (a row every 2; the first is warm-up)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if options.steps < 4:
        parser.error(f"--steps must be at least 4 (a row is logged every 2 steps and the first row is "
                     f"warm-up), got {options.steps}")
    problem = output_file_problem(options.output)
    if problem:
        parser.error(f"--output: {problem}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "corpus").mkdir()
        corpus = write_corpus(folder / "corpus")
        rows = [measure(family, corpus, options.steps, folder) for family in OVERRIDES]
    command = ["python", "scripts/pretrain_throughput.py", "--steps", str(options.steps)]
    data = {**run_metadata("pretrain_throughput", command, machine=machine_description(load_average())),
            "settings": {"hidden_size": HIDDEN, "layers": LAYERS, "block": BLOCK, "batch": BATCH,
                         "steps": options.steps, "overrides": OVERRIDES, "processes": 1},
            "rows": rows}
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(format_results(data))
    print(options.output.read_text())


if __name__ == "__main__":
    main()
