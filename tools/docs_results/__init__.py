"""Every number in README.md and docs/ comes from a committed results file, rendered here.

A results file is one JSON object under ``docs/results/<name>.json`` written by the command that measured it
(``bench``, the studies in ``scripts/``, ``tools/publish_study.py``…). It names its ``kind`` — the module
``tools.docs_results.<kind>`` that knows how to render it — and its provenance: ``command``, ``machine``,
``versions``, ``date``, and ``replaced`` (rows a later partial run merged in, shown by the view).

A Markdown file embeds a rendered view between two comments. A block region holds a table (with the line under
it naming where its numbers come from) or a list::

    <!-- results: benchmarks-cpu speed_summary -->
    …generated text, never edited by hand…
    <!-- /results -->

An inline region holds one figure inside a sentence written by hand:
``took <!-- results: demo-cpu wall_time -->1 min 42 s<!-- /results --> on``. The sentences around the regions
are the docs' own text; they do not restate a figure.

``render_markdown`` fills every such region from ``<kind module>.<view>(data) -> str``;
``tools/render_docs.py`` rewrites the files, ``--check`` only reports regions that differ
(tests/test_docs_results.py runs it, so a hand edit or a results file changed without re-rendering fails the
suite).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hf_attn_variants.records import format_results

RESULTS_DIR = Path("docs") / "results"
"""Where results files live, relative to the repository root."""

REGION = re.compile(
    r"(?P<open><!-- results: (?P<name>[\w.-]+) (?P<view>\w+) -->)"
    r"(?:(?P<block>\n)(?P<body>.*?)|(?P<inline>[^\n]*?))(?P<close><!-- /results -->)",
    re.DOTALL,
)
"""An embedded view: the opening comment names the results file (without ``.json``) and the view; a newline
right after it makes a block region (``body``), none an inline one (``inline``: one figure, on the line of its
sentence)."""


class ResultsError(ValueError):
    """A results file or an embedded region that cannot be rendered; the message names the file."""


def results_path(root: Path, name: str) -> Path:
    """``<root>/docs/results/<name>.json``; ``ResultsError`` for a name that would leave that folder (an
    absolute path, ``..``)."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ResultsError(f"results {name!r}: a results name is a file name under {RESULTS_DIR}/, such as "
                           "'memory-estimates'.")
    return Path(root) / RESULTS_DIR / f"{name}.json"


def load_results(root: Path, name: str) -> dict[str, Any]:
    """The results object ``name``; ``ResultsError`` naming the file when it is missing or not a JSON object
    with a ``kind``."""
    path = results_path(root, name)
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file (a region of the docs names it).")
    return read_results_file(path)


def read_results_file(path: Path) -> dict[str, Any]:
    """The results object in ``path``; ``ResultsError`` naming it when it is not a JSON object with a
    ``kind``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ResultsError(f"{path}: not valid JSON ({error}).") from None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise ResultsError(f"{path}: a results file is a JSON object with a string 'kind'.")
    return data


def write_results(root: Path, name: str, data: dict[str, Any], *, inline_depth: int | None = None) -> Path:
    """Write ``data`` (which must name its ``kind``) as ``docs/results/<name>.json`` (``format_results``)."""
    if not isinstance(data.get("kind"), str):
        raise ResultsError(f"results {name!r}: data must name its 'kind'.")
    path = results_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_results(data, inline_depth=inline_depth), encoding="utf-8")
    return path


def view_function(kind: str, view: str) -> Callable[[dict[str, Any]], str]:
    """``tools.docs_results.<kind>.<view>``; ``ResultsError`` when either does not exist."""
    module_name = f"{__name__}.{kind.replace('-', '_')}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise ResultsError(f"no renderer module {module_name} for results kind {kind!r}.") from None
    function = getattr(module, view, None)
    if not callable(function) or view.startswith("_"):
        raise ResultsError(f"{module_name} has no view {view!r}.")
    return function


def _fill(root: Path, match: re.Match[str], source: str) -> str:
    """One region re-rendered: a block keeps its lines, an inline region must render one line."""
    name, view = match["name"], match["view"]
    data = load_results(root, name)
    render = view_function(data["kind"], view)
    try:
        body = render(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ResultsError(f"{source}: view {view!r} of {name}.json failed: {error!r}") from error
    if match["block"]:
        return match["open"] + "\n" + body.rstrip("\n") + "\n" + match["close"]
    if "\n" in body.strip():
        raise ResultsError(f"{source}: view {view!r} of {name}.json is more than one figure; give it a block "
                           "region (a newline after the opening comment).")
    return match["open"] + body.strip() + match["close"]


def render_markdown(root: Path, text: str, *, source: str = "<markdown>") -> str:
    """``text`` with every results region re-rendered from its results file."""
    return REGION.sub(lambda match: _fill(root, match, source), text)


def markdown_files(root: Path) -> list[Path]:
    """README.md, CONTRIBUTING.md (when there is one) and every ``docs/*.md`` under ``root``."""
    root = Path(root)
    contributing = [root / "CONTRIBUTING.md"] if (root / "CONTRIBUTING.md").is_file() else []
    return [root / "README.md", *contributing, *sorted((root / "docs").glob("*.md"))]


def render_docs(root: Path, files: Iterable[Path] | None = None, *, check: bool = False) -> list[str]:
    """Re-render the regions of ``files`` (default ``markdown_files(root)``).

    Returns one line per file that changed (with ``check``: that would change; nothing is written).
    """
    changed = []
    for path in files if files is not None else markdown_files(root):
        text = path.read_text(encoding="utf-8")
        rendered = render_markdown(root, text, source=str(path))
        if rendered != text:
            changed.append(f"{path}: results regions are out of date" if check else f"{path}: re-rendered")
            if not check:
                path.write_text(rendered, encoding="utf-8")
    return changed


def used_results(root: Path) -> set[str]:
    """Names of the results files that some region of README.md or docs/ renders."""
    names: set[str] = set()
    for path in markdown_files(root):
        names.update(match["name"] for match in REGION.finditer(path.read_text(encoding="utf-8")))
    return names


__all__ = [
    "REGION",
    "RESULTS_DIR",
    "ResultsError",
    "format_results",
    "load_results",
    "markdown_files",
    "read_results_file",
    "render_docs",
    "render_markdown",
    "results_path",
    "used_results",
    "view_function",
    "write_results",
]
