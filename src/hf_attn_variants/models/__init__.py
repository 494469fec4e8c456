"""The model room: the model code, which ``save_pretrained`` bundles into Hub folders, and its registry.

Nothing in ``models/`` imports from the tools around it (training, pruning, hub, bench, lengthgen, stock, the
CLI); see docs/architecture.md. This ``__init__`` is the families' registry: it registers every family with
``AutoConfig`` and the six ``AutoModel*`` classes and marks each class for ``register_for_auto_class``, so
``save_pretrained`` writes an ``auto_map`` and the standalone model code of ``standalone.py``.
"""

from __future__ import annotations

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from . import modeling_entropy_invariant, modeling_gau, modeling_synthesizer
from .configuration_common import AttnVariantConfig
from .configuration_entropy_invariant import EntropyInvariantConfig
from .configuration_gau import GAUConfig
from .configuration_synthesizer import SynthesizerConfig
from .modeling_common import AttnVariantPreTrainedModel
from .standalone import install_standalone_saving
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


def register_families() -> None:
    """Register every family with the Auto classes and for remote-code saving (idempotent).

    ``save_pretrained`` of every config and model of the package then writes standalone remote code
    (``hf_attn_variants.models.standalone``).
    """
    install_standalone_saving((AttnVariantConfig, AttnVariantPreTrainedModel), AUTO_CLASSES)
    for model_type, (config_class, classes) in FAMILIES.items():
        AutoConfig.register(model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        for suffix, model_class in classes.items():
            auto_class = AUTO_CLASSES[suffix]
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


register_families()

__all__ = ["AUTO_CLASSES", "FAMILIES", "__version__", "register_families"]
