"""The cached test environments (tests/remote_code.py): distributions installed here are linked into a new
environment with their dependencies, and that environment's Python finds them, runs their console scripts
and imports their byte-compiled files without compiling again."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import venv
from pathlib import Path

from tests.remote_code import distribution_closure, installed_here, seed_distributions


def test_the_closure_follows_requirements_and_leaves_extras_out() -> None:
    names = [dist.metadata["Name"].lower() for dist in distribution_closure("pytest")]
    assert names[0] == "pytest"
    assert {"pluggy", "iniconfig", "packaging"} <= set(names)
    # pytest's "dev" extra (argcomplete, attrs, requests, ...) is not followed.
    assert "requests" not in names and "argcomplete" not in names


def test_installed_here_names_only_requirements_pinned_to_the_installed_version() -> None:
    pytest_version = importlib.metadata.version("pytest")
    chosen = installed_here([f"pytest=={pytest_version}", "pytest-xdist==0.0.1", "no-such-package==1.0"])
    assert chosen == ("pytest",)


def test_a_seeded_environment_runs_the_linked_distributions(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    seed_distributions(env_dir, ("pytest",))
    (site,) = env_dir.glob("lib/python*/site-packages")
    here = Path(importlib.metadata.distribution("pluggy").locate_file("pluggy/__init__.py"))
    linked = site / "pluggy" / "__init__.py"
    if here.stat().st_dev == linked.stat().st_dev:
        assert os.path.samefile(here, linked)  # a hard link on one file system
    else:
        assert linked.read_bytes() == here.read_bytes() and linked.stat().st_mtime == here.stat().st_mtime
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    code = ("import importlib.metadata, sys, pluggy; print(importlib.metadata.version('pytest')); "
            "print(pluggy.__file__.startswith(sys.prefix))")
    out = subprocess.run([str(env_dir / "bin" / "python"), "-c", code], check=True, capture_output=True,
                         text=True, env=environment).stdout.split()
    assert out == [importlib.metadata.version("pytest"), "True"]
    script = env_dir / "bin" / "pytest"
    assert script.read_text().splitlines()[0] == f"#!{env_dir / 'bin' / 'python'}"
    version = subprocess.run([str(script), "--version"], check=True, capture_output=True, text=True,
                             env=environment)
    assert importlib.metadata.version("pytest") in version.stdout + version.stderr
    # A compiled file came along, so the new environment does not compile pytest again on import.
    assert any((site / "_pytest" / "__pycache__").glob("*.pyc"))
