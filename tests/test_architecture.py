"""The house rules of docs/architecture.md, checked on the source: rooms, arrows, sizes.

Every import inside the package (module level and inside functions) is read with ``ast``; a *room* is a
sub-package (``models``, ``training``, …) or a module at the package root. The rules:

- model code (``models/``) imports nothing of the package outside ``models/``;
- no module imports the package's ``__init__`` (``from hf_attn_variants import …`` inside the package);
- the module graph has no circle, and the room graph follows ``ALLOWED`` (which has none either);
- the package root holds at most 8 modules; no function in the package is longer than 80 lines (issue 36: the
  longest was 92 lines; split a longer one rather than raise the limit);
- the tools hold no maintainers' code (issue 50): every public function and class of a room other than
  ``models/`` (the public model API) is used by the package itself (its own module, another module, the
  console script ``hf_attn_variants_cli``), is an entry point (a subcommand's ``add_arguments``/``run``, an
  entry point in pyproject.toml) or is in ``PUBLIC_API``; what only ``tools/``, ``scripts/`` or the tests use
  lives there.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

import hf_attn_variants

PACKAGE = "hf_attn_variants"
PACKAGE_DIR = Path(hf_attn_variants.__file__).parent
REMOTE_DIR = PACKAGE_DIR / "models" / "remote"
CONSOLE_SCRIPT = PACKAGE_DIR.parent / "hf_attn_variants_cli.py"
PYPROJECT = PACKAGE_DIR.parents[1] / "pyproject.toml"

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
    "registration": {"models", "stock"},
    "__init__": {"models", "stock", "registration"},
}
"""room → the rooms it may import (docs/architecture.md draws the same picture)."""


def module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name → (file, is a package ``__init__``) for every module of the package."""
    modules = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        if REMOTE_DIR in path.parents:  # package data: the committed remote code, never imported in place
            continue
        parts = [PACKAGE, *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = module_files()


def import_target(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The dotted module a ``from … import`` in module ``name`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(name: str) -> set[str]:
    """The package modules ``name`` imports anywhere in its source (``from .x import y`` counts ``.x.y`` when
    that is a module, else ``.x``)."""
    path, is_package = MODULES[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = import_target(name, node, is_package)
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


def model_modules() -> dict[str, Path]:
    """Dotted name → file of every module of ``models/`` (its ``__init__`` included)."""
    return {name: path for name, (path, _) in MODULES.items() if room(name) == "models"}


def module_level_definitions(tree: ast.Module) -> set[str]:
    """Names of the ``class`` and ``def`` statements at module level, also inside ``if``/``try`` blocks (a
    definition chosen by the installed Transformers)."""
    names, pending = set(), list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.If, ast.Try)):
            handlers = getattr(node, "handlers", [])
            pending += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                        *(statement for handler in handlers for statement in handler.body)]
    return names


def test_every_public_name_of_the_model_code_is_a_class_or_function_statement():
    """Every class a reader can import from ``models/`` is a ``class`` statement of its module (so grep and an
    IDE find it); the other names of an ``__all__`` are functions or constants, never a class made at run
    time."""
    import importlib

    made = []
    for name, path in model_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        statements = module_level_definitions(tree)
        module = importlib.import_module(name)
        for public in getattr(module, "__all__", ()):
            value = getattr(module, public)
            defined_here = getattr(value, "__module__", None) == name
            if callable(value) and defined_here and public not in statements:  # a class or a function
                made.append(f"{name}.{public}")
    assert not made, f"public names that are not class or def statements of their module: {made}"


def test_no_class_is_made_by_a_call_in_src():
    """No ``type(name, bases, namespace)`` and no ``types.new_class`` anywhere in the package."""
    calls = []
    for name, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            three_argument_type = isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3
            new_class = isinstance(func, ast.Attribute) and func.attr == "new_class"
            if three_argument_type or new_class:
                calls.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno}")
    assert not calls, calls


def _names_a_class(target: ast.AST) -> bool:
    """``Cls`` (a capitalised name) or ``type(obj)``."""
    if isinstance(target, ast.Name):
        return target.id[:1].isupper()
    return isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "type"


def _method_assignments(tree: ast.Module) -> list[int]:
    """Lines of ``Cls.name = <function, lambda or call>`` and of ``setattr(Cls, …)`` in ``tree``."""
    functions = {node.name for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            method = (isinstance(node.value, (ast.Lambda, ast.Call))
                      or (isinstance(node.value, ast.Name) and node.value.id in functions))
            lines += [node.lineno for target in node.targets
                      if method and isinstance(target, ast.Attribute) and _names_a_class(target.value)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and _names_a_class(node.args[0])):
            lines.append(node.lineno)
    return lines


def test_no_method_is_assigned_onto_a_class_after_its_definition():
    """``Cls.name = <function>`` (or ``type(obj).name = …``, ``setattr(Cls, …)``) outside a class body: a
    method nobody can read in the class. Data attributes (``type(self)._auto_class = None``) are allowed."""
    found = [f"{path.relative_to(PACKAGE_DIR)}:{line}" for path, _ in MODULES.values()
             for line in _method_assignments(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, found


PUBLIC_API = {
    # The entry points of bench/'s two measurements that no subcommand runs: the decoding benchmark
    # (scripts/decoding_bench.py, the GPU check's decoding stage) and the GPU check's side by side of causal
    # LMs (scripts/gpu_check.py's peers stage); docs/architecture.md keeps them in bench/ beside the other
    # measurements of the package's models.
    ("hf_attn_variants.bench.decoding", "measure"),
    ("hf_attn_variants.bench.decoding", "profile_generate"),
    ("hf_attn_variants.bench.side_by_side", "run_side_by_side"),
}
"""(module, name) of public functions and classes that nothing in the package uses, kept on purpose."""

QUALIFIED_NAME = re.compile(rf"\b({PACKAGE}(?:\.\w+)+)[.:](\w+)\b")
"""``hf_attn_variants.x.y.name`` or ``hf_attn_variants.x.y:name`` in a string (a lazy import, an entry
point)."""


def public_names(tree: ast.Module) -> set[str]:
    """The module's public functions and classes: defined at its top level, in its ``__all__`` or not named
    with a leading underscore."""
    listed: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            listed = set(ast.literal_eval(node.value))
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef))
            and (node.name in listed or not node.name.startswith("_"))}


def used_names(name: str, tree: ast.Module, is_package: bool) -> set[tuple[str, str]]:
    """(module, name) pairs that module ``name`` uses: names it imports from a package module, attributes it
    reads from a package module it imported (``report.speedup``), names of its own it uses outside their own
    definition, and qualified names in its strings (a subcommand's module counts its ``add_arguments`` and
    ``run``)."""
    used, modules = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = import_target(name, node, is_package)
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    modules[alias.asname or alias.name] = f"{target}.{alias.name}"
                else:
                    used.add((target, alias.name))
        elif isinstance(node, ast.Import):
            modules |= {alias.asname: alias.name for alias in node.names
                        if alias.asname and alias.name in MODULES}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used |= set(QUALIFIED_NAME.findall(node.value))
            if node.value in MODULES:
                used |= {(node.value, "add_arguments"), (node.value, "run")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            used.add((modules[node.value.id], node.attr))
    for top in tree.body:
        own = getattr(top, "name", None)
        used |= {(name, node.id) for node in ast.walk(top) if isinstance(node, ast.Name) and node.id != own}
    return used


def test_tools_hold_no_maintainers_code():
    """What only tools/, scripts/ or the tests call belongs there (docs/architecture.md), not in the
    package."""
    used, public = set(), {}
    for name, (path, is_package) in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used |= used_names(name, tree, is_package)
        public[name] = public_names(tree)
    used |= used_names("hf_attn_variants_cli", ast.parse(CONSOLE_SCRIPT.read_text(encoding="utf-8")), False)
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    for group in (project.get("scripts", {}), *project.get("entry-points", {}).values()):
        used |= {tuple(value.split(":", 1)) for value in group.values()}
    unused = sorted(f"{name}.{function}" for name, functions in public.items() if room(name) != "models"
                    for function in functions if (name, function) not in used | PUBLIC_API)
    assert not unused, f"public, but nothing in the package uses them (move them to tools/): {unused}"
    stale = sorted(f"{name}.{function}" for name, function in PUBLIC_API
                   if name not in public or function not in public[name] or (name, function) in used)
    assert not stale, f"PUBLIC_API entries no longer needed: {stale}"
