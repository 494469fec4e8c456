"""Training tools (not model code, so they may import anything): the embedded corpus and tokenizer,
config/model building for any family, MLM/CLM pretraining with accelerate or sharded by Transformers'
``DistributedConfig`` (``sharded.py``), finetuning with Trainer + peft (arguments of both: ``arguments.py``),
and what keeps their output folders whole: the one output-folder rule (``outputs.py``, also used by ``prune``
and ``lengthgen``), checkpoint manifests (``checkpoints.py``) and preemption (``preemption.py``).

Python API (no CLI needed)::

    from hf_attn_variants.training import PretrainArguments, pretrain
    result = pretrain(PretrainArguments(output_dir="runs/x", model_type="gau",
                                        config_overrides="hidden_size=64,num_hidden_layers=2"))
"""

from __future__ import annotations

from .arguments import FinetuneArguments, PretrainArguments, ShardingArguments
from .corpus import corpus_splits, embedded_tokenizer, embedded_tokenizer_path
from .data import group_into_blocks, load_text_datasets, mask_tokens, text_blocks
from .evaluation import evaluate_lm
from .modeling import build_config, build_lm_model, load_tokenizer, parse_config_overrides
from .preemption import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, TrainingPreempted
from .pretrain import PretrainResult, pretrain

__all__ = [
    "INTERRUPTED_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "FinetuneArguments",
    "PretrainArguments",
    "PretrainResult",
    "ShardingArguments",
    "TrainingPreempted",
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
