"""Re-render the numbers in README.md, CONTRIBUTING.md and docs/*.md from the committed results files
(docs/results/*.json). A maintainer tool of the repository, not part of the installed package.

Run from the repository root::

    .venv/bin/python tools/render_docs.py            # rewrite every results region that is out of date
    .venv/bin/python tools/render_docs.py --check    # write nothing; exit 1 when a region differs

A bad flag exits with status 2 and one line naming it; a results file that cannot be rendered, with 2 and one
line naming the file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root makes ``tools`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_attn_variants.cli_utils import FlagError, fail, fail_flag  # noqa: E402
from tools.docs_results import ResultsError, render_docs  # noqa: E402

COMMAND = "render-docs"
"""The name in error lines (``hf-attn-variants render-docs: error: …``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``render-docs``."""
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="Repository root (default: the current folder).")
    parser.add_argument("--check", action="store_true",
                        help="Write nothing; exit 1 when a region differs from its results file.")


def check_root(root: Path) -> Path:
    """``root`` when it holds README.md; ``FlagError`` naming ``--root`` otherwise."""
    if not (root / "README.md").is_file():
        raise FlagError("root", f"root: {str(root)!r} holds no README.md (run render-docs from the "
                                "repository root).")
    return root


def run(args: argparse.Namespace) -> int:
    """Render (or check) every region; one line per changed file. Exit 1 with ``--check`` when one differs."""
    try:
        root = check_root(args.root)
    except FlagError as error:
        return fail_flag(COMMAND, error)
    try:
        changed = render_docs(root, check=args.check)
    except ResultsError as error:
        return fail(COMMAND, str(error))
    for line in changed:
        print(line)
    return 1 if args.check and changed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and render; returns the exit status."""
    parser = argparse.ArgumentParser(prog="tools/render_docs.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
