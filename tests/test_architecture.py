"""The house rules of docs/architecture.md, checked on the source: rooms, arrows, sizes.

Every import inside the package (module level and inside functions) is read with ``ast``; a *room* is a
sub-package (``models``, ``training``, …) or a module at the package root. The rules:

- model code (``models/``) imports nothing of the package outside ``models/``;
- no module imports the package's ``__init__`` (``from hf_attn_variants import …`` inside the package);
- the module graph has no circle, and the room graph follows ``ALLOWED`` (which has none either);
- the package root holds at most 8 modules; no function in the package is longer than 80 lines (issue 36: the
  longest was 92 lines; split a longer one rather than raise the limit).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hf_attn_variants

PACKAGE = "hf_attn_variants"
PACKAGE_DIR = Path(hf_attn_variants.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "cli_utils": set(),
    "host_memory": set(),
    "stock": {"models"},
    "records": set(),
    "training": {"models", "cli_utils"},
    "pruning": {"models", "training", "cli_utils"},
    "hub": {"models", "training", "cli_utils"},
    "lengthgen": {"models", "training", "records", "cli_utils"},
    "bench": {"models", "pruning", "training", "records", "cli_utils"},
    "entropy": {"models", "stock", "training", "lengthgen", "records", "cli_utils"},
    "serving": {"models", "stock"},
    "demo": {"models", "training", "hub", "cli_utils"},
    "cli": set(),  # imports its subcommands by name (importlib), so every tool stays lazy
    "__main__": {"cli"},
    "__init__": {"models", "stock"},
}
"""room → the rooms it may import (docs/architecture.md draws the same picture)."""


def module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name → (file, is a package ``__init__``) for every module of the package."""
    modules = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = module_files()


def imported_modules(name: str) -> set[str]:
    """The package modules ``name`` imports anywhere in its source (``from .x import y`` counts ``.x.y`` when
    that is a module, else ``.x``)."""
    path, is_package = MODULES[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                found |= {f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                          for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE}
    return found


GRAPH = {name: imported_modules(name) for name in MODULES}


def room(name: str) -> str:
    """``hf_attn_variants.training.pretrain`` → ``training``; ``hf_attn_variants.cli_utils`` → ``cli_utils``;
    the package itself → ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_model_code_imports_only_model_code():
    outside = {(name, target) for name, targets in GRAPH.items() if room(name) == "models"
               for target in targets if room(target) != "models"}
    assert not outside, f"models/ must not import tools: {sorted(outside)}"


def test_no_module_imports_the_package_init():
    upward = sorted(name for name, targets in GRAPH.items() if name != PACKAGE and PACKAGE in targets)
    assert not upward, f"these modules import hf_attn_variants/__init__.py: {upward}"


def test_rooms_import_only_what_the_picture_allows():
    assert set(ALLOWED) >= {room(name)
                            for name in MODULES}, "a new room: add it to ALLOWED and docs/architecture.md"
    extra = sorted({(room(name), room(target)) for name, targets in GRAPH.items() for target in targets
                    if room(target) != room(name) and room(target) not in ALLOWED[room(name)]})
    assert not extra, f"imports the picture does not allow (room → room): {extra}"


@pytest.mark.parametrize("graph", ["modules", "rooms"])
def test_import_graph_has_no_circle(graph):
    if graph == "modules":
        edges = {name: {t for t in targets if t in GRAPH} for name, targets in GRAPH.items()}
    else:
        edges = ALLOWED
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (circle := visit(nxt, [*path, node])):
                return circle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (circle := visit(start, [])):
            pytest.fail(f"import circle: {' → '.join(circle)}")


def test_package_root_holds_at_most_eight_modules():
    root_modules = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert len(root_modules) <= 8, root_modules


def test_no_function_is_longer_than_80_lines():
    long = []
    for path, _ in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
