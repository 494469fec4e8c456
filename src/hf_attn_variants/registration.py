"""Everything ``import hf_attn_variants`` registers with Transformers, in one place.

``register()`` runs once when the package is imported (``hf_attn_variants/__init__.py``); nothing else in the
package writes into a Transformers registry. It registers (``REGISTRATIONS`` lists them, and so does
docs/architecture.md, which a test compares with Transformers' registries before and after the import):

- the three families' configs with ``AutoConfig`` and their model classes with the six ``AutoModel*`` classes,
  each class marked with ``register_for_auto_class``, so ``save_pretrained`` writes an ``auto_map``;
- the ``entropy_invariant`` and ``entropy_invariant_eager`` attention functions and their mask functions, for
  stock Transformers models (``stock.stock_attention``);
- the ``local_shard`` and ``colwise_gather_partial`` tensor-parallel styles the families' plans name
  (``models.tensor_parallel``; on Transformers 5.17 and later, which have the registry).

Exported remote code registers only the two parallel styles, when its shared file is imported.
"""

from __future__ import annotations

from transformers import AutoConfig

from .models import AUTO_CLASSES, FAMILIES
from .models.tensor_parallel import register_parallel_styles
from .stock.stock_attention import register_stock_attention

REGISTRATIONS = {
    "AutoConfig": sorted(FAMILIES),
    **{auto_class.__name__: sorted(FAMILIES) for auto_class in AUTO_CLASSES.values()},
    "AttentionInterface": ["entropy_invariant", "entropy_invariant_eager"],
    "AttentionMaskInterface": ["entropy_invariant", "entropy_invariant_eager"],
    "ALL_PARALLEL_STYLES": ["colwise_gather_partial", "local_shard"],
}
"""Registry → the keys ``register`` adds to it (model types for the Auto classes)."""


def register_families() -> None:
    """Register every family with ``AutoConfig`` and the ``AutoModel*`` classes of ``AUTO_CLASSES``, and mark
    each class for ``register_for_auto_class`` (idempotent)."""
    for model_type, (config_class, classes) in FAMILIES.items():
        AutoConfig.register(model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        for suffix, model_class in classes.items():
            auto_class = AUTO_CLASSES[suffix]
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


def register() -> None:
    """Make every registration of ``REGISTRATIONS`` (idempotent)."""
    register_families()
    register_stock_attention()
    register_parallel_styles()


__all__ = ["REGISTRATIONS", "register", "register_families"]
