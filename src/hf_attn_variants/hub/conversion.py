"""``hf-attn-variants convert-gau-alpha``: the GAU-α checkpoint of its PyTorch port → ``GAUForMaskedLM``.

GAU-α (Su Jianlin, 2022) was released for bert4keras; the PyPI package ``gau-alpha`` (0.0.3) ports it to
PyTorch and stores the weights as ``gau_alpha.embeddings.{word,token_type}_embeddings.weight``,
``gau_alpha.encoder.layer.{i}.gau.{i_dense,o_dense,q_scaleoffset,k_scaleoffset}.weight`` and
``cls.predictions.decoder.weight`` next to a ``config.json`` (``GAUAlphaConfig``). The maths agrees with this
package's GAU (tested against the port itself to 1e-5) once four things are aligned:

- **RoPE layout.** The port (like bert4keras) rotates interleaved pairs (2i, 2i+1) of q and k; this package
  rotates half-split pairs (i, i + s/2), as Transformers does. q and k are z·γ (+ β), so permuting the
  s dimensions of z — the last s rows of ``in_proj`` — and of γ, β by (0, 2, 4, …, 1, 3, 5, …) turns one
  into the other; q·kᵀ is unchanged by a common permutation.
- **Token types.** The port adds a segment embedding; this package has none. Segment 0 (every single-text
  input) is folded into the token embeddings. Segment 1 cannot be represented: inputs with
  ``token_type_ids == 1`` (sentence pairs) are not supported by the converted model, so its tokenizer (the
  port's ``BertTokenizer``, written as ``tokenizer.json``) returns no ``token_type_ids``.
- **Padding.** The port builds its mask from ``input_ids != pad_token_id`` when given none; the converted
  model follows Transformers and attends to every token unless ``attention_mask`` says otherwise (the
  tokenizer returns one).
- **Offsets.** GAU-α has no β (bert4keras ties it to ``use_bias=False``): β = 0 here.
- **The n ≥ 16 clamp.** bert4keras added the clamp of softmax_plus's n at 16 in March 2023; GAU-α was trained
  in 2022 without it, so the converted config uses ``entropy_min_length=1``.

The MLM decoder is copied as ``lm_head`` with ``tie_word_embeddings=False``: the token embeddings now carry
segment 0, the decoder does not.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cli_utils import (
    FlagError,
    check_clearable,
    check_field_types,
    check_folder,
    check_output_dir,
    error_reason,
    replace_folder,
    share_like_the_user,
    staging_folder,
)
from ..models.configuration_gau import GAUConfig
from ..models.modeling_gau import GAUForMaskedLM

PORT_NORMALIZATIONS = {"softmax_plus": "softmax_plus", "softmax": "softmax", "squared_relu": "relu2"}
"""The port's ``normalization`` → ``attention_normalization`` (its squared_relu divides by the row's real
keys)."""
PORT_BASE_LENGTH = 512
"""softmax_plus's log(n) / log(512) in the port (and bert4keras) is hard-coded to 512."""
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")
"""A port folder holds its tokenizer if it has one of these (the port's tokenizer is ``BertTokenizer``)."""


@dataclass
class ConvertGAUAlphaArguments:
    """Arguments of ``convert-gau-alpha`` (each is also a ``--flag``)."""

    checkpoint: str = field(metadata={"help": "Folder of the gau-alpha port: config.json and "
                                              "pytorch_model.bin or model.safetensors (and vocab.txt, copied "
                                              "as the tokenizer)."})
    output_dir: str = field(metadata={"help": "Folder to write the GAUForMaskedLM to (with standalone remote "
                                              "code)."})
    overwrite: bool = field(default=False,
                            metadata={"help": "Replace output_dir if it exists and is not empty."})

    def __post_init__(self) -> None:
        """Each value has its type (``check_field_types``); ``convert_gau_alpha`` checks the folders."""
        check_field_types(self)


def interleaved_to_half_split(size: int) -> torch.Tensor:
    """Indices p with new[j] = old[p[j]]: (0, 2, 4, …, size − 2, 1, 3, …, size − 1).

    Rotating pairs (2i, 2i + 1) by θᵢ (bert4keras RoPE) on ``old`` equals rotating pairs (i, i + size/2) by θᵢ
    (Transformers' ``rotate_half``) on ``new``.
    """
    return torch.cat([torch.arange(0, size, 2), torch.arange(1, size, 2)])


def gau_config_from_port(port: dict[str, Any]) -> GAUConfig:
    """The ``GAUConfig`` of a port ``config.json``; ``FlagError`` naming ``checkpoint`` for what cannot be
    converted."""
    hidden = int(port.get("hidden_size", 768))
    if port.get("embedding_size") not in (None, hidden):
        raise FlagError("checkpoint",
                        f"embedding_size {port['embedding_size']} != hidden_size {hidden} is not supported.")
    if not port.get("attention_scale", True):
        raise FlagError("checkpoint", "attention_scale=False (logits without 1/√s) is not supported.")
    normalization = port.get("normalization", "softmax_plus")
    if normalization not in PORT_NORMALIZATIONS:
        raise FlagError("checkpoint",
                        f"normalization {normalization!r} is not one of {tuple(PORT_NORMALIZATIONS)}.")
    act = port.get("hidden_act", "swish")
    return GAUConfig.gau_alpha_base(
        vocab_size=int(port.get("vocab_size", 12000)),
        hidden_size=hidden,
        num_hidden_layers=int(port.get("num_hidden_layers", 24)),
        expansion_factor=int(port.get("intermediate_size", 2 * hidden)) / hidden,
        attention_key_size=int(port.get("attention_key_size", 128)),
        attention_normalization=PORT_NORMALIZATIONS[normalization],
        relu2_length="dynamic",
        base_length=PORT_BASE_LENGTH,
        entropy_min_length=1,
        hidden_act="silu" if act == "swish" else act,
        layer_norm_eps=float(port.get("layer_norm_eps", 1e-12)),
        hidden_dropout_prob=float(port.get("hidden_dropout_prob", 0.1)),
        attention_probs_dropout_prob=float(port.get("attention_probs_dropout_prob", 0.1)),
        use_bias=bool(port.get("use_bias", False)),
        max_position_embeddings=int(port.get("max_position_embeddings", 512)),
        pad_token_id=port.get("pad_token_id", 0),
        tie_word_embeddings=False,
    )


def convert_state_dict(port: dict[str, torch.Tensor], config: GAUConfig) -> dict[str, torch.Tensor]:
    """The ``GAUForMaskedLM`` state dict of a port state dict (see the module docstring); ``FlagError`` naming
    ``checkpoint`` for missing or unexpected tensors."""
    remaining = dict(port)

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        if name not in remaining and required:
            raise FlagError("checkpoint", f"the checkpoint has no tensor {name!r}.")
        return remaining.pop(name, None)

    e, s = config.intermediate_width, config.attention_key_size
    order = interleaved_to_half_split(s)
    rows = torch.cat([torch.arange(2 * e), 2 * e + order])
    words = take("gau_alpha.embeddings.word_embeddings.weight")
    segments = take("gau_alpha.embeddings.token_type_embeddings.weight", required=False)
    out = {"model.embed_tokens.weight": words + (segments[0] if segments is not None else 0)}
    for i in range(config.num_hidden_layers):
        port_prefix, prefix = f"gau_alpha.encoder.layer.{i}.gau.", f"model.layers.{i}.gau."
        out[prefix + "in_proj.weight"] = take(port_prefix + "i_dense.weight")[rows]
        out[prefix + "out_proj.weight"] = take(port_prefix + "o_dense.weight")
        scales = [take(port_prefix + f"{r}_scaleoffset.weight")[order] for r in ("q", "k")]
        out[prefix + "qk_scale"] = torch.stack(scales)
        offsets = [take(port_prefix + f"{r}_scaleoffset.bias", required=False) for r in ("q", "k")]
        out[prefix + "qk_offset"] = torch.stack(
            [torch.zeros(s) if b is None else b[order] for b in offsets]
        )
        if config.use_bias:
            out[prefix + "in_proj.bias"] = take(port_prefix + "i_dense.bias")[rows]
            out[prefix + "out_proj.bias"] = take(port_prefix + "o_dense.bias")
    out["lm_head.weight"] = take("cls.predictions.decoder.weight")
    if remaining:
        raise FlagError("checkpoint",
                        f"the checkpoint has tensors this converter does not know: {sorted(remaining)[:5]}.")
    return out


def read_port_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config.json, state dict)`` of a port folder (safetensors preferred, else ``pytorch_model.bin``)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FlagError("checkpoint", f"{str(folder)!r} has no config.json.")
    try:
        port_config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FlagError("checkpoint", f"{config_file} is not valid JSON: {error}.") from error
    if not isinstance(port_config, dict):
        raise FlagError("checkpoint", f"{config_file} holds a JSON {type(port_config).__name__}, not an "
                                      "object of config fields.")
    if port_config.get("model_type") != "gau_alpha":
        raise FlagError("checkpoint",
                        f"{config_file} has model_type {port_config.get('model_type')!r}, not 'gau_alpha'.")
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return port_config, read_port_weights(folder / name)
    raise FlagError("checkpoint", f"{str(folder)!r} has neither model.safetensors nor pytorch_model.bin.")


def read_port_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (safetensors, or a ``pytorch_model.bin`` read with ``weights_only``);
    ``FlagError`` naming ``checkpoint`` for a file that does not read as such (cut short, or not weights)."""
    import pickle

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        if path.suffix == ".safetensors":
            return load_file(path)
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as error:
        raise FlagError("checkpoint", f"checkpoint: {str(path)!r} does not read as weights: "
                                      f"{error_reason(error)}") from error
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise FlagError("checkpoint", f"checkpoint: {str(path)!r} holds no dict of tensors.")
    return weights


def converted_model(source: Path) -> GAUForMaskedLM:
    """The ``GAUForMaskedLM`` of the port folder ``source``, its weights converted; ``FlagError`` naming
    ``checkpoint`` for a config the model refuses (a field of the wrong type or out of range) or tensors
    whose shapes do not fit it."""
    port_config, port_state = read_port_checkpoint(source)
    try:
        config = gau_config_from_port(port_config)
    except FlagError:
        raise
    except (ValueError, TypeError, ZeroDivisionError) as error:  # ZeroDivisionError: hidden_size 0
        raise FlagError("checkpoint", f"checkpoint: {str(source / 'config.json')!r} does not describe a "
                                      f"model: {error_reason(error)}") from error
    model = GAUForMaskedLM(config)
    try:
        missing, unexpected = model.load_state_dict(convert_state_dict(port_state, config), strict=False)
    except (RuntimeError, IndexError) as error:  # a tensor of another shape than the config says
        raise FlagError("checkpoint", f"checkpoint: the tensors do not fit its config.json: "
                                      f"{error_reason(error)}") from error
    if missing or unexpected:
        raise FlagError("checkpoint", f"converted tensors do not fit the model: missing {missing}, "
                                      f"unexpected {unexpected}.")
    return model


def read_port_tokenizer(folder: Path, vocab_size: int) -> Any | None:
    """The port folder's ``BertTokenizer`` without ``token_type_ids`` (the converted model has no segments),
    or ``None`` when the folder holds none of ``TOKENIZER_FILES``. ``FlagError`` naming ``checkpoint`` for one
    that does not load, or holds more tokens than the model's ``vocab_size``.

    A port folder often holds only ``vocab.txt``, which ``AutoTokenizer`` cannot read (no
    ``tokenizer_config.json`` says which class); saving the tokenizer writes ``tokenizer.json`` and
    ``tokenizer_config.json``, so the converted folder loads with ``AutoTokenizer`` and exports."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import BertTokenizer

    try:
        tokenizer = BertTokenizer.from_pretrained(folder, model_input_names=["input_ids", "attention_mask"])
    except (OSError, ValueError, TypeError) as error:
        raise FlagError("checkpoint", f"checkpoint: the tokenizer in {str(folder)!r} does not load: "
                                      f"{error_reason(error)}") from error
    if len(tokenizer) > vocab_size:
        raise FlagError("checkpoint", f"checkpoint: the tokenizer in {str(folder)!r} has {len(tokenizer)} "
                                      f"tokens but the model's vocab_size is {vocab_size}.")
    try:  # a vocab.txt without the unknown token (an empty one) loads and then encodes nothing
        tokenizer("a")
    except Exception as error:  # noqa: BLE001 (the tokenizers library raises a bare Exception)
        raise FlagError("checkpoint", f"checkpoint: the tokenizer in {str(folder)!r} encodes nothing: "
                                      f"{error_reason(error)}") from error
    return tokenizer


def convert_gau_alpha(args: ConvertGAUAlphaArguments) -> Path:
    """Convert the port checkpoint in ``args.checkpoint`` and write a ``GAUForMaskedLM`` folder to
    ``args.output_dir``.

    Everything is read and checked before anything is written; the folder is assembled under a temporary name
    and renamed, so a failure leaves no half-written output.
    """
    source = check_folder("checkpoint", args.checkpoint, what="checkpoint folder")
    check_output_dir("output_dir", args.output_dir)  # before Path(): Path("") is "."
    output = Path(args.output_dir)
    if output.exists() and any(output.iterdir()):
        if not args.overwrite:
            raise FlagError("output_dir", f"output_dir {str(output)!r} exists and is not empty; pass "
                                          "--overwrite to replace it.")
        check_clearable(output, {"checkpoint": str(source)}, flag="overwrite")
    model = converted_model(source)
    tokenizer = read_port_tokenizer(source, model.config.vocab_size)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(output)
    try:
        model.eval().save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        share_like_the_user(staging)
        replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``ConvertGAUAlphaArguments`` field."""
    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, ConvertGAUAlphaArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry; a bad flag value gives one error line naming it, exit status 2."""
    from ..cli_utils import run_dataclass_command

    return run_dataclass_command(
        "convert-gau-alpha", namespace, ConvertGAUAlphaArguments, convert_gau_alpha,
        lambda args, folder: f"Converted {args.checkpoint} → {folder} (GAUForMaskedLM; load it with "
                             "GAUForMaskedLM.from_pretrained, or anywhere with AutoModelForMaskedLM and "
                             "trust_remote_code=True)." + (
                                 "" if (folder / "tokenizer_config.json").is_file() else
                                 f" {args.checkpoint} has no tokenizer (vocab.txt): pass one to export as "
                                 "--tokenizer_name."))


__all__ = [
    "ConvertGAUAlphaArguments",
    "add_arguments",
    "convert_gau_alpha",
    "convert_state_dict",
    "gau_config_from_port",
    "interleaved_to_half_split",
    "read_port_checkpoint",
    "read_port_tokenizer",
    "run",
]
