"""How ``make test`` spreads the suite over its xdist workers (``pytest_xdist_make_scheduler`` in
tests/conftest.py): a document's blocks stay together and in order, and so do the tests of each module that
shares one expensive fixture; every other test is scheduled on its own. Also where the suite's temporary
files go (``temporary_files_in_the_basetemp``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ONE_WORKER_MODULES, inductor_cache_default, pytest_xdist_make_scheduler

ROOT = Path(__file__).resolve().parents[1]


def scheduler(dist: str = "load"):  # type: ignore[no-untyped-def]
    values = {"dist": dist, "tx": ["2*popen"]}
    config = SimpleNamespace(getvalue=values.__getitem__, option=SimpleNamespace(loadscopereorder=True))
    return pytest_xdist_make_scheduler(config, None)


def test_documents_and_one_worker_modules_are_one_unit_each_and_other_tests_their_own() -> None:
    split = scheduler()._split_scope
    assert split("docs/gau.md::line:31,column:1") == split("docs/gau.md::line:90,column:1") == "docs/gau.md"
    for module in ONE_WORKER_MODULES:
        assert split(f"{module}::test_a") == split(f"{module}::test_b[x-y]") == module
    assert split("tests/test_wheel.py::test_a") == "tests/test_wheel.py::test_a"
    assert split("tests/test_wheel.py::test_b") != split("tests/test_wheel.py::test_a")


def test_other_dist_modes_are_left_to_xdist() -> None:
    assert scheduler("loadfile") is None


@pytest.mark.parametrize("module", sorted(ONE_WORKER_MODULES))
def test_each_one_worker_module_exists_and_has_a_module_scoped_fixture(module: str) -> None:
    """A renamed module or a fixture that is no longer module-scoped would leave a stale entry."""
    path = ROOT / module
    assert path.is_file(), f"{module} is listed in ONE_WORKER_MODULES but does not exist"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scopes = [keyword.value.value for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
              for decorator in node.decorator_list if isinstance(decorator, ast.Call)
              for keyword in decorator.keywords
              if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant)]
    assert "module" in scopes, f"{module} has no module-scoped fixture: drop it from ONE_WORKER_MODULES"


def test_temporary_files_of_tests_and_their_subprocesses_go_under_the_basetemp(
        temporary_files_in_the_basetemp: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """torchrun makes a ``torchelastic_*`` log folder in the temporary folder at every launch, and nothing
    removes it: the suite's subprocesses inherit ``TMPDIR``, so such folders end under the base folder that
    pytest prunes. Inductor's cache still resolves to the machine's one (else every run would start cold)."""
    folder = temporary_files_in_the_basetemp
    assert folder.is_relative_to(tmp_path_factory.getbasetemp())
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True)
    assert Path(child.stdout.strip()) == folder
    inductor = inductor_cache_default()
    assert inductor.parent == folder and inductor.is_symlink()
    assert not inductor.resolve().is_relative_to(folder), inductor.resolve()
