"""The ``hf-attn-variants`` command line, as seen from inside the package.

The table of subcommands and ``main`` live in the top-level module ``hf_attn_variants_cli`` (outside this
package, so that the console script answers ``--help`` and ``--version`` without importing torch); this module
re-exports them for ``python -m hf_attn_variants`` and for code that runs a subcommand in-process
(``hf_attn_variants.cli.main(["pretrain", …])``). Each subcommand lives in its own module and exposes
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

from hf_attn_variants_cli import EXTRAS, SUBCOMMANDS, Subcommand, build_parser, main

__all__ = ["EXTRAS", "SUBCOMMANDS", "Subcommand", "build_parser", "main"]
