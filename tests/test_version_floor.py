"""The declared minimum torch is measured (DESIGN.md: the lowest version the model tests pass on).

CI runs one torch, the lock's CPU build: the index here has no other CPU build. ``python scripts/compat.py
--torch …  --record`` runs the model tests on older releases from PyPI (CUDA builds, which run on the CPU) and
records them in ``docs/results/version-floor.json``; these tests hold ``pyproject.toml`` to that file, and
check the script's bookkeeping without building anything.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.requirements import Requirement

from hf_attn_variants.models.compat import MIN_TRANSFORMERS_VERSION, version_tuple
from tests.remote_code import installed_transformers
from tests.test_wheel import project_table
from tools.docs_results import load_results
from tools.docs_results.version_floor import lowest_passing, passed, table

ROOT = Path(__file__).resolve().parents[1]


def declared_torch_minimum() -> str:
    """The version of pyproject's ``torch>=X``."""
    requirements = [Requirement(line) for line in project_table()["dependencies"]]
    (torch,) = [requirement for requirement in requirements if requirement.name == "torch"]
    (spec,) = torch.specifier
    assert spec.operator == ">=", torch
    return spec.version


def load_compat() -> ModuleType:
    """``scripts/compat.py`` as a module."""
    name = "compat_script"
    if name not in sys.modules:  # registered before it runs, as its dataclasses need
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "compat.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


PASSED_BUT_BELOW_THE_MINIMUM: dict[str, str] = {}
"""Releases whose model tests passed but that the declared minimum leaves out, with the reason."""


def test_the_declared_torch_is_the_lowest_that_passed() -> None:
    """pyproject's ``torch>=X``: every recorded release from X up passed the model tests with the oldest and
    the lock's Transformers; every lower one failed, or is named above with the reason."""
    data = load_results(ROOT, "version-floor")
    declared = version_tuple(declared_torch_minimum())
    at_or_above = [row for row in data["rows"] if version_tuple(row["torch"]) >= declared]
    assert {row["transformers"] for row in at_or_above if version_tuple(row["torch"]) == declared} >= {
        MIN_TRANSFORMERS_VERSION, installed_transformers()}, "the minimum was not run with both Transformers"
    assert all(passed(row) for row in at_or_above), [r for r in at_or_above if not passed(r)]
    below = {row["torch"] for row in data["rows"] if version_tuple(row["torch"]) < declared}
    passing_below = {release for release in below
                     if all(passed(row) for row in data["rows"] if row["torch"] == release)}
    assert passing_below <= set(PASSED_BUT_BELOW_THE_MINIMUM), (
        f"{sorted(passing_below)} passed: lower the declared minimum, or say why not")
    assert below - passing_below, "no recorded release below the minimum fails: it may not be the lowest"
    left_out = set(map(version_tuple, PASSED_BUT_BELOW_THE_MINIMUM))
    assert version_tuple(lowest_passing(data)) in {declared, *left_out}


def test_make_install_on_a_cuda_machine_asks_for_the_declared_minimum() -> None:
    """On a machine with CUDA, ``make install`` lets pip choose a CUDA torch; it asks for no less than
    pyproject declares."""
    makefile = (ROOT / "Makefile").read_text()
    assert f'pip install --quiet "torch>={declared_torch_minimum()}" -c $(LOCK)' in makefile


def test_the_floor_table_renders_every_row_newest_first() -> None:
    data = {"command": "python scripts/compat.py --torch 2.6.0 2.10.0 --record", "rows": [
        {"torch": "2.6.0", "transformers": "5.0.0", "installed": {"torch": "2.6.0+cu124"}, "passed": 600,
         "failed": 1, "skipped": 8, "seconds": 300, "date": "2026-11-29", "machine": "m"},
        {"torch": "2.10.0", "transformers": "5.0.0", "installed": {"torch": "2.10.0+cu128"}, "passed": 617,
         "failed": 0, "skipped": 8, "seconds": 280, "date": "2026-11-29", "machine": "m"},
    ]}
    text = table(data)
    assert text.index("| 2.10.0 |") < text.index("| 2.6.0 |") and "**failed**" in text
    assert lowest_passing(data) == "2.10.0"
    data["rows"][1]["failed"] = 2
    with pytest.raises(ValueError, match="no torch release"):
        lowest_passing(data)


def test_record_merges_rows_by_torch_and_transformers(tmp_path: Path) -> None:
    compat = load_compat()
    row: dict[str, Any] = {"torch": "2.7.1", "transformers": "5.0.0", "passed": 617, "failed": 0,
                           "skipped": 8, "seconds": 1, "date": "2026-11-29", "machine": "m"}
    compat.record_floor([row, {**row, "transformers": "5.24.0"}], ["compat"], root=tmp_path)
    compat.record_floor([{**row, "failed": 3}], ["compat"], root=tmp_path)
    rows = load_results(tmp_path, "version-floor")["rows"]
    assert [(r["transformers"], r["failed"]) for r in rows] == [("5.24.0", 0), ("5.0.0", 3)]
    assert "| 2.7.1 |" in table(load_results(tmp_path, "version-floor"))


@pytest.mark.parametrize("flags", [["--record"], ["--keep-envs"]])
def test_floor_flags_without_torch_are_refused_in_one_line(flags: list[str]) -> None:
    done = subprocess.run([sys.executable, "scripts/compat.py", *flags], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 2 and "--record and --keep-envs go with --torch" in done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr  # refused before anything ran


@pytest.mark.parametrize(("torch_version", "refused"), [("2.8.0+cu128", True), ("2.11.0+cu130", False),
                                                        ("2.13.0+cpu", False)])
def test_fsdp2_on_a_torch_below_its_own_minimum_is_refused_naming_the_flag(torch_version: str,
                                                                           refused: bool) -> None:
    """The package's minimum admits torch 2.7, FSDP2 needs ``SHARDED_MIN_TORCH``: ``pretrain`` and
    ``finetune`` (``check_layout``) say so in one sentence; tensor parallelism alone is not refused."""
    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.training.sharded import SHARDED_MIN_TORCH, ParallelLayout, check_layout

    environ = {"WORLD_SIZE": "2"}
    check_layout(ParallelLayout(tp_size=2), environ, torch_version="2.7.0")
    if not refused:
        check_layout(ParallelLayout(fsdp_size=2), environ, torch_version=torch_version)
        return
    with pytest.raises(FlagError) as error:
        check_layout(ParallelLayout(fsdp_size=2), environ, torch_version=torch_version)
    assert error.value.flag == "fsdp_size" and f"needs torch>={SHARDED_MIN_TORCH}" in str(error.value)
    assert torch_version in str(error.value) and "\n" not in str(error.value)
