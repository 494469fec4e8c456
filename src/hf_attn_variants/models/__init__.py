"""The model room: every module here is model code, the part ``save_pretrained`` bundles into Hub folders.

Nothing in ``models/`` imports from the tools around it (training, pruning, hub, bench, lengthgen, stock,
results, the CLI); see docs/architecture.md. This ``__init__`` is the families' registry: it registers every
family with ``AutoConfig`` and the six ``AutoModel*`` classes and marks each class for
``register_for_auto_class``, so ``save_pretrained`` writes an ``auto_map`` and standalone model code (one
configuration and one modeling file per family, see ``standalone.py``).
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

from .configuration_common import StandaloneCodeMixin
from .configuration_entropy_invariant import EntropyInvariantConfig
from .configuration_gau import GAUConfig
from .configuration_synthesizer import SynthesizerConfig
from .modeling_entropy_invariant import (
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    EntropyInvariantForQuestionAnswering,
    EntropyInvariantForSequenceClassification,
    EntropyInvariantForTokenClassification,
    EntropyInvariantModel,
    EntropyInvariantPreTrainedModel,
)
from .modeling_gau import (
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUForQuestionAnswering,
    GAUForSequenceClassification,
    GAUForTokenClassification,
    GAUModel,
    GAUPreTrainedModel,
)
from .modeling_synthesizer import (
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
    SynthesizerForQuestionAnswering,
    SynthesizerForSequenceClassification,
    SynthesizerForTokenClassification,
    SynthesizerModel,
    SynthesizerPreTrainedModel,
)
from .standalone import write_standalone_code

__version__ = "0.1.0"
"""The package version; standalone code names it in its header (``standalone.package_version``)."""

AUTO_CLASSES = {
    "Model": AutoModel,
    "ForMaskedLM": AutoModelForMaskedLM,
    "ForCausalLM": AutoModelForCausalLM,
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
    "ForQuestionAnswering": AutoModelForQuestionAnswering,
}

FAMILIES = {
    "entropy_invariant": (
        EntropyInvariantConfig,
        {
            "Model": EntropyInvariantModel,
            "ForMaskedLM": EntropyInvariantForMaskedLM,
            "ForCausalLM": EntropyInvariantForCausalLM,
            "ForSequenceClassification": EntropyInvariantForSequenceClassification,
            "ForTokenClassification": EntropyInvariantForTokenClassification,
            "ForQuestionAnswering": EntropyInvariantForQuestionAnswering,
        },
    ),
    "gau": (
        GAUConfig,
        {
            "Model": GAUModel,
            "ForMaskedLM": GAUForMaskedLM,
            "ForCausalLM": GAUForCausalLM,
            "ForSequenceClassification": GAUForSequenceClassification,
            "ForTokenClassification": GAUForTokenClassification,
            "ForQuestionAnswering": GAUForQuestionAnswering,
        },
    ),
    "synthesizer": (
        SynthesizerConfig,
        {
            "Model": SynthesizerModel,
            "ForMaskedLM": SynthesizerForMaskedLM,
            "ForCausalLM": SynthesizerForCausalLM,
            "ForSequenceClassification": SynthesizerForSequenceClassification,
            "ForTokenClassification": SynthesizerForTokenClassification,
            "ForQuestionAnswering": SynthesizerForQuestionAnswering,
        },
    ),
}
"""model_type → (config class, {suffix: model class}) for every family this package provides."""


def register_families() -> None:
    """Register every family with the Auto classes and for remote-code saving (idempotent).

    ``save_pretrained`` of every config and model of the package then writes standalone remote code
    (``hf_attn_variants.models.standalone``).
    """
    StandaloneCodeMixin.standalone_code_writer = staticmethod(write_standalone_code)
    for model_type, (config_class, classes) in FAMILIES.items():
        AutoConfig.register(model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        for suffix, model_class in classes.items():
            auto_class = AUTO_CLASSES[suffix]
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


register_families()

__all__ = ["AUTO_CLASSES", "FAMILIES", "__version__", "register_families"]
