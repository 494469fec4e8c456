"""Training tools (not model code, so they may import anything): the embedded corpus and tokenizer,
config/model building for any family, MLM/CLM pretraining with accelerate or sharded by Transformers'
``DistributedConfig`` (``sharded.py``), finetuning with Trainer + peft.

Python API (no CLI needed)::

    from hf_attn_variants.training import PretrainArguments, pretrain
    result = pretrain(PretrainArguments(output_dir="runs/x", model_type="gau",
                                        config_overrides="hidden_size=64,num_hidden_layers=2"))
"""

from __future__ import annotations

from .corpus import corpus_splits, embedded_tokenizer, embedded_tokenizer_path
from .data import group_into_blocks, load_text_datasets, mask_tokens, text_blocks
from .evaluation import evaluate_lm
from .modeling import build_config, build_lm_model, load_tokenizer, parse_config_overrides
from .pretrain import PretrainArguments, PretrainResult, pretrain

__all__ = [
    "PretrainArguments",
    "PretrainResult",
    "build_config",
    "build_lm_model",
    "corpus_splits",
    "embedded_tokenizer",
    "embedded_tokenizer_path",
    "evaluate_lm",
    "group_into_blocks",
    "load_text_datasets",
    "load_tokenizer",
    "mask_tokens",
    "parse_config_overrides",
    "pretrain",
    "text_blocks",
]
