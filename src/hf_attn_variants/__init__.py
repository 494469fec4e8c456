"""hf_attn_variants: GAU, Synthesizer and entropy-invariant attention as Transformers v5 models.

Importing the package makes the registrations of ``registration.py``, and only those: every family with
``AutoConfig`` and the six ``AutoModel*`` classes, so ``save_pretrained`` writes an ``auto_map`` and the
standalone model code (committed in ``models/remote/``, see ``models/standalone.py``): the saved folder loads
with ``trust_remote_code=True`` without this package, on every Transformers 5.x. It also registers the
``entropy_invariant`` attention function for stock models and two tensor-parallel styles.

The layout (docs/architecture.md): ``models/`` is the model code that ships to the Hub; everything else
(``training/``, ``pruning/``, ``hub/``, ``bench/``, ``lengthgen/``, ``stock/``, ``results/``, ``cli.py``,
``cli_utils.py``, ``demo.py``) is tools around it.
"""

from __future__ import annotations

from .models import AUTO_CLASSES, FAMILIES, __version__
from .models.configuration_entropy_invariant import EntropyInvariantConfig
from .models.configuration_gau import GAUConfig
from .models.configuration_synthesizer import SynthesizerConfig
from .models.modeling_entropy_invariant import (
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    EntropyInvariantForQuestionAnswering,
    EntropyInvariantForSequenceClassification,
    EntropyInvariantForTokenClassification,
    EntropyInvariantModel,
    EntropyInvariantPreTrainedModel,
)
from .models.modeling_gau import (
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUForQuestionAnswering,
    GAUForSequenceClassification,
    GAUForTokenClassification,
    GAUModel,
    GAUPreTrainedModel,
)
from .models.modeling_synthesizer import (
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
    SynthesizerForQuestionAnswering,
    SynthesizerForSequenceClassification,
    SynthesizerForTokenClassification,
    SynthesizerModel,
    SynthesizerPreTrainedModel,
)
from .models.losses import chunked_cross_entropy
from .stock.chunked_loss import use_chunked_loss
from .registration import register, register_families
from .stock.stock_attention import ENTROPY_INVARIANT, configure_log_n, register_stock_attention

register()

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
    "__version__",
    "chunked_cross_entropy",
    "configure_log_n",
    "register_families",
    "register_stock_attention",
    "use_chunked_loss",
]
