"""The docs renderer's command line (run by the maintainer script ``scripts/render_docs.py``, not by the installed
tool): re-render the results regions of README.md, CONTRIBUTING.md and docs/*.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli_utils import FlagError, fail, fail_flag
from . import ResultsError, render_docs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``render-docs``."""
    parser.add_argument("--root", type=Path, default=Path("."), help="Repository root (default: the current folder).")
    parser.add_argument("--check", action="store_true",
                        help="Write nothing; exit 1 when a region differs from its results file.")


def check_root(root: Path) -> Path:
    """``root`` when it holds README.md; ``FlagError`` naming ``--root`` otherwise."""
    if not (root / "README.md").is_file():
        raise FlagError("root", f"root: {str(root)!r} holds no README.md (run render-docs from the repository root).")
    return root


def run(args: argparse.Namespace) -> int:
    """Render (or check) every region; one line per changed file. Exit 1 with ``--check`` when one differs."""
    try:
        root = check_root(args.root)
    except FlagError as error:
        return fail_flag("render-docs", error)
    try:
        changed = render_docs(root, check=args.check)
    except ResultsError as error:
        return fail("render-docs", str(error))
    for line in changed:
        print(line)
    return 1 if args.check and changed else 0
