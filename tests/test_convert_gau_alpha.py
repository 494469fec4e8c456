"""``convert-gau-alpha`` reproduces GAU-α's PyTorch port (``gau-alpha==0.0.3``, installed by ``make install``
with ``--no-deps``): with random weights, the MLM log-probabilities agree to 1e-5 with left and right padding,
for each of the port's attention normalisations (``softmax_plus``, GAU-α's own, and ``softmax`` and
``squared_relu``).

The port imports ``transformers.modeling_utils.SequenceSummary``, which Transformers v5 removed; a stub is put
in its place while the port is imported (only its multiple-choice head would use it). Without the package the
tests that need it fail (they do not skip) with the command that installs it: ``make install`` always installs
it. The converter's own errors are tested either way.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import transformers.modeling_utils
from torch import nn

from hf_attn_variants import GAUForMaskedLM
from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import FlagError
from hf_attn_variants.hub.conversion import (
    PORT_NORMALIZATIONS,
    ConvertGAUAlphaArguments,
    convert_gau_alpha,
    interleaved_to_half_split,
)
from tests.remote_code import assert_standalone_code
from tests.utils import left_padded, random_ids, require_test_package, right_padded

PORT_CONFIG = {"vocab_size": 61, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "attention_key_size": 16, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0}


class SequenceSummaryStub(nn.Module):
    """Stands in for the v4 ``SequenceSummary`` the port imports; only its multiple-choice head uses it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        raise NotImplementedError("SequenceSummary was removed in Transformers v5.")


def import_port():
    """The ``gau_alpha`` module; the calling test fails when the package is not installed."""
    require_test_package("gau_alpha", "gau-alpha==0.0.3")
    with contextlib.ExitStack() as stack:
        if not hasattr(transformers.modeling_utils, "SequenceSummary"):
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            patch.setattr(transformers.modeling_utils, "SequenceSummary", SequenceSummaryStub, raising=False)
        import gau_alpha
    return gau_alpha


@pytest.fixture(scope="module")
def port_checkpoint(tmp_path_factory):
    """``port_checkpoint(normalization)`` → (folder, model): a random-weight port checkpoint with non-trivial
    γ, β = 0, segment embeddings and an untied decoder, built once per normalization. Built when a test calls
    it, so that a missing port fails that test (``import_port``) rather than erroring in setup."""
    built: dict[str, tuple] = {}

    def build(normalization: str = "softmax_plus"):
        if normalization not in built:
            gau_alpha = import_port()
            torch.manual_seed(0)
            config = gau_alpha.GAUAlphaConfig(**PORT_CONFIG, normalization=normalization)
            model = gau_alpha.GAUAlphaForMaskedLM(config).eval()
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    if "scaleoffset" in name:
                        parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
                    else:
                        parameter.copy_(0.3 * torch.randn_like(parameter))
            folder = tmp_path_factory.mktemp(f"gau-alpha-port-{normalization}")
            model.save_pretrained(folder)
            built[normalization] = folder, model
        return built[normalization]

    return build


@pytest.mark.parametrize("normalization", list(PORT_NORMALIZATIONS))
@pytest.mark.parametrize("padding", ["left", "right"])
def test_converted_model_reproduces_the_port(port_checkpoint, tmp_path, padding: str,
                                             normalization: str) -> None:
    """``softmax_plus`` (log n / log 512, n = the row's real keys), ``softmax``, and ``squared_relu``
    (relu(a)² / n, the port's ``l``: the row's real keys, which ``relu2_length="dynamic"`` reproduces)."""
    folder, port = port_checkpoint(normalization)
    assert port.config.normalization == normalization
    converted = convert_gau_alpha(ConvertGAUAlphaArguments(checkpoint=str(folder),
                                                           output_dir=str(tmp_path / "out")))
    ours = GAUForMaskedLM.from_pretrained(converted).eval()
    assert ours.config.entropy_min_length == 1 and not ours.config.tie_word_embeddings
    assert ours.config.attention_normalization == PORT_NORMALIZATIONS[normalization]
    pad = left_padded if padding == "left" else right_padded
    ids, mask = pad(random_ids(3, 12, vocab=PORT_CONFIG["vocab_size"]), [12, 9, 4])
    with torch.no_grad():
        expected = port(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)
        got = ours(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    assert_standalone_code(converted, "gau")


def test_cli_converts_and_refuses_to_overwrite(port_checkpoint, tmp_path, capsys) -> None:
    folder, _ = port_checkpoint()
    out = tmp_path / "cli"
    assert main(["convert-gau-alpha", "--checkpoint", str(folder), "--output_dir", str(out)]) == 0
    assert ((out / "model.safetensors").exists()
            and json.loads((out / "config.json").read_text())["model_type"] == "gau")
    assert main(["convert-gau-alpha", "--checkpoint", str(folder), "--output_dir", str(out)]) == 2
    assert "--output_dir" in capsys.readouterr().err


def test_the_rope_permutation_turns_interleaved_pairs_into_half_split_pairs() -> None:
    size, theta = 8, torch.tensor([0.3, 0.7, 1.1, 1.9])
    x = torch.randn(size)
    interleaved = x.clone()
    interleaved[0::2] = x[0::2] * theta.cos() - x[1::2] * theta.sin()
    interleaved[1::2] = x[0::2] * theta.sin() + x[1::2] * theta.cos()
    y = x[interleaved_to_half_split(size)]
    half = torch.cat([y[:4] * theta.cos() - y[4:] * theta.sin(), y[4:] * theta.cos() + y[:4] * theta.sin()])
    torch.testing.assert_close(half, interleaved[interleaved_to_half_split(size)])


def test_bad_checkpoints_name_the_flag(tmp_path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for checkpoint, message in ((tmp_path / "missing", "no such checkpoint folder"),
                                (tmp_path / "bad", "not 'gau_alpha'")):
        with pytest.raises(FlagError, match=message) as error:
            convert_gau_alpha(ConvertGAUAlphaArguments(checkpoint=str(checkpoint),
                                                       output_dir=str(tmp_path / "out")))
        assert error.value.flag == "checkpoint"
    assert not (tmp_path / "out").exists()


def cut_short(path) -> None:
    path.write_bytes(path.read_bytes()[:40])


DAMAGED_PORTS = {
    "hidden_size not a number": (lambda f: edit_config(f, hidden_size="abc"), "does not describe a model"),
    "hidden_size a list": (lambda f: edit_config(f, hidden_size=[32]), "does not describe a model"),
    "hidden_size zero": (lambda f: edit_config(f, hidden_size=0, embedding_size=None),
                         "does not describe a model"),
    "a negative layer count": (lambda f: edit_config(f, num_hidden_layers=-1), "does not describe a model"),
    "an odd key size": (lambda f: edit_config(f, attention_key_size=15), "does not describe a model"),
    "an unknown activation": (lambda f: edit_config(f, hidden_act="nosuch"), "does not describe a model"),
    "config.json a list": (lambda f: (f / "config.json").write_text("[1, 2]"), "holds a JSON list"),
    "weights of another vocabulary": (lambda f: edit_config(f, vocab_size=100),
                                      "the tensors do not fit its config.json"),
    "weights cut short": (lambda f: cut_short(f / "model.safetensors"), "does not read as weights"),
    "an empty vocab.txt": (lambda f: (f / "vocab.txt").write_text(""),
                           "encodes nothing: .*Missing \\[UNK\\]"),
}


def edit_config(folder, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


@pytest.mark.parametrize("damage", list(DAMAGED_PORTS))
def test_a_damaged_port_checkpoint_is_one_error_naming_the_flag(port_checkpoint, tmp_path, damage) -> None:
    """Each gave a traceback (a config field of the wrong type or out of range, shapes that do not fit,
    weights cut short), or, for an empty vocab.txt, a folder whose tokenizer encodes nothing."""
    import shutil

    folder, _ = port_checkpoint()
    port = tmp_path / "port"
    shutil.copytree(folder, port)
    change, message = DAMAGED_PORTS[damage]
    change(port)
    with pytest.raises(FlagError, match=message) as error:
        convert_gau_alpha(ConvertGAUAlphaArguments(checkpoint=str(port), output_dir=str(tmp_path / "out")))
    assert error.value.flag == "checkpoint" and not (tmp_path / "out").exists()


PORT_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz",
                   "the", "assert", "statement", "raises", "an", "exception", "."]


@pytest.mark.parametrize("tokenizer_config",
                         [None, {"tokenizer_class": "BertTokenizer", "do_lower_case": True}])
def test_the_converted_folder_has_a_tokenizer_that_loads_and_exports(port_checkpoint, tmp_path,
                                                                      tokenizer_config) -> None:
    """A port folder often holds only ``vocab.txt``: copied as it was, ``AutoTokenizer`` could not read it and
    ``export`` refused the folder. The tokenizer returns no ``token_type_ids`` (segment 1 was silently read as
    segment 0), with or without the port's ``tokenizer_config.json``."""
    import shutil

    from transformers import AutoTokenizer

    from hf_attn_variants.hub import ExportArguments, check_export, export

    folder, _ = port_checkpoint()
    port = tmp_path / "port"
    shutil.copytree(folder, port)
    (port / "vocab.txt").write_text("\n".join(PORT_VOCABULARY) + "\n")
    if tokenizer_config is not None:
        (port / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    converted = convert_gau_alpha(ConvertGAUAlphaArguments(checkpoint=str(port),
                                                           output_dir=str(tmp_path / "out")))
    tokenizer = AutoTokenizer.from_pretrained(converted)
    batch = tokenizer("The assert statement", "raises an exception.")
    assert set(batch) == {"input_ids", "attention_mask"}, batch
    assert tokenizer.convert_ids_to_tokens(batch["input_ids"])[:4] == ["[CLS]", "the", "assert", "statement"]
    check_export(export(ExportArguments(model_name_or_path=str(converted), output_dir=str(tmp_path / "hub"))))


def test_a_port_tokenizer_larger_than_the_vocabulary_is_refused(port_checkpoint, tmp_path) -> None:
    import shutil

    folder, _ = port_checkpoint()
    port = tmp_path / "port"
    shutil.copytree(folder, port)
    (port / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(PORT_CONFIG["vocab_size"] + 1)) + "\n")
    with pytest.raises(FlagError, match=r"has \d+ tokens but the model.s vocab_size is 61") as error:
        convert_gau_alpha(ConvertGAUAlphaArguments(checkpoint=str(port), output_dir=str(tmp_path / "out")))
    assert error.value.flag == "checkpoint" and not (tmp_path / "out").exists()
