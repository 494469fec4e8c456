"""The model room: the model code, which Hub folders hold as the committed files of ``models/remote/``.

Nothing in ``models/`` imports from the tools around it (training, pruning, hub, bench, lengthgen, stock, the
CLI). This ``__init__`` lists the families (``FAMILIES``) and the Auto classes they take (``AUTO_CLASSES``);
``hf_attn_variants.registration`` registers them with Transformers when the package is imported, so
``save_pretrained`` writes an ``auto_map`` and the standalone model code (``standalone.py``).
"""

from __future__ import annotations

from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import modeling_entropy_invariant, modeling_gau, modeling_synthesizer
from .configuration_entropy_invariant import EntropyInvariantConfig
from .configuration_gau import GAUConfig
from .configuration_synthesizer import SynthesizerConfig
from .version import __version__

AUTO_CLASSES = {
    "Model": AutoModel,
    "ForMaskedLM": AutoModelForMaskedLM,
    "ForCausalLM": AutoModelForCausalLM,
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
    "ForQuestionAnswering": AutoModelForQuestionAnswering,
}
"""Model-class suffix → the Transformers auto class it registers with."""

FAMILIES = {
    model_type: (config_class, {suffix: getattr(module, prefix + suffix) for suffix in AUTO_CLASSES})
    for model_type, config_class, module, prefix in (
        ("entropy_invariant", EntropyInvariantConfig, modeling_entropy_invariant, "EntropyInvariant"),
        ("gau", GAUConfig, modeling_gau, "GAU"),
        ("synthesizer", SynthesizerConfig, modeling_synthesizer, "Synthesizer"),
    )
}
"""model_type → (config class, {suffix: model class}) for every family this package provides; a family's
classes are its modeling module's ``<Prefix><suffix>`` (``GAUForMaskedLM``)."""


__all__ = ["AUTO_CLASSES", "FAMILIES", "__version__"]
