"""Packed documents in the exported remote code, under the oldest supported and the installed Transformers.

Kept apart from ``tests/test_packed_documents.py``, which ``tests/test_transformers_floor.py`` runs inside the
oldest release's clean environment (this check starts clean environments of its own).
"""

from __future__ import annotations

import pytest

from tests.remote_code import RemoteCase, assert_remote_code_matches
from tests.test_packed_documents import build, packed_batch


@pytest.mark.slow
def test_exported_remote_code_keeps_packed_documents_apart(tmp_path) -> None:
    """The standalone files ``save_pretrained`` writes compute packed rows as the package does (which
    tests/test_packed_documents.py ties to the lone runs), loaded with ``trust_remote_code`` under the oldest
    supported and the installed Transformers: packing goes through version-dependent mask utilities."""
    ids, positions, _ = packed_batch()
    inputs = {"input_ids": ids, "position_ids": positions}
    cases = [
        RemoteCase(f"{family}-{objective}", build(family, objective, options),
                   f"AutoModelFor{'CausalLM' if objective == 'causal' else 'MaskedLM'}", inputs)
        for family, options in (("entropy_invariant", {"implementation": "sdpa"}),
                                ("gau", {"attention_normalization": "relu2", "chunk_size": 4}),
                                ("synthesizer", {"synthesizer_components": ["dense", "random", "vanilla"]}))
        for objective in ("causal", "masked")
    ]
    assert_remote_code_matches(cases, tmp_path)
