"""``python -m hf_attn_variants <subcommand>`` ≡ ``hf-attn-variants <subcommand>``."""

from hf_attn_variants_cli import console, main

__all__ = ["console", "main"]

if __name__ == "__main__":
    raise SystemExit(console())
