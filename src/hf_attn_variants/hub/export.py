"""``hf-attn-variants export``: write the exact folder that ``push`` would upload.

Contents: ``config.json`` with ``auto_map`` for AutoConfig and the six Auto classes, the model code
(``configuration_*.py``, ``modeling_*.py``, ``layers.py``, ``*_common.py`` — copied by ``save_pretrained``
because the package registers every class with ``register_for_auto_class``), ``model.safetensors`` (no
pickle files), the tokenizer, and ``README.md`` (the model card, see ``card.py``). The folder is assembled
under a temporary name and renamed into place, so an interrupted export never leaves a half-written folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import FAMILIES
from .card import render_model_card

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


@dataclass
class ExportArguments:
    """Arguments of ``export`` (each is also a ``--flag``)."""

    model_name_or_path: str = field(metadata={"help": "Trained model folder (pretrain/finetune output)."})
    output_dir: str = field(metadata={"help": "Folder to write (the exact content of the Hub repository)."})
    repo_id: str | None = field(
        default=None, metadata={"help": "Hub id used in the card, e.g. user/name (default: <user>/<folder name>)."}
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder if not in the model's."})
    license: str = field(default="apache-2.0", metadata={"help": "License tag of the card."})
    tags: list[str] | None = field(default=None, metadata={"help": "Extra card tags."})
    model_card_template: str | None = field(
        default=None, metadata={"help": "Jinja template (default: model_cards/<model_type>.md)."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace output_dir if it exists."})


def _model_class(config: object) -> type:
    model_type = config.model_type
    if model_type not in FAMILIES:
        raise ValueError(f"model_type must be one of {tuple(FAMILIES)}, got {model_type!r}.")
    classes = FAMILIES[model_type][1]
    architecture = (config.architectures or [""])[0]
    for cls in classes.values():
        if cls.__name__ == architecture:
            return cls
    return classes["Model"]


def export(args: ExportArguments) -> Path:
    """Write the upload folder (see module docstring) and return its path."""
    from transformers import AutoConfig, AutoTokenizer

    source = Path(args.model_name_or_path)
    if (source / "adapter_config.json").exists() and not (source / "config.json").exists():
        raise ValueError(
            f"{source} holds a LoRA adapter, not a full model; finetune with --lora_merge and export "
            f"{source / 'merged'}."
        )
    if not (source / "config.json").exists():
        raise FileNotFoundError(f"model_name_or_path: {source} has no config.json.")
    output = Path(args.output_dir)
    if output.exists() and any(output.iterdir()) and not args.overwrite:
        raise ValueError(f"output_dir {output} exists and is not empty; pass --overwrite to replace it.")
    if output.resolve() == source.resolve():
        raise ValueError("output_dir must differ from model_name_or_path.")

    config = AutoConfig.from_pretrained(source)
    model = _model_class(config).from_pretrained(source).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or source)
    except (OSError, ValueError) as error:
        raise ValueError(f"No tokenizer found in {args.tokenizer_name or source}; pass --tokenizer_name.") from error
    repo_id = args.repo_id or f"your-username/{output.resolve().name}"

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        card = render_model_card(
            model, source, model_id=repo_id, license=args.license, extra_tags=args.tags,
            template=args.model_card_template, mask_token=tokenizer.mask_token,
        )
        card.save(staging / "README.md")
        check_export(staging)
        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def check_export(folder: str | Path) -> None:
    """Raise ``ValueError`` unless ``folder`` has config with ``auto_map``, safetensors weights, the model code,
    a tokenizer and a README, and no pickle files."""
    import json

    folder = Path(folder)
    names = {p.name for p in folder.iterdir()}
    missing = [n for n in ("config.json", "README.md", "tokenizer_config.json") if n not in names]
    if not any(n.endswith(".safetensors") for n in names):
        missing.append("*.safetensors")
    if not any(n.startswith("modeling_") and n.endswith(".py") for n in names):
        missing.append("modeling_*.py")
    if missing:
        raise ValueError(f"The export in {folder} lacks {missing}.")
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ValueError(f"The export in {folder} holds pickle files {pickles}; only safetensors are allowed.")
    if "auto_map" not in json.loads((folder / "config.json").read_text()):
        raise ValueError(f"{folder}/config.json has no auto_map; trust_remote_code loading would fail.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``ExportArguments`` field."""
    from ..training.cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, ExportArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: export and print the folder."""
    from ..training.cli_utils import dataclasses_from_namespace, fail

    try:
        (args,) = dataclasses_from_namespace(namespace, ExportArguments)
        folder = export(args)
    except (ValueError, FileNotFoundError) as error:
        return fail("export", str(error))
    print(f"Exported {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))}).")
    return 0


__all__ = ["ExportArguments", "add_arguments", "check_export", "export", "run"]
