"""add_dataclass_arguments: the flags ``HfArgumentParser`` would make, added through public argparse calls
only."""

from __future__ import annotations

import argparse
import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

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


DEFAULT_SUFFIX = re.compile(r" \(default: %\(default\)s\)$")


def flag_table(parser: argparse.ArgumentParser) -> dict[str, tuple]:
    """Every flag of ``parser`` as ``HfArgumentParser`` would define it: its options, destination, default,
    nargs, const, choices, whether it is required, its type's name and its help text (without the default we
    add)."""
    table = {}
    for action in parser._actions:  # reading argparse's actions is the only way to compare the flags
        help_text = DEFAULT_SUFFIX.sub("", action.help or "")
        table[action.option_strings[0]] = (tuple(action.option_strings), action.dest, repr(action.default),
                                           action.nargs, action.const, tuple(action.choices or ()),
                                           action.required, getattr(action.type, "__name__", None), help_text)
    return table


def bare_bools(table: dict[str, tuple]) -> dict[str, tuple]:
    """``HfArgumentParser``'s table with our one difference: a ``bool | None`` flag (type ``string_to_bool``,
    no ``nargs``) given alone means True (``nargs="?"``, ``const=True``), as its other boolean flags."""
    return {flag: (row[:3] + ("?", True) + row[5:] if row[7] == "string_to_bool" and row[3] is None else row)
            for flag, row in table.items()}


@pytest.mark.parametrize("command", list(subcommand_dataclasses()))
def test_flags_equal_hf_argument_parser(command: str) -> None:
    types = subcommand_dataclasses()[command]
    assert flag_table(ours(*types)) == bare_bools(flag_table(reference(*types)))


def test_a_bool_or_none_flag_alone_means_true_and_still_takes_a_value() -> None:
    """``finetune --disable_tqdm`` (Trainer's ``bool | None``): HfArgumentParser stops with "expected one
    argument"; here it is True, ``--disable_tqdm false`` is False, and leaving it out keeps None."""
    parser = ours(TrainingArguments)
    with pytest.raises(SystemExit):
        reference(TrainingArguments).parse_args(["--output_dir", "x", "--disable_tqdm"])
    assert parser.parse_args(["--output_dir", "x", "--disable_tqdm"]).disable_tqdm is True
    assert parser.parse_args(["--output_dir", "x", "--disable_tqdm", "false"]).disable_tqdm is False
    assert parser.parse_args(["--output_dir", "x"]).disable_tqdm is None
    assert bare_bools(flag_table(reference(TrainingArguments))) != flag_table(reference(TrainingArguments))


def test_pretrain_help_groups_flags_required_first_without_none_defaults() -> None:
    """``pretrain --help``: model and data, output, training, scale-out, in that order; ``--model_type`` lists
    its choices; no flag shows "(default: None)" (a required one shows no default at all)."""
    from hf_attn_variants.training.pretrain import PretrainArguments

    raw = ours(PretrainArguments).format_help()
    positions = [raw.index(f"\n{title}")
                 for title in ("model and data:", "output:", "training:", "scale-out (")]
    text = " ".join(raw.split())
    assert positions == sorted(positions)
    assert text.index("--model_type") < text.index("--output_dir") < text.index("--learning_rate") < \
        text.index("--fsdp_size")
    assert "--model_type {entropy_invariant,gau,synthesizer}" in text
    assert "(default: None)" not in text
    # the output_dir entry: "--output_dir OUTPUT_DIR, --output-dir OUTPUT_DIR" up to Python 3.12,
    # "--output_dir, --output-dir OUTPUT_DIR" from 3.13 (argparse names the metavar once)
    entry = re.search(r"--output_dir( OUTPUT_DIR)?, --output-dir OUTPUT_DIR", text)
    assert entry is not None, text
    output_dir_help = text[entry.start():text.index("--overwrite_output_dir")]
    assert "default" not in output_dir_help
    assert "Peak AdamW learning rate. (default: 0.0005)" in text


def test_finetune_help_puts_training_arguments_in_a_group_of_their_own() -> None:
    from hf_attn_variants.training.finetune import FinetuneArguments

    text = ours(FinetuneArguments, TrainingArguments).format_help()
    assert text.index("model and data:") < text.index("TrainingArguments:") and "(default: None)" not in text


@dataclass
class Grouped:
    argument_groups: ClassVar[dict[str, tuple[str, ...]]] = {"a": ("x",)}
    x: int = 1
    y: int = 2


def test_argument_groups_must_list_every_field_once() -> None:
    with pytest.raises(ValueError, match=r"missing \['y'\]"):
        ours(Grouped)


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
        ["--name", "n", "--mode", "b", "--colour", "blue", "--sizes", "3", "4", "--flag", "--no_keep",
         "--maybe", "true", "--count", "7", "--rate", "2", "--words", "a", "b"],
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
    # the usage lines differ only where a bool | None flag may stand alone ("[--maybe [MAYBE]]")
    assert errors[0].replace("[--maybe [MAYBE]]", "[--maybe MAYBE]") == errors[1]
    assert "invalid choice: 'c'" in errors[0]


def test_hub_ids_are_told_from_local_paths(tmp_path, monkeypatch) -> None:
    from hf_attn_variants.cli_utils import is_hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert not is_hub_id("runs/typo")  # a missing folder under an existing one: a local path
    assert is_hub_id("someone/tiny-model") and is_hub_id("gpt2")
    assert not is_hub_id(str(tmp_path)) and not is_hub_id("./model") and not is_hub_id("a/b/c")
    assert not is_hub_id("runs/out dir") and not is_hub_id("")


def test_offline_a_hub_id_gets_one_sentence(monkeypatch, tmp_path) -> None:
    """``--model_name_or_path`` takes a Hub id; offline (or without network) and not cached, one sentence says
    so."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from hf_attn_variants.cli_utils import FlagError, check_model_source
    from hf_attn_variants.training.modeling import load_pretrained

    repo = "someone/not-cached-model-xyz"
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    assert check_model_source("model_name_or_path", repo) == repo  # online: from_pretrained fetches it
    with pytest.raises(FlagError, match="no such model folder"):
        check_model_source("model_name_or_path", str(tmp_path / "missing"))
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: True)
    with pytest.raises(FlagError, match=r"HF_HUB_OFFLINE=1 or no network") as error:
        check_model_source("model_name_or_path", repo)
    assert str(error.value).count(". ") == 0 and error.value.flag == "model_name_or_path"

    class NoNetwork:  # what from_pretrained raises when the Hub cannot be reached and nothing is cached
        @staticmethod
        def from_pretrained(*args, **kwargs):
            try:
                raise LocalEntryNotFoundError("cannot reach the Hub")
            except LocalEntryNotFoundError as cause:
                raise OSError("We couldn't connect to the Hub") from cause

    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    with pytest.raises(FlagError, match="cannot be downloaded: the Hub cannot be reached"):
        load_pretrained(NoNetwork, repo)


def test_error_reason_keeps_every_line_on_one_and_bounds_it() -> None:
    """A library's multi-line reason ends a one-line error whole, a long one is cut with "…", an empty one
    gives the exception's class."""
    from hf_attn_variants.cli_utils import error_reason

    several = ValueError("Couldn't instantiate the tokenizer from one of: \n(1) a file, \n(2) a class.")
    assert error_reason(several) == "Couldn't instantiate the tokenizer from one of: (1) a file, (2) a class."
    cut = error_reason(OSError("x" * 1000), limit=50)
    assert len(cut) == 50 and cut.endswith("…")
    assert error_reason(KeyError()) == "KeyError"


def test_replace_folder_never_loses_both_folders(tmp_path, monkeypatch) -> None:
    """``export --overwrite`` once deleted the old folder before renaming the new one into place: a kill in
    between lost both. Now the old one is renamed aside first and put back if the new one cannot move in."""
    import os

    from hf_attn_variants.cli_utils import replace_folder

    output = tmp_path / "hub"
    output.mkdir()
    (output / "old.txt").write_text("old")
    staging = tmp_path / ".hub.new"
    staging.mkdir()
    (staging / "new.txt").write_text("new")
    rename = os.replace

    def failing(source, target):
        if Path(source) == staging:
            raise OSError("disk gone")
        return rename(source, target)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="disk gone"):
        replace_folder(staging, output)
    assert [p.name for p in output.iterdir()] == ["old.txt"]
    monkeypatch.setattr(os, "replace", rename)
    replace_folder(staging, output)
    assert [p.name for p in output.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub"]  # nothing left aside
    fresh = tmp_path / ".other.new"
    fresh.mkdir()
    replace_folder(fresh, tmp_path / "other")  # nothing to replace
    assert (tmp_path / "other").is_dir() and not fresh.exists()
