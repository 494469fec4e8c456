"""add_dataclass_arguments: the flags ``HfArgumentParser`` would make, added through public argparse calls only."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field
from typing import Literal

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_attn_variants.cli_utils import add_dataclass_arguments


def subcommand_dataclasses() -> dict[str, tuple[type, ...]]:
    """The argument dataclasses of every subcommand that builds its flags with ``add_dataclass_arguments``."""
    from hf_attn_variants.demo import DemoArguments
    from hf_attn_variants.hub.conversion import ConvertGAUAlphaArguments
    from hf_attn_variants.hub.export import ExportArguments
    from hf_attn_variants.hub.push import PushArguments
    from hf_attn_variants.lengthgen.arguments import LengthGenArguments
    from hf_attn_variants.training.finetune import FinetuneArguments
    from hf_attn_variants.training.pretrain import PretrainArguments

    return {
        "pretrain": (PretrainArguments,),
        "finetune": (FinetuneArguments, TrainingArguments),
        "export": (ExportArguments,),
        "push": (PushArguments,),
        "demo": (DemoArguments,),
        "lengthgen": (LengthGenArguments,),
        "convert-gau-alpha": (ConvertGAUAlphaArguments,),
    }


def ours(*dataclass_types: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x", add_help=False)
    add_dataclass_arguments(parser, *dataclass_types)
    return parser


def reference(*dataclass_types: type) -> argparse.ArgumentParser:
    return HfArgumentParser(list(dataclass_types), prog="x", add_help=False)


@pytest.mark.parametrize("command", list(subcommand_dataclasses()))
def test_flags_and_help_equal_hf_argument_parser(command: str) -> None:
    types = subcommand_dataclasses()[command]
    assert ours(*types).format_help() == reference(*types).format_help()


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Sample:
    name: str = field(metadata={"help": "required text"})
    mode: Literal["a", "b"] = "a"
    colour: Colour = Colour.RED
    sizes: list[int] = field(default_factory=lambda: [1, 2])
    flag: bool = False
    keep: bool = True
    maybe: bool | None = None
    count: int | None = None
    rate: float = 0.5
    words: list[str] | None = None


@pytest.mark.parametrize(
    "argv",
    [
        ["--name", "n"],
        ["--name", "n", "--mode", "b", "--colour", "blue", "--sizes", "3", "4", "--flag", "--no_keep", "--maybe",
         "true", "--count", "7", "--rate", "2", "--words", "a", "b"],
        ["--name", "n", "--flag", "false", "--keep", "no", "--no-keep"],
    ],
)
def test_parsed_values_equal_hf_argument_parser(argv: list[str]) -> None:
    assert vars(ours(Sample).parse_args(argv)) == vars(reference(Sample).parse_args(argv))


def test_bad_choice_is_rejected_like_hf_argument_parser(capsys) -> None:
    errors = []
    for parser in (ours(Sample), reference(Sample)):
        with pytest.raises(SystemExit):
            parser.parse_args(["--name", "n", "--mode", "c"])
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and "invalid choice: 'c'" in errors[0]
