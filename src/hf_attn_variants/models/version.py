"""The package version, here so ``standalone`` names it in every exported file's header without importing
the families' registry (``models/__init__``), which imports ``standalone``. pyproject.toml reads it too."""

__version__ = "0.2.0"
