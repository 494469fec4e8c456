"""The package version of ``hf_attn_variants``.

It lives here so that ``hf_attn_variants.models.standalone`` names it in every exported file's header without
importing the families' registry (``hf_attn_variants.models``), which imports ``standalone``. The package's
build metadata reads it too.
"""

__version__ = "0.2.0"
