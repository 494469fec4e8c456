"""Length-generalisation studies (not model code, so it may import anything).

``hf-attn-variants lengthgen`` / ``run_study(LengthGenArguments(...))``: train a set of attention
variants under one budget at a training length L and evaluate each at other lengths (MLM loss and
accuracy; perplexity for causal models), with several seeds, mixed-length pretraining, JSON/CSV/markdown
results, PNG plots and resumability; plus Su (2022)'s finetune-at-other-lengths experiment for GAU
(``finetune_lengths``). ``lengthgen --task passkey|mqar``: the same variants (and position schemes, RoPE or
none) trained on synthetic retrieval tasks generated from a seed (``tasks``, ``retrieval``,
``retrieval_study``) and scored by exact-match accuracy at L … 64L. See docs/length_generalization.md for the
studies run with it.
"""

from __future__ import annotations

from .arguments import LengthGenArguments
from .evaluation import evaluate_at_lengths, na_status
from .finetune_lengths import build_topic_task, run_finetune_experiment
from .results import atomic_write_json, summarize
from .runfolders import claim
from .study import run_study
from .variants import (
    DEFAULT_VARIANTS,
    LLAMA_EVAL_MODES,
    VARIANTS,
    EvalMode,
    ModelSize,
    Variant,
    config_fields,
    get_variant,
)

__all__ = [
    "DEFAULT_VARIANTS",
    "LLAMA_EVAL_MODES",
    "VARIANTS",
    "EvalMode",
    "LengthGenArguments",
    "ModelSize",
    "Variant",
    "atomic_write_json",
    "build_topic_task",
    "claim",
    "config_fields",
    "evaluate_at_lengths",
    "get_variant",
    "na_status",
    "run_finetune_experiment",
    "run_study",
    "summarize",
]
