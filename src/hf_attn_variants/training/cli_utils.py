"""Glue between dataclass arguments, ``HfArgumentParser`` and the ``hf-attn-variants`` sub-parsers."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from transformers import HfArgumentParser


def add_dataclass_arguments(parser: argparse.ArgumentParser, *dataclass_types: type) -> None:
    """Add one ``--flag`` per field of each dataclass to ``parser``, exactly as ``HfArgumentParser`` does
    (types, ``choices`` for ``Literal`` fields, ``--no_x`` for booleans defaulting to True, help texts)."""
    source = HfArgumentParser(list(dataclass_types), add_help=False)
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser._add_container_actions(source)  # the mechanism behind ArgumentParser(parents=[...])


def dataclasses_from_namespace(namespace: argparse.Namespace, *dataclass_types: type) -> list[Any]:
    """Instantiate each dataclass from the parsed flags that belong to it (as ``parse_args_into_dataclasses``)."""
    values = vars(namespace)
    result = []
    for dtype in dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        result.append(dtype(**{k: v for k, v in values.items() if k in keys}))
    return result


def fail(command: str, message: str) -> int:
    """Print ``hf-attn-variants <command>: error: <message>`` on stderr and return exit code 2 (argparse's)."""
    print(f"hf-attn-variants {command}: error: {message}", file=sys.stderr)
    return 2


__all__ = ["add_dataclass_arguments", "dataclasses_from_namespace", "fail"]
