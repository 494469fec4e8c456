"""hf_attn_variants: GAU, Synthesizer and entropy-invariant attention as Transformers v5 models.

Importing the package registers every family with ``AutoConfig`` and the six ``AutoModel*`` classes and
marks each class for ``register_for_auto_class``, so ``save_pretrained`` writes an ``auto_map`` and
standalone model code (one configuration and one modeling file per family, see ``standalone.py``): the
saved folder loads with ``trust_remote_code=True`` without this package, on every Transformers 5.x.
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
from .stock_attention import ENTROPY_INVARIANT, register_stock_attention

__version__ = "0.1.0"

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
    (``hf_attn_variants.standalone``).
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
register_stock_attention()

__all__ = [
    "AUTO_CLASSES",
    "ENTROPY_INVARIANT",
    "FAMILIES",
    "EntropyInvariantConfig",
    "EntropyInvariantForCausalLM",
    "EntropyInvariantForMaskedLM",
    "EntropyInvariantForQuestionAnswering",
    "EntropyInvariantForSequenceClassification",
    "EntropyInvariantForTokenClassification",
    "EntropyInvariantModel",
    "EntropyInvariantPreTrainedModel",
    "GAUConfig",
    "GAUForCausalLM",
    "GAUForMaskedLM",
    "GAUForQuestionAnswering",
    "GAUForSequenceClassification",
    "GAUForTokenClassification",
    "GAUModel",
    "GAUPreTrainedModel",
    "SynthesizerConfig",
    "SynthesizerForCausalLM",
    "SynthesizerForMaskedLM",
    "SynthesizerForQuestionAnswering",
    "SynthesizerForSequenceClassification",
    "SynthesizerForTokenClassification",
    "SynthesizerModel",
    "SynthesizerPreTrainedModel",
    "register_families",
    "register_stock_attention",
]
