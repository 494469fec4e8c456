"""The ``hf-attn-variants`` command line.

Each subcommand lives in its own module and exposes ``add_arguments(parser)`` and ``run(args) -> int``;
``SUBCOMMANDS`` maps names to ``"module:help"``. Modules are imported only when their subcommand runs,
so ``hf-attn-variants --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {}
"""name → (module path, one-line help). Filled as subcommands are implemented."""
SUBCOMMANDS["pretrain"] = ("hf_attn_variants.training.pretrain", "MLM/CLM pretraining of any family with accelerate.")
SUBCOMMANDS["finetune"] = (
    "hf_attn_variants.training.finetune",
    "Sequence/token classification finetuning with Trainer, optionally with a LoRA adapter (peft).",
)
SUBCOMMANDS["export"] = ("hf_attn_variants.hub.export", "Write the exact Hub folder: safetensors, remote code, tokenizer, card.")
SUBCOMMANDS["push"] = ("hf_attn_variants.hub.push", "Upload an exported folder to the Hugging Face Hub.")
SUBCOMMANDS["demo"] = (
    "hf_attn_variants.demo",
    "Pretrain a tiny MLM of each family on the embedded corpus, evaluate at L/2L/4L, export, reload, print a table.",
)
SUBCOMMANDS["prune"] = (
    "hf_attn_variants.pruning.cli",
    "Score attention heads (Michel et al. 2019), prune them iteratively, write the curve, plots and pruned model.",
)
SUBCOMMANDS["bench"] = (
    "hf_attn_variants.bench.cli",
    "Speed and memory benchmarks vs stock Transformers (eager and torch.compile); writes docs/benchmarks.md.",
)
SUBCOMMANDS["convert-gau-alpha"] = (
    "hf_attn_variants.hub.conversion",
    "Convert the GAU-α checkpoint of its PyTorch port (gau-alpha) into a GAUForMaskedLM folder.",
)
SUBCOMMANDS["lengthgen"] = (
    "hf_attn_variants.lengthgen.cli",
    "Length-generalisation study: train variants at length L, evaluate at L/4…8L (JSON/CSV/plots, resumable).",
)
SUBCOMMANDS["render-docs"] = (
    "hf_attn_variants.results.cli",
    "Re-render the numbers in README.md and docs/ from the committed results files (docs/results/*.json).",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="hf-attn-variants",
        description="GAU, Synthesizer and entropy-invariant attention for Hugging Face Transformers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    for name, (module_path, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_path)
        # A subcommand's flags are added only when it is the one being run (imports stay lazy).
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints help / an "invalid choice" error naming the allowed subcommands
        parser.print_help()
        return 0 if not argv else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    sub_parser = argparse.ArgumentParser(prog=f"hf-attn-variants {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
    module.add_arguments(sub_parser)
    args = sub_parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


__all__ = ["SUBCOMMANDS", "build_parser", "main"]
