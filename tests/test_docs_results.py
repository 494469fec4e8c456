"""Every results region of README.md and docs/ equals its rendering from docs/results/*.json, and every
results file is rendered somewhere (the repository's renderer, ``tools/docs_results``, run as
``tools/render_docs.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.docs_results import (
    REGION,
    RESULTS_DIR,
    ResultsError,
    markdown_files,
    render_docs,
    render_markdown,
    used_results,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_region_is_rendered_from_its_results_file():
    assert render_docs(ROOT, check=True) == [], "run `python tools/render_docs.py` and commit the result"


def test_the_render_tool_checks_the_docs_from_the_repository_root():
    """``python tools/render_docs.py --check``, run as a file the way the Makefile and the scripts run it."""
    result = subprocess.run([sys.executable, "tools/render_docs.py", "--check"], cwd=ROOT,
                            capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_results_file_is_used():
    files = {path.stem for path in (ROOT / RESULTS_DIR).glob("*.json")}
    assert files <= used_results(ROOT), ("results files no document renders: "
                                         f"{sorted(files - used_results(ROOT))}")


def test_a_region_naming_a_missing_file_is_one_clear_error(tmp_path):
    text = "<!-- results: nowhere table -->\nold\n<!-- /results -->\n"
    with pytest.raises(ResultsError, match=r"nowhere\.json: no such results file"):
        render_markdown(tmp_path, text)


def test_an_unknown_kind_or_view_is_named(tmp_path):
    write_results(tmp_path, "x", {"kind": "no_such_kind"})
    with pytest.raises(ResultsError, match="no renderer module .* 'no_such_kind'"):
        render_markdown(tmp_path, "<!-- results: x table -->\n<!-- /results -->")


def test_an_inline_region_holds_one_figure_inside_its_sentence(tmp_path):
    write_results(tmp_path, "demo", {"kind": "demo", "make_demo": {"wall_seconds": 102}, "max_seq_length": 64,
                                     "length_multipliers": [1], "earlier_runs": [
                                         {"what": "a run", "loss_at_longest": {"gau": 5.0}}]})
    text = "It took <!-- results: demo wall_time -->old<!-- /results --> on two cores.\n"
    assert render_markdown(tmp_path, text) == (
        "It took <!-- results: demo wall_time -->1 min 42 s<!-- /results --> on two cores.\n")
    (match,) = REGION.finditer(text)
    assert match["inline"] == "old" and match["body"] is None
    with pytest.raises(ResultsError, match="more than one figure"):
        render_markdown(tmp_path, "Losses <!-- results: demo stability -->x<!-- /results -->")


@pytest.mark.parametrize("path", markdown_files(ROOT), ids=lambda p: p.name)
def test_inline_regions_sit_inside_their_sentences(path):
    """An inline region never opens a line (Markdown would take the comment for an HTML block and cut the
    paragraph) nor sits inside a code span (which would show the comment)."""
    text = path.read_text(encoding="utf-8")
    for match in REGION.finditer(text):
        if match["inline"] is None:
            continue
        number = text.count("\n", 0, match.start()) + 1
        before = text[text.rfind("\n", 0, match.start()) + 1: match.start()]
        assert before.strip(), f"{path.name}:{number}: an inline region opens the line"
        assert before.count("`") % 2 == 0, f"{path.name}:{number}: an inline region inside a code span"
