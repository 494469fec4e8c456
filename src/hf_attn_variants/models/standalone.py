"""Standalone remote code: the files ``save_pretrained`` and ``export`` write next to the weights.

Inside the package the model code is written once and shared: ``layers.py``, ``compat.py``,
``configuration_common.py`` and ``modeling_common.py`` serve all three families. A Hub folder cannot
ship that layout: Transformers releases before 5.10 copy only the *direct* relative imports of the file
they load, so ``configuration_gau.py → configuration_common.py → layers.py`` fails there with a
``FileNotFoundError``. This module therefore writes each family as two self-contained files, the way
Transformers' modular converter expands ``modular_<model>.py`` into a standalone ``modeling_<model>.py``:

- ``configuration_<family>.py``: the family's config module, ``configuration_common`` and the parts of
  ``layers`` they use;
- ``modeling_<family>.py``: the family's model module, ``modeling_common`` and the parts of ``layers`` they
  use, importing its config classes with the one relative import ``from .configuration_<family> import …``.

Both start with ``compat.py`` whole (the Transformers version check and the shims for APIs that moved
between releases) and carry a header naming the package version and the sources to edit.

Why at save time rather than generated files checked into the repository: the exported text is then
always the package's current source, byte for byte (nothing can drift), and the package keeps one set
of classes for its tools (pruning, training) instead of three copies of every shared class. The
generated files are the same code paths: the bundler copies top-level definitions verbatim and only
drops the relative imports it resolves. Tests load the folders in clean environments with the oldest
supported and the installed Transformers (tests/remote_code.py).

How a bundle is built (``bundle_module``): the entry module is parsed with ``ast``; each top-level
statement it needs pulls in, transitively, the top-level statements that define the names it uses —
from its own module, or from a sibling module it imports with ``from .x import name`` (inlined), or
through an absolute import (hoisted to the top of the file). Statements keep their source order and
their comments; a name defined twice across the inlined modules is an error.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .compat import MIN_TRANSFORMERS_VERSION
from .version import __version__

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE_NAME = "hf_attn_variants"
PRELUDE = "compat"
"""Module emitted whole at the top of every bundle, before any other Transformers import."""
COMMON_CONFIG = "configuration_common"
"""Module emitted whole in every configuration bundle, so a modeling bundle may import any of its names."""


@dataclass
class Statement:
    """One top-level statement of a module: its source text (with leading comments), and the names it
    defines and uses."""

    text: str
    defines: frozenset[str]
    uses: frozenset[str]


@dataclass
class ParsedModule:
    """A package module split into imports and top-level statements."""

    name: str
    docstring: str
    body_text: str
    statements: list[Statement]
    absolute_imports: dict[str, str] = field(default_factory=dict)
    relative_imports: dict[str, str] = field(default_factory=dict)
    all_names: list[str] | None = None

    def definition(self, name: str) -> int | None:
        """Index of the statement that defines ``name``, if any."""
        for index, statement in enumerate(self.statements):
            if name in statement.defines:
                return index
        return None


def _import_line(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    spelled = alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"
    if isinstance(node, ast.Import):
        return f"import {spelled}"
    return f"from {node.module} import {spelled}"


def _local_name(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    if alias.asname is not None:
        return alias.asname
    return alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name


def _defined_names(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the module namespace (through if/try blocks, not into functions)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    names: set[str] = set()
    pending: list[ast.AST] = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(current.name)
            continue
        if isinstance(current, (ast.Import, ast.ImportFrom)):
            names.update(_local_name(current, alias) for alias in current.names)
            continue
        if isinstance(current, ast.Name) and isinstance(current.ctx, ast.Store):
            names.add(current.id)
        pending.extend(ast.iter_child_nodes(current))
    return names


def _used_names(node: ast.stmt) -> set[str]:
    """Every name the statement reads anywhere (an over-approximation: locals are included, and ignored later)."""
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}


def _is_string_expression(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _statement_span(node: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """0-based [start, stop) line span of ``node`` with its decorators and the comment lines right above it."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return first, node.end_lineno or node.lineno


def parse_module(name: str, package_dir: Path = PACKAGE_DIR) -> ParsedModule:
    """Read ``<package_dir>/<name>.py`` and split it into imports and statements."""
    source = (package_dir / f"{name}.py").read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    body = list(tree.body)
    docstring = ""
    body_start = 0
    if body and _is_string_expression(body[0]):
        docstring = "".join(lines[body[0].lineno - 1 : body[0].end_lineno])
        body_start = body[0].end_lineno or 0
        body = body[1:]
    module = ParsedModule(name, docstring, "", [])
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 1:
                raise ValueError(f"{name}.py: only single-dot relative imports can be bundled (line {node.lineno}).")
            for alias in node.names:
                if alias.asname is not None:
                    raise ValueError(f"{name}.py: relative imports must not rename ({alias.name} as {alias.asname}).")
                module.relative_imports[alias.name] = node.module or ""
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                module.absolute_imports[_local_name(node, alias)] = _import_line(node, alias)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            module.all_names = list(ast.literal_eval(node.value))
            continue
        start, stop = _statement_span(node, lines)
        if _is_string_expression(node) and module.statements:  # an attribute docstring belongs to the line above
            module.statements[-1].text += "".join(lines[start:stop])
        elif not isinstance(node, (ast.Import, ast.ImportFrom)):
            text = "".join(lines[start:stop])
            module.statements.append(Statement(text, frozenset(_defined_names(node)), frozenset(_used_names(node))))
    future = "from __future__ import annotations\n"
    module.body_text = "".join(line for line in lines[body_start:] if line != future)
    return module


@dataclass
class Bundle:
    """The result of ``bundle_module``: the text and the package modules it was built from."""

    text: str
    sources: list[str]


class _Bundler:
    """Collects the statements an entry module needs, across the sibling modules it imports."""

    def __init__(self, external: Iterable[str], package_dir: Path) -> None:
        self.external = set(external)
        self.package_dir = package_dir
        self.modules: dict[str, ParsedModule] = {}
        self.needed: dict[str, set[int]] = {}
        self.depends: dict[str, set[str]] = {}
        self.hoisted: dict[str, str] = {}
        self.external_names: dict[str, str] = {}

    def module(self, name: str) -> ParsedModule:
        if name not in self.modules:
            self.modules[name] = parse_module(name, self.package_dir)
            self.needed[name] = set()
            self.depends[name] = set()
        return self.modules[name]

    def require_all(self, name: str) -> None:
        for index in range(len(self.module(name).statements)):
            self.require_statement(name, index)

    def require_statement(self, name: str, index: int) -> None:
        if index in self.needed[name]:
            return
        self.needed[name].add(index)
        for used in sorted(self.modules[name].statements[index].uses):
            self.resolve(name, used)

    def resolve(self, name: str, used: str) -> None:
        """Make ``used``, as seen from module ``name``, available in the bundle."""
        module = self.module(name)
        index = module.definition(used)
        if index is not None:
            self.require_statement(name, index)
        elif used in module.absolute_imports:
            line = module.absolute_imports[used]
            if self.hoisted.setdefault(used, line) != line:
                raise ValueError(f"{used!r} is imported as both {self.hoisted[used]!r} and {line!r}.")
        elif used in module.relative_imports:
            source = module.relative_imports[used]
            if source in self.external:
                self.external_names[used] = source
            elif source == PRELUDE:
                self.module(PRELUDE)
            else:
                self.depends[name].add(source)
                self.resolve(source, used)
        # else: a builtin or a local variable of a function

    def order(self, entry: str) -> list[str]:
        """Inlined modules, each after the modules it takes definitions from (``ValueError`` on a cycle)."""
        result: list[str] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if name in result:
                return
            if name in visiting:
                raise ValueError(f"Circular imports between inlined modules through {name}.py.")
            visiting.add(name)
            for dependency in sorted(self.depends[name]):
                visit(dependency)
            visiting.discard(name)
            result.append(name)

        for name in sorted(self.depends):
            if self.needed[name] and name != entry:
                visit(name)
        visit(entry)
        return result


def _sorted_imports(lines: Iterable[str], skip: set[str]) -> list[str]:
    """Standard-library imports first, then the rest; ``from x import a`` lines of one module merged."""
    plain: set[str] = set()
    merged: dict[str, set[str]] = {}
    for line in lines:
        if line in skip:
            continue
        if line.startswith("from "):
            module, names = line[5:].split(" import ", 1)
            merged.setdefault(module, set()).add(names)
        else:
            plain.add(line)

    def group(module: str) -> int:
        return 0 if module.split(".")[0] in sys.stdlib_module_names else 1

    entries = [(group(line[7:]), line[7:], line) for line in plain]
    entries += [(group(m), m, _from_import(m, sorted(n))) for m, n in merged.items()]
    result, previous = [], None
    for rank, _, line in sorted(entries):
        if previous is not None and rank != previous:
            result.append("")
        result.append(line)
        previous = rank
    return result


def _from_import(module: str, names: list[str], width: int = 110) -> str:
    """``from module import a, b``, wrapped in parentheses one name a line when longer than ``width``."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= width:
        return line
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")"


def package_version() -> str:
    """This package's version (``hf_attn_variants.__version__``, also when it runs from a source tree)."""
    return __version__


def bundle_module(
    entry: str,
    *,
    external: Iterable[str] = (),
    rename_external: str | None = None,
    whole: Iterable[str] = (),
    package_dir: Path = PACKAGE_DIR,
) -> Bundle:
    """One self-contained source file for module ``entry`` of the package.

    ``external``: sibling modules that stay imports instead of being inlined; their names are imported from
    ``rename_external`` (the one file that contains them all). ``whole``: modules included completely
    (besides ``entry`` itself and the prelude). Raises ``ValueError`` if two inlined modules define the
    same name.
    """
    bundler = _Bundler(external, package_dir)
    prelude = bundler.module(PRELUDE)
    for name in (*whole, entry):
        bundler.require_all(name)
    order = bundler.order(entry)
    owners: dict[str, str] = {}
    for name in order:
        for index in bundler.needed[name]:
            for defined in bundler.modules[name].statements[index].defines:
                if owners.setdefault(defined, name) != name:
                    raise ValueError(f"{defined!r} is defined in both {owners[defined]}.py and {name}.py.")
    entry_module = bundler.modules[entry]
    sources = [PRELUDE, *(name for name in order if name != entry), entry]
    header = (
        f"# Generated by {PACKAGE_NAME} {package_version()} from {', '.join(f'{s}.py' for s in sources)}:\n"
        f"# standalone remote code for Transformers >= {MIN_TRANSFORMERS_VERSION} with torch. Do not edit this file;\n"
        f"# edit those modules of the {PACKAGE_NAME} package (src/{PACKAGE_NAME}/models/) and save the model again.\n"
    )
    prelude_imports = set(prelude.absolute_imports.values())
    imports = _sorted_imports(bundler.hoisted.values(), skip=prelude_imports)
    external_imports = []
    if bundler.external_names:
        target = rename_external or min(bundler.external_names.values())
        external_imports.append(f"from .{target} import {', '.join(sorted(bundler.external_names))}")
    parts = [
        header + entry_module.docstring.rstrip("\n") + "\n\nfrom __future__ import annotations\n\n"
        + prelude.body_text.split("\n__all__", 1)[0].strip("\n") + "\n"
    ]
    if imports or external_imports:
        parts.append("\n".join([*imports, *([""] if imports and external_imports else []), *external_imports]) + "\n")
    for name in order:
        statements = [bundler.modules[name].statements[i].text.rstrip("\n") for i in sorted(bundler.needed[name])]
        parts.append(f"# {'-' * 30} from {name}.py {'-' * 30}\n" + "\n\n\n".join(statements) + "\n")
    all_names = [*(prelude.all_names or []), *(entry_module.all_names or [])]
    parts.append("__all__ = [\n" + "".join(f'    "{n}",\n' for n in sorted(set(all_names))) + "]\n")
    return Bundle("\n\n".join(parts), sources)


def configuration_bundle(config_module: str, package_dir: Path = PACKAGE_DIR) -> Bundle:
    """The standalone ``configuration_<family>.py``: the family config, all of ``configuration_common``."""
    return bundle_module(config_module, whole=(COMMON_CONFIG,), package_dir=package_dir)


def modeling_bundle(modeling_module: str, config_module: str, package_dir: Path = PACKAGE_DIR) -> Bundle:
    """The standalone ``modeling_<family>.py``: config classes imported from ``.<config_module>``."""
    external = {path.stem for path in package_dir.glob("configuration_*.py")}
    return bundle_module(modeling_module, external=external, rename_external=config_module, package_dir=package_dir)


def write_standalone_code(save_directory: str | Path, obj: Any) -> list[Path]:
    """Write the standalone remote code of ``obj`` (a config or a model of this package) into ``save_directory``.

    Replaces the files Transformers' ``save_pretrained`` copied (the family modules and the shared modules
    they import) by ``configuration_<family>.py`` and, for a model, ``modeling_<family>.py``. Returns the
    written paths.
    """
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    config = getattr(obj, "config", obj)
    config_module = type(config).code_class().__module__.rsplit(".", 1)[-1]
    bundles = {config_module: configuration_bundle(config_module)}
    if config is not obj:
        modeling_module = type(obj).code_class().__module__.rsplit(".", 1)[-1]
        bundles[modeling_module] = modeling_bundle(modeling_module, config_module)
    written = []
    for name, bundle in bundles.items():
        path = folder / f"{name}.py"
        path.write_text(bundle.text, encoding="utf-8")
        written.append(path)
    inlined = {source for bundle in bundles.values() for source in bundle.sources} - set(bundles)
    for name in inlined:
        (folder / f"{name}.py").unlink(missing_ok=True)
    return written


__all__ = [
    "Bundle",
    "bundle_module",
    "configuration_bundle",
    "modeling_bundle",
    "package_version",
    "parse_module",
    "write_standalone_code",
]
