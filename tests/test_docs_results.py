"""Every results region of README.md and docs/ equals its rendering from docs/results/*.json, and every
results file is rendered somewhere (``hf_attn_variants.results``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_attn_variants.results import (
    RESULTS_DIR,
    ResultsError,
    render_docs,
    render_markdown,
    used_results,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_region_is_rendered_from_its_results_file():
    assert render_docs(ROOT, check=True) == [], "run `python scripts/render_docs.py` and commit the result"


def test_every_results_file_is_used():
    files = {path.stem for path in (ROOT / RESULTS_DIR).glob("*.json")}
    assert files <= used_results(ROOT), f"results files no document renders: {sorted(files - used_results(ROOT))}"


def test_a_region_naming_a_missing_file_is_one_clear_error(tmp_path):
    text = "<!-- results: nowhere table -->\nold\n<!-- /results -->\n"
    with pytest.raises(ResultsError, match=r"nowhere\.json: no such results file"):
        render_markdown(tmp_path, text)


def test_an_unknown_kind_or_view_is_named(tmp_path):
    write_results(tmp_path, "x", {"kind": "no_such_kind"})
    with pytest.raises(ResultsError, match="no renderer module .* 'no_such_kind'"):
        render_markdown(tmp_path, "<!-- results: x table -->\n<!-- /results -->")
