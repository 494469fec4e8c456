"""Regenerate the committed remote code (``src/hf_attn_variants/models/remote/``) from the model sources.

The Hub folders' model code is generated from ``src/hf_attn_variants/models/`` and committed, as Transformers
commits the flat files its modular converter writes; ``save_pretrained`` and ``export`` copy it and refuse
when it is stale. A maintainer tool of the repository, not part of the installed package. Run from the
repository root after changing the model code::

    .venv/bin/python tools/remote_code.py            # rewrite the folder (and its manifest)
    .venv/bin/python tools/remote_code.py --check    # write nothing; exit 1 naming the files that differ

``tests/test_remote_code_committed.py`` runs the check in ``make test``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root makes ``tools`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_attn_variants.cli_utils import FlagError, fail_flag  # noqa: E402
from hf_attn_variants.models.standalone import remote_code_files, write_remote_code  # noqa: E402

COMMAND = "remote-code"
"""The name in error lines (``hf-attn-variants remote-code: error: …``)."""
MODELS = Path("src/hf_attn_variants/models")
"""The model sources, relative to the repository root."""


def differing_files(root: Path) -> list[str]:
    """Files of ``root``'s remote folder (relative to it) that differ from what its sources generate: missing,
    extra or edited."""
    package_dir = root / MODELS
    remote_dir = package_dir / "remote"
    expected = remote_code_files(package_dir)
    present = {path.relative_to(remote_dir).as_posix() for path in remote_dir.rglob("*") if path.is_file()
               } if remote_dir.is_dir() else set()
    return sorted(name for name in expected.keys() | present
                  if name not in present or name not in expected
                  or (remote_dir / name).read_text(encoding="utf-8") != expected[name])


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or with ``--check`` compare) the remote folder; 1 when ``--check`` finds a difference."""
    parser = argparse.ArgumentParser(prog=f"hf-attn-variants {COMMAND}", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="Repository root (default: the current folder).")
    parser.add_argument("--check", action="store_true",
                        help="Write nothing; exit 1 when a committed file differs from its sources' export.")
    args = parser.parse_args(argv)
    if not (args.root / MODELS).is_dir():
        message = f"{args.root} holds no {MODELS} (pass the repository root)."
        return fail_flag(COMMAND, FlagError("root", message))
    if args.check:
        stale = differing_files(args.root)
        for name in stale:
            print(f"{COMMAND}: stale: {MODELS}/remote/{name}", file=sys.stderr)
        if stale:
            print(f"{COMMAND}: run `python tools/remote_code.py` and commit the result", file=sys.stderr)
        return 1 if stale else 0
    written = write_remote_code(args.root / MODELS / "remote", args.root / MODELS)
    print(f"{COMMAND}: wrote {len(written)} files to {MODELS}/remote")
    return 0


if __name__ == "__main__":
    sys.exit(main())
