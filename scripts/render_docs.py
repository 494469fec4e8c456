"""Re-render the numbers in README.md, CONTRIBUTING.md and docs/*.md from the committed results files
(docs/results/*.json). A maintainer command, not part of the installed tool.

Run from the repository root::

    .venv/bin/python scripts/render_docs.py            # rewrite every results region that is out of date
    .venv/bin/python scripts/render_docs.py --check    # write nothing; exit 1 when a region differs

A bad flag exits with status 2 and one line naming it; a results file that cannot be rendered, with 2 and one line
naming the file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hf_attn_variants.results.cli import add_arguments, run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and render; returns the exit status."""
    parser = argparse.ArgumentParser(prog="scripts/render_docs.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
