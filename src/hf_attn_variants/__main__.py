"""``python -m hf_attn_variants <subcommand>`` ≡ ``hf-attn-variants <subcommand>``."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
