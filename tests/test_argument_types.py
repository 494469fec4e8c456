"""Python callers' argument objects: a value of the wrong type is one ``FlagError`` naming the field.

The command line parses each flag into its type; a Python caller passes values as they are. A string is
true, so ``PretrainArguments(overwrite_output_dir="False")`` once cleared the output folder, notes and all,
and ``ExportArguments(overwrite="False")`` did the same (``cli_utils.check_field_types``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_attn_variants.cli_utils import FlagError, check_field_types, field_kinds
from hf_attn_variants.demo import DemoArguments
from hf_attn_variants.entropy.cli import EntropyArguments
from hf_attn_variants.hub.conversion import ConvertGAUAlphaArguments
from hf_attn_variants.hub.export import ExportArguments, export
from hf_attn_variants.hub.push import PushArguments
from hf_attn_variants.lengthgen.arguments import LengthGenArguments
from hf_attn_variants.training import FinetuneArguments, PretrainArguments, pretrain

MINIMAL = {
    PretrainArguments: {"model_type": "gau", "output_dir": "runs/x"},
    FinetuneArguments: {"model_name_or_path": "m", "train_file": "t.csv"},
    ExportArguments: {"model_name_or_path": "m", "output_dir": "x"},
    PushArguments: {"folder": "x", "repo_id": "user/name"},
    ConvertGAUAlphaArguments: {"checkpoint": "c", "output_dir": "x"},
    EntropyArguments: {"models": ["m"]},
    LengthGenArguments: {},
    DemoArguments: {},
}
WRONG = {"bool": "False", "int": 2.5, "float": "1e-3", "str": 5.5, "list[str]": "abc"}


def typed_fields(cls: type) -> list[tuple[str, str]]:
    """``(name, kind)`` of every field ``check_field_types`` checks."""
    return [(name, kind) for name, (kind, _) in field_kinds(cls).items()]


CASES = [(cls, name, kind) for cls in MINIMAL for name, kind in typed_fields(cls)]


def test_every_command_checks_its_field_types() -> None:
    for cls, kwargs in MINIMAL.items():
        check_field_types(cls(**kwargs))  # the defaults pass
        assert len(typed_fields(cls)) >= 2, cls
    assert {kind for _, _, kind in CASES} == set(WRONG)


@pytest.mark.parametrize(("cls", "name", "kind"), CASES,
                         ids=[f"{cls.__name__}.{name}" for cls, name, _ in CASES])
def test_a_value_of_the_wrong_type_is_named(cls, name, kind) -> None:
    with pytest.raises(FlagError) as raised:
        cls(**{**MINIMAL[cls], name: WRONG[kind]})
    assert raised.value.flag == name and str(raised.value).startswith(f"{name} must be "), raised.value


def test_the_kinds_survive_hf_argument_parser() -> None:
    """``HfArgumentParser`` rewrites ``dataclasses.fields(...).type`` in place (``dict | str | None`` becomes
    ``str``): the kinds come from the annotations, so a dict of ``config_overrides`` stays allowed."""
    from transformers import HfArgumentParser

    before = field_kinds(PretrainArguments)
    HfArgumentParser(PretrainArguments)
    assert field_kinds(PretrainArguments) == before and "config_overrides" not in before
    assert before["overwrite_output_dir"] == ("bool", False) and before["train_file"] == ("str", True)
    PretrainArguments(model_type="gau", output_dir="x", config_overrides={"hidden_size": 64})


def test_a_path_is_taken_for_a_string_and_none_only_where_it_is_allowed(tmp_path) -> None:
    args = PretrainArguments(model_type="gau", output_dir=tmp_path / "run", train_file=tmp_path / "t.txt",
                             checkpointing_steps=100)  # a step count is taken as the command line's "100"
    assert args.output_dir == str(tmp_path / "run") and args.train_file == str(tmp_path / "t.txt")
    assert args.checkpointing_steps == "100"
    entropy = EntropyArguments(models=(tmp_path / "a", "b"))  # paths in a list of strings, a tuple for a list
    assert entropy.models == [str(tmp_path / "a"), "b"]
    with pytest.raises(FlagError, match="^output_dir is required, got None.$"):
        PretrainArguments(model_type="gau", output_dir=None)
    with pytest.raises(FlagError, match="^license is required, got None.$"):
        ExportArguments(model_name_or_path="m", output_dir="x", license=None)


def test_a_string_false_never_clears_a_folder(tmp_path: Path) -> None:
    """The reported case: both calls once deleted ``notes.txt``; now each is refused before any work."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FlagError, match="overwrite_output_dir must be True or False, got 'False'"):
        pretrain(PretrainArguments(model_type="gau", output_dir=str(folder), overwrite_output_dir="False"))
    with pytest.raises(FlagError, match="overwrite must be True or False, got 'False'"):
        export(ExportArguments(model_name_or_path=str(tmp_path), output_dir=str(folder), overwrite="False"))
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


def test_library_functions_name_a_bad_argument() -> None:
    """Each once failed deep inside (``'<' not supported``, ``stack expects a non-empty TensorList``,
    ``full_like()``): now one error naming the argument."""
    import torch

    from hf_attn_variants.training import build_config
    from hf_attn_variants.training.data import mask_tokens
    from hf_attn_variants.training.modeling import parse_config_overrides

    with pytest.raises(FlagError, match="max_seq_length must be an integer, got '128'"):
        build_config("gau", max_seq_length="128")
    with pytest.raises(FlagError, match="config_overrides must be a string .* or a dict, got int"):
        parse_config_overrides(5)
    ids = torch.ones(2, 4, dtype=torch.long)
    common = {"mask_token_id": 3, "vocab_size": 10, "special_ids": [0]}
    for given, message in (({"input_ids": ids[:0]}, r"input_ids must be a non-empty \(batch, seq\) tensor"),
                           ({"mask_token_id": None}, "mask_token_id must be a token id, got None"),
                           ({"vocab_size": 0}, "vocab_size must be an integer >= 1, got 0")):
        arguments = {"input_ids": ids, "seeds": [0, 1], **common, **given}
        if "input_ids" in given:
            arguments["seeds"] = []
        with pytest.raises(ValueError, match=message):
            mask_tokens(arguments.pop("input_ids"), arguments.pop("seeds"), **arguments)


def test_pruning_helpers_name_a_bad_argument(tmp_path) -> None:
    """``read_curve`` of a file that is not a curve was a bare ``KeyError``; ``normalize_importance`` of a
    list an ``AttributeError``."""
    from hf_attn_variants.pruning.importance import normalize_importance
    from hf_attn_variants.pruning.iterative import read_curve

    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    with pytest.raises(ValueError, match=r"'.*other.json' is not a curve written by write_curve \(KeyError"):
        read_curve(other)
    with pytest.raises(TypeError, match=r"importance must be a tensor \(num_layers, num_heads\), got list"):
        normalize_importance([1.0, 2.0])
