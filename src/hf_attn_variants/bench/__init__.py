"""``hf-attn-variants bench``: side-by-side speed and memory benchmarks of the three families and stock
models.

- ``specs``: the variants (this package's models and the stock Transformers baselines) and presets.
- ``measure``: timing (wall and CPU clocks), peak step memory (CUDA allocator or torch.profiler replay),
  FLOPs.
- ``runner``: interleaved warm-up + repeated rounds per length, eager and ``torch.compile``d.
- ``loops``: ``pretrain``'s training loop against transformers' ``Trainer`` (same model, data, batch),
  tokens/s.
- ``store``: the results file (docs/results/benchmarks-cpu.json) a run writes, and ``--merge`` of a partial
  run.
- ``report`` / ``plots``: the report of a run (docs/benchmarks.md is the one of the committed results file,
  rendered by the repository's ``tools/render_docs.py``) and the log-log PNGs.

``python -m hf_attn_variants bench --quick`` is the CI smoke test; ``make bench`` the full CPU run.
"""

from __future__ import annotations

from .specs import COMPARISONS, PRESETS, Comparison, Preset, Variant, build_variants

__all__ = ["COMPARISONS", "PRESETS", "Comparison", "Preset", "Variant", "build_variants"]
