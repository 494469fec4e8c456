"""The ``hf-attn-variants`` command line: a static table of subcommands, ``--help`` and ``--version``.

This module stands outside the ``hf_attn_variants`` package on purpose: importing the package imports torch
and registers every family with the Auto classes (users rely on that), which takes seconds. Here nothing
heavier than ``argparse`` is imported until a subcommand runs; then its module (``SUBCOMMANDS[name].module``)
is imported and its ``add_arguments(parser)`` / ``run(args) -> int`` do the work. ``python -m hf_attn_variants
<subcommand>`` (``hf_attn_variants/__main__.py``) runs the same ``main``.

Extras. The core install (torch, transformers, safetensors, huggingface_hub) covers the models, save and load,
the pruning API and stock log-n scaling, and the subcommands ``export``, ``push`` and ``convert-gau-alpha``.
The training tools need the ``train`` extra, the plots the ``plots`` extra (``EXTRAS``). A subcommand whose
extra is not installed stops before it starts with one sentence naming ``pip install
'hf_attn_variants[EXTRA]'`` (``missing_extras``, ``extra_message``); a module of an extra that is found
missing later, inside a run, gets the same sentence.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, NoReturn

DISTRIBUTION = "hf_attn_variants"
"""The distribution (and import) name of the package."""

EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("accelerate", "datasets", "peft", "torchdata"),
    "plots": ("matplotlib",),
    "gpu": ("triton",),
}
"""extra → the modules it installs (pyproject.toml's ``[project.optional-dependencies]``)."""


class Subcommand(NamedTuple):
    """One subcommand: the module that implements it, its one-line help, the extras it needs, and the flags
    that make its ``plots`` extra unnecessary (e.g. ``--no-plots``)."""

    module: str
    help: str
    extras: tuple[str, ...] = ()
    plot_off_flags: tuple[str, ...] = ()


SUBCOMMANDS: dict[str, Subcommand] = {
    "pretrain": Subcommand("hf_attn_variants.training.pretrain",
                           "MLM/CLM pretraining of any family with accelerate.", ("train",)),
    "finetune": Subcommand("hf_attn_variants.training.finetune",
                           "Sequence/token classification finetuning with Trainer, optionally with a LoRA "
                           "adapter (peft).", ("train",)),
    "export": Subcommand("hf_attn_variants.hub.export",
                         "Write the exact Hub folder: safetensors, remote code, tokenizer, card."),
    "push": Subcommand("hf_attn_variants.hub.push", "Upload an exported folder to the Hugging Face Hub."),
    "demo": Subcommand("hf_attn_variants.demo",
                       "Pretrain a tiny MLM of each family on the embedded corpus, evaluate at L/2L/4L, "
                       "export, reload, print a table.", ("train",)),
    "prune": Subcommand("hf_attn_variants.pruning.cli",
                        "Score attention heads (Michel et al. 2019), prune them iteratively, write the "
                        "curve, plots and pruned model.", ("train", "plots")),
    "bench": Subcommand("hf_attn_variants.bench.cli",
                        "Speed and memory benchmarks vs stock Transformers (eager and torch.compile); writes "
                        "under runs/.", ("train", "plots"), ("--no-plots",)),
    "convert-gau-alpha": Subcommand("hf_attn_variants.hub.conversion",
                                    "Convert the GAU-α checkpoint of its PyTorch port (gau-alpha) into a "
                                    "GAUForMaskedLM folder."),
    "lengthgen": Subcommand("hf_attn_variants.lengthgen.cli",
                            "Length-generalisation study: train variants at length L, evaluate at L/4…8L "
                            "(JSON/CSV/plots, resumable).", ("train", "plots"), ("--no_plot", "--no-plot")),
    "entropy": Subcommand("hf_attn_variants.entropy.cli",
                          "Attention entropy per layer and head against the number of keys a row sees, with "
                          "its slope dH/dlog n (JSON and plot).", ("plots",), ("--no_plot", "--no-plot")),
}
"""name → what runs it. Maintainer commands (re-rendering the docs from the results files, publishing a study)
are tools of the repository (``tools/render_docs.py``, ``tools/publish_study.py``), not subcommands of the
installed tool."""


def package_version() -> str:
    """The installed distribution's version; from a source tree that was never installed, the version written
    in ``hf_attn_variants/models/version.py`` (read as text: importing it would import the package and
    torch)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        spec = importlib.util.find_spec(DISTRIBUTION)
        if spec is None or spec.origin is None:
            return "unknown"
        text = (Path(spec.origin).parent / "models" / "version.py").read_text(encoding="utf-8")
        match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
        return match.group(1) if match else "unknown"


def install_command(extras: Sequence[str]) -> str:
    """``pip install 'hf_attn_variants[a,b]'``."""
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"


def extra_of(module: str) -> str | None:
    """The extra that installs the top-level module of ``module`` (``"datasets.utils"`` → ``"train"``), or
    None."""
    top = module.split(".")[0]
    return next((extra for extra, modules in EXTRAS.items() if top in modules), None)


def is_installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that is missing, or a module whose __spec__ is None
        return False


def missing_extras(command: str, argv: Sequence[str] = (),
                   installed: Callable[[str], bool] = is_installed) -> dict[str, list[str]]:
    """extra → its modules that are not installed, for each extra ``command`` needs with the flags
    ``argv``."""
    subcommand = SUBCOMMANDS[command]
    plots_off = any(arg.split("=")[0] in subcommand.plot_off_flags for arg in argv)
    missing = {}
    for extra in subcommand.extras:
        if extra == "plots" and plots_off:
            continue
        absent = [module for module in EXTRAS[extra] if not installed(module)]
        if absent:
            missing[extra] = absent
    return missing


def extra_message(command: str, missing: dict[str, list[str]]) -> str:
    """The one sentence of a subcommand that lacks extras: which modules, and the pip command that installs
    them."""
    modules = ", ".join(module for absent in missing.values() for module in absent)
    verb = "is" if sum(map(len, missing.values())) == 1 else "are"
    return (f"hf-attn-variants {command}: error: {modules} {verb} not installed; install what this command "
            f"needs with: {install_command(list(missing))}")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``<prog>: error: <message> (see <prog> --help)``,
    exit status 2, as the commands' own checks are.

    argparse prints the whole usage block first, the error at its end: 53 lines for ``pretrain``, 148 for
    ``finetune``.
    """

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line to stderr and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per subcommand (their flags are added only when one runs)."""
    parser = OneLineParser(
        prog="hf-attn-variants",
        description="GAU, Synthesizer and entropy-invariant attention for Hugging Face Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    for name, subcommand in SUBCOMMANDS.items():
        sub.add_parser(name, help=subcommand.help, description=subcommand.help)
    return parser


HELP_FLAGS = ("-h", "--help")


def asks_for_help(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for a subcommand's ``--help`` (argparse answers it before any other flag is
    checked)."""
    return any(arg in HELP_FLAGS for arg in argv if arg != "--")


def run_subcommand(command: str, argv: Sequence[str]) -> int:
    """Import the subcommand's module, parse ``argv`` with its flags and run it; a module of an extra that
    turns out to be missing gives the one install sentence (exit status 1). ``--help`` answers with the core
    install alone (the subcommand modules import their extras only when they run), and then names the
    missing extras after the flags."""
    missing = missing_extras(command, argv)
    if missing and not asks_for_help(argv):
        print(extra_message(command, missing), file=sys.stderr)
        return 1
    subcommand = SUBCOMMANDS[command]
    try:
        module = importlib.import_module(subcommand.module)
        parser = OneLineParser(prog=f"hf-attn-variants {command}", description=subcommand.help)
        module.add_arguments(parser)
        if missing:  # --help without the extras: the flags, then what running the command needs
            modules = ", ".join(module for absent in missing.values() for module in absent)
            parser.epilog = (f"Running {command} needs {modules}, not installed here: "
                             f"{install_command(list(missing))}")
        args = parser.parse_args(list(argv))
        return int(module.run(args) or 0)
    except ModuleNotFoundError as error:
        extra = extra_of(error.name or "")
        if extra is None:
            raise
        print(extra_message(command, {extra: [(error.name or "").split(".")[0]]}), file=sys.stderr)
        return 1


KEEP_FREED_MEMORY = frozenset({"pretrain", "finetune", "demo", "bench", "lengthgen"})
"""The subcommands that train or measure: run from the console, their process keeps the host memory a step
frees for the next one (``hf_attn_variants.host_memory``; O(n) models stay O(n) per token at long n on a
CPU)."""


def console() -> int:
    """The console script ``hf-attn-variants`` and ``python -m hf_attn_variants``: ``main`` in a process of
    its own, where the subcommands of ``KEEP_FREED_MEMORY`` set the host allocator first. (``main`` called
    from Python, in a process that is not the command's own, leaves the allocator alone.)"""
    argv = sys.argv[1:]
    try:
        if argv and argv[0] in KEEP_FREED_MEMORY:  # imports torch: a Ctrl-C here is caught too
            from hf_attn_variants.host_memory import keep_freed_memory

            keep_freed_memory()
        return main(argv)
    except KeyboardInterrupt:  # the training commands stop at a step instead (their own line and status)
        command = argv[0] if argv and argv[0] in SUBCOMMANDS else None
        print(interrupted_message(command), file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


INTERRUPTED_EXIT_CODE = 130
"""What a shell reports for a process ended by Ctrl-C (128 + SIGINT)."""
AFTER_CTRL_C = {
    "prune": "its --output_dir holds an unfinished run, with the steps measured before the stop in "
             "curve.csv, which the same command redoes",
    "bench": "a stop while measuring writes the rows measured so far (its own line says where); this one "
             "came before or after the measurements, and a results file written before it is whole: "
             "`hf-attn-variants bench --report-only <that .json>` writes its report and plots",
    "entropy": "the series finished before it are in its --output file, marked \"interrupted\" (nothing is "
               "written when it stops in the first; stopped while writing, every series is kept, marked, "
               "without a plot)",
    "export": "--output_dir holds the old folder or the new one, never half of one (an export is "
              "assembled aside and renamed into place; an old folder being replaced may be left whole as "
              ".<name>.old-*)",
    "convert-gau-alpha": "--output_dir holds the old folder or the new one, never half of one (assembled "
                         "aside and renamed into place)",
}
"""What a command stopped by Ctrl-C outside a training step leaves, for its one line."""


def interrupted_message(command: str | None) -> str:
    """The one line for Ctrl-C (``KeyboardInterrupt``) in ``console``, instead of a traceback."""
    where = f"hf-attn-variants {command}" if command else "hf-attn-variants"
    left = AFTER_CTRL_C.get(command or "")
    return (f"{where}: interrupted: stopped by Ctrl-C before it finished{'; ' + left if left else ''} "
            f"(exit status {INTERRUPTED_EXIT_CODE}).")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return run_subcommand(argv[0], argv[1:])
    parser = build_parser()
    # --help / --version exit here; an unknown subcommand is argparse's error (status 2)
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(console())


__all__ = [
    "EXTRAS",
    "INTERRUPTED_EXIT_CODE",
    "KEEP_FREED_MEMORY",
    "OneLineParser",
    "SUBCOMMANDS",
    "Subcommand",
    "build_parser",
    "console",
    "extra_message",
    "extra_of",
    "install_command",
    "interrupted_message",
    "main",
    "missing_extras",
    "package_version",
    "run_subcommand",
]
