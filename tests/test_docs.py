"""The docs are tests: every ```python and ```bash block of README.md and docs/*.md runs here, with Sybil.

How it works (the collection hook is ``pytest_pycollect_makemodule`` in tests/conftest.py, which adds one
Sybil file collector per document under this module, so ``pytest tests`` — ``make test`` — collects the docs
too):

- **Python blocks** run through :func:`run_python_block`. The blocks of one file share one namespace and run
  in order, in a temporary working folder of their own (``runs/…`` paths of the docs land there). A block
  followed by ``<!-- output -->`` and a ```text block must print exactly that text (its stdout is compared).
  Under pytest-xdist every block of a file goes to the same worker, in order (``pytest_xdist_make_scheduler``
  in tests/conftest.py).
- **Bash blocks** run through :func:`run_cli_block`: each command must be the project's own command line
  (``hf-attn-variants …`` or ``python -m hf_attn_variants …``, optionally after ``VAR=value`` assignments),
  and it runs in-process through ``hf_attn_variants.cli.main`` in the file's working folder; a non-zero exit
  fails the block. Any other command (``make``, ``torchrun``, ``vllm``, ``pip`` …) is an error, so such a
  block must say why it is not run.
- **Skipping** is explicit, with Sybil's Markdown skip directive right before the block, and the reason is
  shown in pytest's summary (``-ra``):

  - ``<!-- skip: next "full size: hours on a CPU; the tiny run below is the same command" -->``;
  - ``<!-- skip: next needs(gpus=8) -->``, ``needs(nodes=2)``, ``needs(network=True)``,
    ``needs(modules=("vllm",))``: :func:`needs` returns the reason, or ``None`` — then the block runs — when
    this machine has what the block needs (GPUs, installed packages).

A block that takes more than a few seconds states a smaller size that runs here next to the full one.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import logging
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""Every document whose blocks run (collected by tests/conftest.py)."""

KNOWN_LANGUAGES = frozenset({"python", "bash", "text", "yaml", "json", "toml", "markdown", "diff"})
"""Fence languages the docs may use. Only ``python`` and ``bash`` run; the others are data or output. A
``py``/``sh``/``shell``/``console`` block would escape the runner, so
``test_every_code_block_has_a_known_language`` refuses it."""

DOCUMENTS = (*DOCUMENTS[:1], ROOT / "CONTRIBUTING.md", *DOCUMENTS[1:])

OUTPUT_BLOCK = re.compile(r"[ \t]*\n*<!-- output -->\n```text\n(?P<text>.*?)```", re.DOTALL)
"""The output a python block prints, shown right after it: ``<!-- output -->`` then a ```text block."""

CLI_PREFIXES: tuple[tuple[str, ...], ...] = (("hf-attn-variants",), ("python", "-m", "hf_attn_variants"),
                                            ("python3", "-m", "hf_attn_variants"))
"""How a bash block may spell the project's command line."""

SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1"})


def needs(*, gpus: int = 0, nodes: int = 1, modules: Sequence[str] = (), network: bool = False) -> str | None:
    """The reason a docs block cannot run here, or ``None`` when this machine has what it needs.

    ``gpus``: CUDA devices the block needs; ``nodes``: machines (more than one is never available here);
    ``modules``: importable packages (e.g. ``("vllm",)``); ``network``: the block talks to the Hub or another
    server (the docs tests do not use the network). Used in the docs as ``<!-- skip: next needs(gpus=8) -->``.
    """
    if gpus < 0 or nodes < 1:
        raise ValueError(f"needs: gpus must be >= 0 and nodes >= 1, got gpus={gpus}, nodes={nodes}.")
    if isinstance(modules, str):
        raise TypeError(f"needs: modules must be a sequence of names, got the string {modules!r}.")
    reasons = []
    if nodes > 1:
        reasons.append(f"{nodes} nodes")
    if gpus:
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < gpus:
            reasons.append(f"{gpus} GPU{'s' if gpus > 1 else ''} ({found} here)")
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        reasons.append(", ".join(missing) + " (not installed here)")
    if network:
        reasons.append("the network (the docs tests do not use it)")
    return "needs " + "; ".join(reasons) if reasons else None


def shell_commands(source: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: backslash continuations joined, comments and empty
    lines dropped, words split as the shell does (``shlex``). ``ValueError`` for pipes, redirections or
    lists."""
    commands = []
    for line in source.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        operators = SHELL_OPERATORS.intersection(words)
        if operators:
            raise ValueError(f"the docs runner runs one command per line, without {sorted(operators)}: "
                             f"{line!r}")
        commands.append(words)
    return commands


def _cli_arguments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """``(environment assignments, arguments after the program)`` of one command of a bash block."""
    environment = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words[0].split("=", 1)
        environment[name] = value
        words = words[1:]
    for prefix in CLI_PREFIXES:
        if tuple(words[: len(prefix)]) == prefix:
            return environment, words[len(prefix) :]
    raise ValueError(
        f"`{shlex.join(words)}` is not the project's command line (hf-attn-variants …); the docs runner runs "
        "only that. Put `<!-- skip: next \"why it cannot run here\" -->` (or `needs(...)`) before the block."
    )


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, restoring the previous values."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _process_wide_settings() -> Iterator[None]:
    """Restore what a command changes for the whole process: the commands set Transformers' and datasets'
    verbosity and progress bars and configure logging, as a command line should; in this test process that
    would leak into every later test of the worker (Transformers' common tests read its warnings)."""
    import datasets
    import transformers

    hf_logging = transformers.utils.logging
    saved = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(),
             datasets.utils.logging.get_verbosity(), datasets.is_progress_bar_enabled())
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    package_level = logging.getLogger("hf_attn_variants").level
    try:
        yield
    finally:
        hf_logging.set_verbosity(saved[0])
        (hf_logging.enable_progress_bar if saved[1] else hf_logging.disable_progress_bar)()
        datasets.utils.logging.set_verbosity(saved[2])
        (datasets.enable_progress_bars if saved[3] else datasets.disable_progress_bars)()
        root.handlers[:], root.level = root_state[0], root_state[1]
        logging.getLogger("hf_attn_variants").setLevel(package_level)


def run_cli_block(example: Example) -> None:
    """Run every command of a ```bash block in-process with ``hf_attn_variants.cli.main``, in order; the
    block fails on the first command that exits with a non-zero status."""
    from hf_attn_variants.cli import main

    for words in shell_commands(str(example.parsed)):
        environment, arguments = _cli_arguments(words)
        with _environment(environment), _process_wide_settings():
            try:
                status = main(arguments)
            except SystemExit as stop:  # argparse's errors and --help
                status = stop.code if isinstance(stop.code, int) else 1
        if status:
            raise AssertionError(f"`{shlex.join(words)}` exited with status {status}")


def expected_output(example: Example) -> str | None:
    """The text of the ``<!-- output -->`` block right after ``example``, or ``None`` when there is none."""
    match = OUTPUT_BLOCK.match(example.document.text, example.end)
    return match["text"] if match else None


def run_python_block(example: Example) -> None:
    """Run a ```python block in the document's namespace (its line numbers as in the document); when an output
    block follows it, what the block prints must equal that text."""
    code = compile("\n" * example.line + str(example.parsed), example.path, "exec")
    expected = expected_output(example)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed) if expected is not None else contextlib.nullcontext():
        exec(code, example.namespace)  # noqa: S102 — running the docs' code is the point of this test
    if expected is not None and printed.getvalue() != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), printed.getvalue().splitlines(), "shown",
                                              "printed", lineterm=""))
        raise AssertionError(f"the block's output differs from the output shown under it:\n{diff}")


def setup_document(namespace: dict[str, Any]) -> None:
    """Before a document's first block: a fresh working folder, and the helper of the skip directives.
    (Nothing is switched offline here: huggingface_hub reads ``HF_HUB_OFFLINE`` once, at import, so setting it
    for one document would either do nothing or stay on for every later test of the process. No block needs
    the network; the ones that would say so with ``needs(network=True)``.)"""
    folder = Path(tempfile.mkdtemp(prefix="hf-attn-variants-docs-"))
    namespace["_docs_state"] = {"cwd": os.getcwd(), "folder": folder}
    namespace["needs"] = needs
    os.chdir(folder)


def teardown_document(namespace: dict[str, Any]) -> None:
    """After a document's last block: back to the previous folder; the working folder goes."""
    state = namespace.pop("_docs_state")
    os.chdir(state["cwd"])
    shutil.rmtree(state["folder"], ignore_errors=True)


SYBIL = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=run_python_block),
             CodeBlockParser(language="bash", evaluator=run_cli_block), SkipParser()],
    setup=setup_document,
    teardown=teardown_document,
    path=str(ROOT),
    patterns=["README.md", "CONTRIBUTING.md", "docs/*.md"],
)


def test_every_code_block_has_a_known_language() -> None:
    """No fenced block escapes the runner under another spelling (``py``, ``sh``, ``console``…) or without a
    language: a bare fence is refused too, so code cannot slip past as an unlabelled block (prose and output
    say ``text``)."""
    from sybil import Document

    lexer = FencedCodeBlockLexer(language=r"[^\n]*")
    unknown = []
    for path in DOCUMENTS:
        document = Document(path.read_text(encoding="utf-8"), str(path))
        for region in lexer(document):
            language = region.lexemes["language"].strip()
            if language not in KNOWN_LANGUAGES:
                unknown.append(f"{path.relative_to(ROOT)}:{document.line_column(region.start)}: "
                               f"{language or '(none)'!r}")
    assert not unknown, f"fences the docs runner does not know (use python, bash or text): {unknown}"


def test_every_output_block_follows_a_python_block() -> None:
    """An ``<!-- output -->`` block is checked only right after a python block: none may stand anywhere
    else."""
    lexer = FencedCodeBlockLexer(language="python")
    from sybil import Document

    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        checked = sum(bool(OUTPUT_BLOCK.match(text, region.end))
                      for region in lexer(Document(text, str(path))))
        assert checked == text.count("<!-- output -->"), (f"{path.name}: an output block that no python "
                                                          "block precedes")


def test_printed_output_is_compared() -> None:
    """``run_python_block`` fails when a block prints something else than the output shown under it."""
    import pytest
    from sybil import Document, Region

    text = '```python\nprint("one")\n```\n\n<!-- output -->\n```text\ntwo\n```\n'
    document = Document(text, "example.md")
    region = Region(0, text.index("\n\n<!--"), 'print("one")\n', run_python_block)
    with pytest.raises(AssertionError, match="-two"):
        run_python_block(Example(document, 1, 1, region, {}))
    run_python_block(Example(Document(text.replace("two", "one"), "x.md"), 1, 1, region, {}))


def test_every_document_is_collected() -> None:
    """The runner's file patterns cover every document listed in ``DOCUMENTS`` and nothing else."""
    parsed = {path for path in DOCUMENTS if SYBIL.should_parse(path)}
    assert parsed == set(DOCUMENTS)


def test_shell_commands_split_like_the_shell() -> None:
    """Continuations, comments and quoting of the docs' bash blocks."""
    source = ('hf-attn-variants pretrain --model_type gau \\\n'
              '  --config_overrides "hidden_size=64,a=b"  # note\n'
              "# a comment line\n\nX=1 hf-attn-variants export --output_dir runs/x\n")
    assert shell_commands(source) == [
        ["hf-attn-variants", "pretrain", "--model_type", "gau", "--config_overrides", "hidden_size=64,a=b"],
        ["X=1", "hf-attn-variants", "export", "--output_dir", "runs/x"],
    ]
    assert _cli_arguments(["X=1", "python", "-m", "hf_attn_variants", "demo"]) == ({"X": "1"}, ["demo"])


def test_other_commands_and_pipes_are_refused_with_the_way_out() -> None:
    """A command the runner cannot run names the skip directive; a pipe is refused."""
    import pytest

    with pytest.raises(ValueError, match="skip: next"):
        _cli_arguments(["torchrun", "--nproc_per_node", "8", "x.py"])
    with pytest.raises(ValueError, match="one command per line"):
        shell_commands("hf-attn-variants bench | tee log\n")


def test_needs_names_what_is_missing() -> None:
    """``needs`` explains every missing requirement and allows what is there."""
    import pytest

    assert needs() is None
    assert needs(modules=("os",)) is None
    assert needs(nodes=2, network=True) == "needs 2 nodes; the network (the docs tests do not use it)"
    assert "no_such_module_xyz (not installed here)" in (needs(modules=("no_such_module_xyz",)) or "")
    with pytest.raises(TypeError, match="modules"):
        needs(modules="vllm")
    with pytest.raises(ValueError, match="gpus"):
        needs(gpus=-1)
