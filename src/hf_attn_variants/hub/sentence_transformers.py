"""``export --sentence-transformers``: the files that make an exported folder a sentence-transformers model.

``SentenceTransformer(folder, trust_remote_code=True)`` reads ``modules.json`` (the module list: the
Transformer at the folder's root, then Pooling in ``1_Pooling/``), ``sentence_bert_config.json`` (how the
Transformer module runs the model) and ``1_Pooling/config.json``; ``config_sentence_transformers.json`` names
the similarity function (cosine). The files follow what sentence-transformers 6.2 itself saves; nothing here
imports sentence-transformers.

Pooling (``default_pooling``): the three families are bidirectional encoders trained with masked-language
modelling, which trains no summary token — the first token ([CLS]) is one more input token — so the embedding
is the **mean** of the token states over the attention mask (SBERT's default for such encoders; no
family-specific reason to differ: GAU's and the Synthesizer's outputs are per-token states like any
encoder's). A causal model (``is_decoder``) gets **lasttoken**: only the last real token has seen the whole
text. ``max_seq_length`` is ``max_position_embeddings``: the Synthesizer refuses longer inputs, learned
absolute positions end there, and the other models were not trained beyond it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POOLING_MODES = ("mean", "cls", "max", "lasttoken")


def default_pooling(config: Any) -> str:
    """``"lasttoken"`` for a causal model, ``"mean"`` for the bidirectional encoders (see the module
    docstring)."""
    return "lasttoken" if getattr(config, "is_decoder", False) else "mean"


def write_sentence_transformers_files(folder: str | Path, config: Any,
                                      pooling: str | None = None) -> dict[str, Any]:
    """Write ``modules.json``, ``sentence_bert_config.json``, ``config_sentence_transformers.json`` and
    ``1_Pooling/config.json`` into ``folder`` (which already holds the exported model); return what was
    chosen."""
    pooling = pooling or default_pooling(config)
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}.")
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
    ]
    transformer = {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": "token_embeddings",
        "max_seq_length": int(config.max_position_embeddings),
        "do_lower_case": False,
    }
    pooling_config = {"embedding_dimension": int(config.hidden_size), "pooling_mode": pooling,
                      "include_prompt": True}
    model_config = {"model_type": "SentenceTransformer", "prompts": {"query": "", "document": ""},
                    "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps(transformer, indent=2) + "\n")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(model_config, indent=2) + "\n")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")
    return {"pooling": pooling, "max_seq_length": transformer["max_seq_length"]}


__all__ = ["POOLING_MODES", "default_pooling", "write_sentence_transformers_files"]
