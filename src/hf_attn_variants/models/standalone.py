"""Standalone remote code: the files a Hub folder holds next to the weights, generated and committed.

In the package the model code is split into modules; a Hub folder holds, per family:

- ``modeling_<family>.py``: the family's own code (its attention, layers and classes, with the family's
  private modules such as ``gau_cache`` inlined);
- ``configuration_<family>.py``: the family's config;
- ``attn_variants_common.py`` (``SHARED_FILE``): the code every family shares (``SHARED_MODULES``, whole),
  byte for byte the same in every folder of one package release, so a reader who audited it once recognises it
  by its sha256 (``shared_code_sha256``, printed in the model card);
- GAU only: ``gau_kernels.py`` (its torch kernels) and ``gau_triton.py`` (its Triton kernels, imported on CUDA
  only), which the modeling file imports.

The family files import the shared file (and the config) with one direct relative import each: every
Transformers release from 5.0 on copies the direct relative imports of the file it loads (releases before 5.10
copy no others, so the shared file imports nothing relatively). The shared import comes first, so an old
Transformers fails with ``compat``'s one sentence before any other Transformers import.

Generated and committed, as Transformers' modular files are: ``write_remote_code`` writes every family's files
to ``REMOTE_DIR`` (the package data folder ``models/remote/``, never imported in place) with a manifest of the
sha256 of each file and of each package module they were generated from. Reviewers read the exported code in
the change that alters it, and the package's tests regenerate it and fail on any difference. The bundler
copies top-level definitions verbatim and only drops the relative imports it resolves: ``parse_module`` reads
each module with ``ast``; a bundle pulls in, transitively, the statements that define the names the included
statements use, hoisting absolute imports; statements keep their source order and comments. Names imported
from ``PACKAGE_ONLY_MODULES`` (this module) are dropped, from the imports and from class bases.

Saving: ``RemoteCodeSavingMixin``, a base of the families' config and model base classes in the package only,
gives ``save_pretrained`` its second step: after Transformers' own save it copies the committed files of the
object's family into the folder (``write_standalone_code``), refusing when they are stale. Exported classes do
not have the mixin: their files are already standalone, and Transformers' own ``save_pretrained`` copies them
as they are.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .compat import MIN_TRANSFORMERS_VERSION
from .version import __version__

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE_NAME = "hf_attn_variants"
REMOTE_DIR = PACKAGE_DIR / "remote"
"""The committed exported files: ``attn_variants_common.py`` once, each family's files in ``<family>/``."""
MANIFEST = "manifest.json"
REFRESH_COMMAND = "python tools/remote_code.py"
"""The command (from a source checkout) that regenerates ``REMOTE_DIR``."""
PACKAGE_ONLY_MODULES = ("standalone",)
"""Modules whose names exported code never holds: their imports are dropped and their classes left out of the
bases of the classes that name them (``RemoteCodeSavingMixin``)."""
PRELUDE = "compat"
"""Module emitted first and whole in the shared file: the Transformers version check, before other imports."""
SHARED_MODULES = ("compat", "layers", "configuration_common", "modeling_common", "tensor_parallel")
"""The modules every family uses; the shared file holds all of them, whole."""
SHARED_FILE = "attn_variants_common"
SEPARATE_FILES = ("gau_kernels", "gau_triton")
"""Modules exported as files of their own, imported by the family file: GAU's torch kernels (plain tensor
functions, so the family file reads as the model) and its Triton kernels (imported on CUDA only)."""


@dataclass
class Statement:
    """One top-level statement of a module.

    Attributes:
        text: its source text, with the comment lines just above it.
        defines: the names it binds at module level.
        uses: every name it reads (locals included; unknown names are ignored when resolving).
    """

    text: str
    defines: frozenset[str]
    uses: frozenset[str]
    compound: bool = False
    """A function or class: two blank lines around it, as in the source (none between plain assignments)."""


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
        """The statement that defines a name.

        Args:
            name: a module-level name.

        Returns:
            Its index in ``statements``, or ``None`` when the module does not define it.
        """
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
    """Names a top-level statement binds at module level (through if/try blocks, not into functions)."""
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
    """Every name the statement reads anywhere (over-approximated: locals are included, and ignored later)."""
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}


def _is_string_expression(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _statement_span(node: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """0-based [start, stop) line span of ``node`` with its decorators and the comment lines just above it."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return first, node.end_lineno or node.lineno


def _without_bases(text: str, node: ast.ClassDef, names: set[str], first_line: int) -> str:
    """``text`` (a class statement from 0-based line ``first_line``) without the bases ``names``.

    The header is rewritten; the body stays verbatim.
    """
    kept = [base for base in node.bases if not (isinstance(base, ast.Name) and base.id in names)]
    if len(kept) == len(node.bases):
        return text
    lines = text.splitlines(keepends=True)
    header_end = node.body[0].lineno - 1 - first_line
    header = "".join(lines[:header_end])
    spelled = ", ".join(ast.unparse(base) for base in kept)
    header = re.sub(rf"class {node.name}\(.*?\):", f"class {node.name}({spelled}):" if kept
                    else f"class {node.name}:", header, count=1, flags=re.S)
    return header + "".join(lines[header_end:])


def parse_module(name: str, package_dir: Path = PACKAGE_DIR) -> ParsedModule:
    """Read a package module and split it into imports and statements.

    Args:
        name: the module, e.g. ``"layers"`` for ``<package_dir>/layers.py``.
        package_dir: the folder of the modules.

    Returns:
        The parsed module: its docstring, statements, absolute and relative imports and ``__all__``.

    Raises:
        ValueError: a relative import that is not single-dot or that renames (the bundler cannot resolve it).
    """
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
    package_only: set[str] = set()
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.ImportFrom) and node.level and node.module in PACKAGE_ONLY_MODULES:
            package_only.update(alias.asname or alias.name for alias in node.names)
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level != 1:
                raise ValueError(f"{name}.py: only single-dot relative imports can be bundled "
                                 f"(line {node.lineno}).")
            for alias in node.names:
                if alias.asname is not None:
                    raise ValueError(f"{name}.py: relative imports must not rename "
                                     f"({alias.name} as {alias.asname}).")
                module.relative_imports[alias.name] = node.module or ""
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                module.absolute_imports[_local_name(node, alias)] = _import_line(node, alias)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            module.all_names = list(ast.literal_eval(node.value))
            continue
        start, stop = _statement_span(node, lines)
        if _is_string_expression(node) and module.statements:  # attribute docstrings belong to the line above
            module.statements[-1].text += "".join(lines[start:stop])
        elif not isinstance(node, (ast.Import, ast.ImportFrom)):
            text = "".join(lines[start:stop])
            if isinstance(node, ast.ClassDef) and package_only:
                text = _without_bases(text, node, package_only, start)
            compound = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            module.statements.append(Statement(text, frozenset(_defined_names(node)),
                                               frozenset(_used_names(node)), compound))
    future = "from __future__ import annotations\n"
    module.body_text = "".join(line for line in lines[body_start:] if line != future)
    return module


@dataclass
class Bundle:
    """The result of ``bundle_module``: the text and the package modules it was built from."""

    text: str
    sources: list[str]


class _Bundler:
    """Collects the statements the bundled modules need, across the sibling modules they import.

    ``external``: sibling module → the exported file (stem) that holds it; names from those stay imports.
    """

    def __init__(self, external: dict[str, str], package_dir: Path) -> None:
        self.external = external
        self.package_dir = package_dir
        self.modules: dict[str, ParsedModule] = {}
        self.needed: dict[str, set[int]] = {}
        self.depends: dict[str, set[str]] = {}
        self.hoisted: dict[str, str] = {}
        self.imported: dict[str, dict[str, None]] = {}

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
                self.imported.setdefault(self.external[source], {})[used] = None
            else:
                self.depends[name].add(source)
                self.resolve(source, used)
        # else: a builtin or a local variable of a function

    def order(self) -> list[str]:
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

        for name in sorted(self.depends, key=lambda n: (n != PRELUDE, n)):
            if self.needed[name]:
                visit(name)
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


def _filled(items: list[str], width: int = 110) -> str:
    """``items`` comma-separated in lines indented by four spaces and at most ``width`` long."""
    return textwrap.fill(", ".join(items) + ",", width, initial_indent="    ", subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)


def _from_import(module: str, names: list[str], width: int = 110) -> str:
    """``from module import a, b``, the names in parentheses filling lines when longer than ``width``."""
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= width:
        return line
    return f"from {module} import (\n{_filled(names, width)}\n)"


def package_version() -> str:
    """This package's version, also when it runs from a source tree.

    Returns:
        ``hf_attn_variants.__version__``, which every exported file's header names.
    """
    return __version__


def _header(sources: list[str]) -> str:
    return (
        f"# Generated by {PACKAGE_NAME} {package_version()} from {', '.join(f'{s}.py' for s in sources)}:\n"
        f"# standalone remote code for Transformers >= {MIN_TRANSFORMERS_VERSION} with torch. "
        "Do not edit this file;\n"
        f"# it is generated from those modules of {PACKAGE_NAME}.models.\n"
    )


def bundle_module(
    whole: str | Iterable[str],
    *,
    external: dict[str, str] | None = None,
    docstring: str | None = None,
    package_dir: Path = PACKAGE_DIR,
) -> Bundle:
    """One source file holding modules ``whole`` of the package and what they need of their siblings.

    The sibling modules' statements are inlined, except those of ``external``, whose names stay relative
    imports of that file. The prelude (``compat``), when bundled, comes first with its own imports.

    Args:
        whole: the module (or modules) held completely, e.g. ``"modeling_gau"``.
        external: module → exported file stem whose names stay imports (``{"layers": SHARED_FILE}``).
        docstring: the file's docstring (default: the first module's).
        package_dir: the folder of the modules.

    Returns:
        The file's text and the modules it was built from.

    Raises:
        ValueError: two inlined modules define the same name, or their imports form a circle.
    """
    entries = [whole] if isinstance(whole, str) else list(whole)
    bundler = _Bundler(dict(external or {}), package_dir)
    for name in entries:
        bundler.require_all(name)
    order = bundler.order()
    owners: dict[str, str] = {}
    for name in order:
        for index in bundler.needed[name]:
            for defined in bundler.modules[name].statements[index].defines:
                if owners.setdefault(defined, name) != name:
                    raise ValueError(f"{defined!r} is defined in both {owners[defined]}.py and {name}.py.")
    if docstring is None:
        docstring = bundler.modules[entries[0]].docstring
    parts = [_header(order) + docstring.rstrip("\n") + "\n\nfrom __future__ import annotations\n"]
    prelude_imports: set[str] = set()
    if PRELUDE in order:
        prelude = bundler.modules[PRELUDE]
        prelude_imports = set(prelude.absolute_imports.values())
        parts.append(prelude.body_text.split("\n__all__", 1)[0].strip("\n") + "\n")
    # Relative imports first: the shared file's version check runs before any other Transformers import.
    relative = [_from_import(f".{target}", sorted(names))
                for target, names in sorted(bundler.imported.items())]
    imports = _sorted_imports(bundler.hoisted.values(), skip=prelude_imports)
    if relative or imports:
        parts.append("\n\n".join("\n".join(group) for group in (relative, imports) if group) + "\n")
    for name in order:
        if name == PRELUDE:
            continue
        statements = [bundler.modules[name].statements[i] for i in sorted(bundler.needed[name])]
        text = statements[0].text.rstrip("\n")
        for previous, statement in zip(statements, statements[1:]):
            gap = "\n\n\n" if previous.compound or statement.compound else "\n"
            text += gap + statement.text.rstrip("\n")
        parts.append(f"# {'-' * 30} from {name}.py {'-' * 30}\n" + text + "\n")
    all_names = [n for name in entries for n in bundler.modules[name].all_names or []]
    parts.append("__all__ = [\n" + _filled([f'"{n}"' for n in sorted(set(all_names))]) + "\n]\n")
    return Bundle("\n\n".join(parts), order)


SHARED_DOCSTRING = '''\
"""The model code the hf_attn_variants families share: Transformers compatibility, building blocks (RoPE,
norms, masks, key counts nᵢ), the config base, the backbone, the task heads and two tensor-parallel styles.

This file is the same, byte for byte, in every exported folder of one package release (its sha256 is in the
model card); ``modeling_<family>.py`` holds the family's own code and imports what it needs from here.
"""'''


SHARED_REGISTRATIONS = '''
register_parallel_styles()
"""What importing this file registers with Transformers: the two parallel styles the families' tensor-parallel
plans name (``tp_plan="auto"`` looks them up by name). The package registers them in its registration module,
``hf_attn_variants.registration``."""
'''
"""The shared file's last statement: the registration exported code does on its own import."""


def shared_bundle(package_dir: Path = PACKAGE_DIR) -> Bundle:
    """The shared file: ``SHARED_MODULES`` whole, then ``SHARED_REGISTRATIONS``.

    Args:
        package_dir: the folder of the modules.

    Returns:
        The shared file's bundle.
    """
    bundle = bundle_module(SHARED_MODULES, docstring=SHARED_DOCSTRING, package_dir=package_dir)
    return Bundle(bundle.text + SHARED_REGISTRATIONS, bundle.sources)


def shared_code_sha256(remote_dir: Path = REMOTE_DIR) -> str:
    """The sha256 of the committed shared file, the one ``save_pretrained`` copies into every folder.

    Args:
        remote_dir: the folder of the committed remote code.

    Returns:
        The hex digest (printed in model cards).
    """
    return sha256_file(remote_dir / f"{SHARED_FILE}.py")


def _external_files(family_config: str | None, package_dir: Path) -> dict[str, str]:
    """Module → exported file for a family bundle: shared modules, separate files, the family's config."""
    external = {name: SHARED_FILE for name in SHARED_MODULES}
    external.update({name: name for name in SEPARATE_FILES})
    external.update({path.stem: family_config or path.stem for path in package_dir.glob("configuration_*.py")
                     if path.stem not in SHARED_MODULES})
    return external


def configuration_bundle(config_module: str, package_dir: Path = PACKAGE_DIR) -> Bundle:
    """The standalone ``configuration_<family>.py``: the family config, importing from the shared file.

    Args:
        config_module: the family's config module, e.g. ``"configuration_gau"``.
        package_dir: the folder of the modules.

    Returns:
        The file's bundle.
    """
    external = _external_files(None, package_dir)
    del external[config_module]
    return bundle_module(config_module, external=external, package_dir=package_dir)


def modeling_bundle(modeling_module: str, config_module: str, package_dir: Path = PACKAGE_DIR) -> Bundle:
    """The standalone ``modeling_<family>.py``, with the family's private modules inlined.

    Config classes come from ``.<config_module>``, shared code from the shared file.

    Args:
        modeling_module: the family's modeling module, e.g. ``"modeling_gau"``.
        config_module: the family's config module, e.g. ``"configuration_gau"``.
        package_dir: the folder of the modules.

    Returns:
        The file's bundle.
    """
    return bundle_module(modeling_module, external=_external_files(config_module, package_dir),
                         package_dir=package_dir)


def exported_files(config_module: str, modeling_module: str | None = None,
                   package_dir: Path = PACKAGE_DIR) -> dict[str, Bundle]:
    """Everything a folder of this family holds, generated from the sources.

    Args:
        config_module: the family's config module, e.g. ``"configuration_gau"``.
        modeling_module: the family's modeling module; ``None`` for a folder of the config alone.
        package_dir: the folder of the modules.

    Returns:
        File stem → bundle: the shared file, the config, and the modeling file with the files it imports.
    """
    bundles = {SHARED_FILE: shared_bundle(package_dir),
               config_module: configuration_bundle(config_module, package_dir)}
    if modeling_module is not None:
        modeling = modeling_bundle(modeling_module, config_module, package_dir)
        bundles[modeling_module] = modeling
        for name in SEPARATE_FILES:
            if f"from .{name} import" in modeling.text:
                external = _external_files(config_module, package_dir)
                del external[name]
                bundles[name] = bundle_module(name, external=external, package_dir=package_dir)
    return bundles


def family_folder(config_module: str) -> str:
    """The folder of ``REMOTE_DIR`` holding a family's files.

    Args:
        config_module: the family's config module, e.g. ``"configuration_gau"``.

    Returns:
        The folder's name, e.g. ``"gau"``.
    """
    return config_module.removeprefix("configuration_")


def families(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """The config modules of the package's families.

    Args:
        package_dir: the folder of the modules.

    Returns:
        ``configuration_<family>`` of every family, in name order.
    """
    return sorted(path.stem for path in package_dir.glob("configuration_*.py")
                  if path.stem not in SHARED_MODULES)


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes.

    Args:
        path: the file.

    Returns:
        The hex digest.
    """
    return hashlib.sha256(path.read_bytes()).hexdigest()


def remote_code_files(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """Every file of ``REMOTE_DIR`` as the package's sources generate it.

    The shared file once at the top, each family's other files in its folder, and ``MANIFEST``: the sha256 of
    every file and of every package module they were generated from (this one and ``version`` included).

    Args:
        package_dir: the folder of the source modules.

    Returns:
        Path relative to ``REMOTE_DIR`` → text.
    """
    files = {f"{SHARED_FILE}.py": shared_bundle(package_dir).text}
    sources = {"standalone", "version", *SHARED_MODULES}
    for config_module in families(package_dir):
        modeling_module = config_module.replace("configuration_", "modeling_", 1)
        for name, bundle in exported_files(config_module, modeling_module, package_dir).items():
            sources.update(bundle.sources)
            if name != SHARED_FILE:
                files[f"{family_folder(config_module)}/{name}.py"] = bundle.text
    manifest = {
        "generated_by": REFRESH_COMMAND,
        "files": {path: hashlib.sha256(text.encode("utf-8")).hexdigest()
                  for path, text in sorted(files.items())},
        "sources": {f"{name}.py": sha256_file(package_dir / f"{name}.py") for name in sorted(sources)},
    }
    files[MANIFEST] = json.dumps(manifest, indent=2) + "\n"
    return files


def write_remote_code(remote_dir: Path = REMOTE_DIR, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Regenerate ``remote_dir`` from the sources: write ``remote_code_files`` and remove any other file.

    Args:
        remote_dir: the folder to write.
        package_dir: the folder of the source modules.

    Returns:
        The written paths.
    """
    files = remote_code_files(package_dir)
    for stale in remote_dir.rglob("*") if remote_dir.exists() else []:
        if stale.is_file() and stale.relative_to(remote_dir).as_posix() not in files:
            stale.unlink()
    written = []
    for relative, text in files.items():
        path = remote_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check_remote_code(remote_dir: Path = REMOTE_DIR, package_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """The manifest of ``remote_dir`` once its files and the sources they came from are what it records.

    Args:
        remote_dir: the folder of the committed remote code.
        package_dir: the folder of the source modules the manifest names.

    Returns:
        The manifest: ``files`` and ``sources`` (relative path → sha256) and ``generated_by``.

    Raises:
        RuntimeError: a source module changed since the files were generated, or a file was edited or is
            missing; the message names the file and ``REFRESH_COMMAND``.
    """
    manifest_path = remote_dir / MANIFEST
    if not manifest_path.is_file():
        raise RuntimeError(f"The exported model code is missing ({manifest_path}); regenerate it with "
                           f"`{REFRESH_COMMAND}` from a source checkout.")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    for folder, kind, recorded in ((package_dir, "source module", manifest["sources"]),
                                   (remote_dir, "exported file", manifest["files"])):
        for relative, digest in recorded.items():
            path = folder / relative
            if not path.is_file() or sha256_file(path) != digest:
                raise RuntimeError(
                    f"The exported model code in {remote_dir} is stale: the {kind} {relative} is not the one "
                    f"it was generated from; regenerate it with `{REFRESH_COMMAND}` from a source checkout.")
    return manifest


def code_class(cls: type) -> type:
    """The class whose module holds the code of ``cls``.

    Args:
        cls: a class of this package, or a subclass made at run time (FSDP2's ``fully_shard`` turns a model's
            class into one defined in torch; sharded training adds its fixes).

    Returns:
        ``cls`` itself, or its first base defined in ``hf_attn_variants.models``.
    """
    package = __name__.rpartition(".")[0]
    return next(base for base in cls.__mro__ if base.__module__.rpartition(".")[0] == package)


def write_standalone_code(save_directory: str | os.PathLike[str], obj: Any, remote_dir: Path = REMOTE_DIR
                          ) -> list[Path]:
    """Copy the committed remote code of ``obj`` (a config or model of this package) into ``save_directory``.

    Replaces the files Transformers' ``save_pretrained`` copied (the family modules and the modules they
    import) by the family's files of ``remote_dir``, after ``check_remote_code`` (nothing is written when it
    refuses).

    Args:
        save_directory: the folder being saved.
        obj: a config or model of this package.
        remote_dir: the folder of the committed remote code.

    Returns:
        The written paths.

    Raises:
        RuntimeError: the committed remote code is stale (``check_remote_code``).
    """
    manifest = check_remote_code(remote_dir)
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    config = getattr(obj, "config", obj)
    config_module = code_class(type(config)).__module__.rsplit(".", 1)[-1]
    family = family_folder(config_module)
    names = [f"{SHARED_FILE}.py", f"{family}/{config_module}.py"]
    if config is not obj:
        names += [path for path in manifest["files"]
                  if path.startswith(f"{family}/") and path not in names]
    written = []
    for relative in names:
        written.append(Path(shutil.copyfile(remote_dir / relative, folder / Path(relative).name)))
    # What Transformers copied besides them: the package modules it saw imported (a config save copies the
    # shared modules too). Files of this family written by an earlier save (a model's kernels when the config
    # alone is saved again) stay.
    exported = {Path(relative).name for relative in manifest["files"]}
    for name in set(manifest["sources"]) - exported:
        (folder / name).unlink(missing_ok=True)
    return written


HUB_ARGUMENTS = ("repo_id", "commit_message", "commit_description", "private", "token", "create_pr",
                 "revision")
"""Keyword arguments of ``save_pretrained(..., push_to_hub=True)`` that belong to the upload."""


def family_auto_map(obj: Any) -> dict[str, str]:
    """The ``auto_map`` of the family of ``obj``.

    Args:
        obj: a model of this package.

    Returns:
        Auto class name → ``"<module>.<class>"``: every class of the model's module registered for an Auto
        class (``register_for_auto_class``), and its config for ``AutoConfig``.
    """
    module = sys.modules[code_class(type(obj)).__module__]
    config_class = code_class(type(obj.config))
    auto_map = {"AutoConfig": f"{config_class.__module__.rsplit('.', 1)[-1]}.{config_class.__name__}"}
    for name in getattr(module, "__all__", ()):
        auto_class = getattr(getattr(module, name), "__dict__", {}).get("_auto_class")
        if isinstance(auto_class, str):
            auto_map[auto_class] = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    return auto_map


class RemoteCodeSavingMixin:
    """Package-only base of ``AttnVariantConfig`` and ``AttnVariantPreTrainedModel``.

    Its ``save_pretrained`` also writes the family's standalone remote code.

    Exported files leave this class out of those bases (``PACKAGE_ONLY_MODULES``): a model loaded from a Hub
    folder saves with Transformers' own ``save_pretrained``, which copies its files as they are.
    """

    def save_pretrained(self, save_directory: str | os.PathLike[str], *args: Any, push_to_hub: bool = False,
                        **kwargs: Any) -> Any:
        """Transformers' ``save_pretrained``, then ``write_standalone_code`` for a registered class.

        A model also gets its family's full ``auto_map`` (``family_auto_map``), and ``push_to_hub`` uploads
        only after the code was copied.

        Args:
            save_directory: the folder to write.
            *args: Transformers' other positional arguments.
            push_to_hub: upload the folder once written (``HUB_ARGUMENTS`` in ``kwargs`` go to the upload).
            **kwargs: Transformers' other keyword arguments.

        Returns:
            What Transformers' ``save_pretrained`` returns.

        Raises:
            RuntimeError: the committed remote code is stale (``check_remote_code``); nothing is written.
        """
        save = super().save_pretrained  # type: ignore[misc]
        if getattr(self, "_auto_class", None) is None:
            return save(save_directory, *args, push_to_hub=push_to_hub, **kwargs)
        check_remote_code()  # before anything is written: a stale folder refuses the whole save
        if hasattr(self, "config"):
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **family_auto_map(self)}
        hub = {name: kwargs.pop(name) for name in HUB_ARGUMENTS if name in kwargs}
        run_time_class = type(self) is not code_class(type(self))
        # Transformers would copy that class's module as the code; the writer alone writes ours
        if run_time_class:
            type(self)._auto_class = None  # type: ignore[attr-defined]
        try:
            result = save(save_directory, *args, **kwargs)
        finally:
            if run_time_class:
                del type(self)._auto_class  # type: ignore[attr-defined]
        write_standalone_code(save_directory, self)
        if push_to_hub:
            push = self.push_to_hub  # type: ignore[attr-defined]
            push(hub.pop("repo_id", os.path.basename(os.path.normpath(save_directory))), **hub)
        return result


__all__ = [
    "Bundle",
    "RemoteCodeSavingMixin",
    "SHARED_FILE",
    "SHARED_MODULES",
    "bundle_module",
    "check_remote_code",
    "code_class",
    "configuration_bundle",
    "exported_files",
    "family_auto_map",
    "modeling_bundle",
    "package_version",
    "parse_module",
    "remote_code_files",
    "shared_bundle",
    "shared_code_sha256",
    "write_remote_code",
    "write_standalone_code",
]
