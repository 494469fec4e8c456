"""``hf-attn-variants export``: write the exact folder that ``push`` would upload.

Contents: ``config.json`` with ``auto_map`` for AutoConfig and the six Auto classes, the standalone model
code (``configuration_<family>.py``, ``modeling_<family>.py`` and the shared file: the committed files of
``hf_attn_variants/models/remote/``, which ``save_pretrained`` copies after checking they are not stale; they
run on every Transformers release from 5.0.0 on),
``model.safetensors`` (no pickle files), the tokenizer, and ``README.md`` (the model card, see ``card.py``);
with ``--sentence_transformers`` the sentence-transformers files (``sentence_transformers.py``), with
``--onnx`` ``onnx/model.onnx`` (``onnx_export.py``). The folder is assembled
under a temporary name and renamed into place, so an interrupted export never leaves a half-written folder.
"""

from __future__ import annotations

import argparse
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_utils import (
    FlagError,
    check_clearable,
    check_field_types,
    check_folder,
    check_model_folder,
    check_output_dir,
    check_repo_id,
    check_text_file,
    error_reason,
    quiet_progress,
    replace_folder,
    share_like_the_user,
    staging_folder,
)
from ..models import FAMILIES
from .card import render_model_card

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
LICENSE_PATTERN = re.compile(r"[a-z0-9][a-z0-9.+-]*", re.IGNORECASE)
"""What a Hub license identifier looks like (``apache-2.0``, ``cc-by-4.0``, ``mit``, ``other``)."""


@dataclass
class ExportArguments:
    """Arguments of ``export`` (each is also a ``--flag``)."""

    model_name_or_path: str = field(
        metadata={"help": "Trained model folder (pretrain/finetune output), or a pretrain checkpoint "
                  "(output_dir/checkpoints/step_N) of a run that did not finish."})
    output_dir: str = field(metadata={"help": "Folder to write (the exact content of the Hub repository)."})
    repo_id: str | None = field(
        default=None,
        metadata={"help": "Hub id used in the card, e.g. user/name (default: <user>/<folder name>)."}
    )
    tokenizer_name: str | None = field(default=None,
                                       metadata={"help": "Tokenizer folder if not in the model's."})
    license: str = field(default="apache-2.0", metadata={"help": "License tag of the card."})
    tags: list[str] | None = field(default=None, metadata={"help": "Extra card tags."})
    model_card_template: str | None = field(
        default=None,
        metadata={"help": "Jinja template (default: the package's hub/model_cards/<model_type>.md)."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace output_dir if it exists."})
    sentence_transformers: bool = field(
        default=False,
        metadata={"help": "Also write modules.json, sentence_bert_config.json and 1_Pooling/ so that "
                          "SentenceTransformer(folder, trust_remote_code=True) loads the folder "
                          "(docs/clients.md)."},
    )
    pooling: str | None = field(
        default=None,
        metadata={"help": "Pooling of --sentence_transformers: mean, cls, max or lasttoken (default: mean "
                          "for encoders, lasttoken for causal models)."},
    )
    onnx: bool = field(
        default=False,
        metadata={"help": "Also write onnx/model.onnx (torch.onnx dynamo export, dynamic batch and sequence, "
                          "without cache; needs onnx and onnxscript)."},
    )

    def __post_init__(self) -> None:
        """Check the values that need no file; a bad one raises ``FlagError`` (a ``ValueError``) naming it."""
        check_field_types(self)
        if self.repo_id is not None:
            check_repo_id("repo_id", self.repo_id)
        if not LICENSE_PATTERN.fullmatch(self.license):
            raise FlagError("license",
                            f"license must be a Hub license identifier such as 'apache-2.0' or 'mit', "
                            f"got {self.license!r}.")
        if self.tags is not None and any(not tag.strip() for tag in self.tags):
            raise FlagError("tags", f"tags must be non-empty words, got {self.tags}.")
        if self.pooling is not None:
            from .sentence_transformers import POOLING_MODES

            if self.pooling not in POOLING_MODES:
                raise FlagError("pooling", f"pooling must be one of {POOLING_MODES}, got {self.pooling!r}.")
            if not self.sentence_transformers:
                raise FlagError("pooling",
                                "pooling applies to --sentence_transformers only; pass that flag too.")


def _model_class(config: object) -> type:
    model_type = config.model_type
    if model_type not in FAMILIES:
        raise FlagError("model_name_or_path",
                        f"model_name_or_path holds a {model_type!r} model; export writes this "
                        f"package's families {tuple(FAMILIES)} only.")
    classes = FAMILIES[model_type][1]
    architecture = (config.architectures or [""])[0]
    for cls in classes.values():
        if cls.__name__ == architecture:
            return cls
    return classes["Model"]


def check_paths(args: ExportArguments) -> tuple[Path, Path]:
    """``(source, output)`` folders of ``args``; ``FlagError`` for a source that is neither a model folder nor
    a pretrain checkpoint, a checkpoint that is not whole (``check_checkpoint_complete``), an output that is a
    file, not empty (without ``overwrite``), holds the source, or that ``overwrite`` may not replace
    (``check_clearable``: it holds the working directory, the home folder, the tokenizer folder or the
    template), a missing tokenizer folder or template."""
    from ..training.checkpoint_model import check_checkpoint_complete, is_pretrain_checkpoint

    check_checkpoint_complete("model_name_or_path", args.model_name_or_path)  # names the one before it
    if is_pretrain_checkpoint(args.model_name_or_path):
        source = Path(args.model_name_or_path)
    else:
        source = check_model_folder("model_name_or_path", args.model_name_or_path, weights=True)
    check_output_dir("output_dir", args.output_dir)
    output = Path(args.output_dir)
    if output.resolve() == source.resolve():
        raise FlagError("output_dir", "output_dir must differ from model_name_or_path.")
    if source.resolve().is_relative_to(output.resolve()):
        raise FlagError("output_dir",
                        f"output_dir {str(output)!r} holds model_name_or_path; exporting there would "
                        "replace the model.")
    if output.exists() and any(output.iterdir()):
        if not args.overwrite:
            raise FlagError("output_dir",
                            f"output_dir {output} exists and is not empty; pass --overwrite to replace it.")
        check_clearable(output, {"tokenizer_name": args.tokenizer_name,
                                 "model_card_template": args.model_card_template}, flag="overwrite")
    if args.tokenizer_name is not None:
        check_folder("tokenizer_name", args.tokenizer_name, what="tokenizer folder")
    if args.model_card_template is not None:
        check_template(args.model_card_template)
    return source, output


def check_template(path: str) -> None:
    """``FlagError`` naming ``--model_card_template`` unless ``path`` is a file holding a valid Jinja
    template whose YAML header renders ``card_data`` (the license, tags, pipeline tag and results: without
    it the card's metadata was ``{}``)."""
    from jinja2 import Environment, TemplateSyntaxError, meta

    text = check_text_file("model_card_template", path)
    try:
        parsed = Environment().parse(text)
    except TemplateSyntaxError as error:
        raise FlagError("model_card_template", f"model_card_template: {path!r} line {error.lineno}: "
                                               f"{error.message}") from error
    if not text.startswith("---") or "card_data" not in meta.find_undeclared_variables(parsed):
        raise FlagError("model_card_template",
                        f"model_card_template: {path!r} has no YAML header rendering card_data; start it "
                        "with the lines '---', '{{ card_data }}' and '---' (the card's license, tags and "
                        "results).")


def load_model_and_tokenizer(args: ExportArguments, source: Path) -> tuple[Any, Any]:
    """The model to export (eval mode) and its tokenizer: from a model folder, or from a pretrain checkpoint
    (``checkpoint_model.py``; its tokenizer, else its run's). ``FlagError`` naming the flag otherwise."""
    from transformers import AutoConfig

    from ..training.checkpoint_model import is_pretrain_checkpoint, load_checkpoint_model, tokenizer_source
    from ..training.modeling import load_pretrained, load_tokenizer

    flag = "tokenizer_name" if args.tokenizer_name else "model_name_or_path"
    if is_pretrain_checkpoint(source):
        with quiet_progress():
            model = load_checkpoint_model(source)
        _model_class(model.config)
        folder = tokenizer_source(source)
        if folder is None and args.tokenizer_name is None:
            raise FlagError("tokenizer_name", f"--model_name_or_path {str(source)!r} is a checkpoint "
                                              "without a tokenizer (nor has its run one); pass "
                                              "--tokenizer_name.")
        tokenizer = load_tokenizer(args.tokenizer_name or str(folder), flag=flag)
        return model, _check_vocabulary(model, tokenizer, flag)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:
        reason = error_reason(error)
        raise FlagError("model_name_or_path",
                        f"model_name_or_path: {source} holds no usable config.json: {reason}") from error
    model_class = _model_class(config)
    tokenizer = _check_vocabulary(config, load_tokenizer(args.tokenizer_name or str(source), flag=flag), flag)
    with quiet_progress():
        return load_pretrained(model_class, str(source)).eval(), tokenizer


def _check_vocabulary(model_or_config: Any, tokenizer: Any, flag: str) -> Any:
    """``tokenizer``; ``FlagError`` naming ``flag`` when it has more tokens than the model's ``vocab_size``
    (its ids past the embeddings would fail every forward, the card's example included)."""
    config = getattr(model_or_config, "config", model_or_config)
    if len(tokenizer) > config.vocab_size:
        raise FlagError(flag, f"{flag}: the tokenizer has {len(tokenizer)} tokens but the model's vocab_size "
                              f"is {config.vocab_size}; pass the tokenizer the model was trained with.")
    return tokenizer


def export(args: ExportArguments) -> Path:
    """Write the upload folder (see module docstring) and return its path. Every input is checked (and the
    model, tokenizer and card are built) before anything is written: a bad one raises ``FlagError``."""
    source, output = check_paths(args)
    if args.onnx:
        import importlib.util

        absent = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if absent:
            raise FlagError("onnx",
                            f"--onnx needs the {' and '.join(absent)} package(s), not installed here: "
                            "pip install onnx onnxscript onnxruntime")
    model, tokenizer = load_model_and_tokenizer(args, source)
    repo_id = args.repo_id or f"your-username/{output.resolve().name}"
    card = render_model_card(
        model, source, model_id=repo_id, license=args.license, extra_tags=args.tags,
        template=args.model_card_template, mask_token=tokenizer.mask_token, tokenizer=tokenizer,
    )

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(output)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        card.save(staging / "README.md")
        if args.sentence_transformers:
            from .sentence_transformers import write_sentence_transformers_files

            write_sentence_transformers_files(staging, model.config, args.pooling)
        if args.onnx:
            from .onnx_export import ONNX_PATH, export_onnx

            try:
                export_onnx(model, staging / ONNX_PATH)
            except ValueError as error:
                raise FlagError("onnx", f"--onnx: {error}") from error
        check_export(staging)
        share_like_the_user(staging)
        replace_folder(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def check_export(folder: str | Path) -> None:
    """Raise ``ValueError`` unless ``folder`` is what ``push`` may upload: a JSON-object ``config.json`` with
    ``auto_map``, safetensors weights whose headers read (and every shard an index names), exactly the model
    code its files import, a tokenizer that loads, a README, and no pickle file anywhere in the tree."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"There is no export folder {str(folder)!r}"
                         f"{' (it is a file)' if folder.exists() else ''}.")
    names = {p.name for p in folder.iterdir()}
    missing = [n for n in ("config.json", "README.md", "tokenizer_config.json") if not (folder / n).is_file()]
    if not any(n.endswith(".safetensors") for n in names):
        missing.append("*.safetensors")
    config = _read_config(folder) if "config.json" not in missing else {}
    model_type = config.get("model_type")  # without config.json, the code files cannot be named
    code = {f"configuration_{model_type}.py", f"modeling_{model_type}.py"} if model_type else set()
    missing += sorted(code - names)
    if missing:
        raise ValueError(f"The export in {folder} lacks {missing}.")
    if not model_type:
        raise ValueError(f"{folder}/config.json names no model_type, so the model code it needs is unknown.")
    _check_code_files(folder, names, code)
    pickles = sorted(str(path.relative_to(folder)) for path in folder.rglob("*")
                     if path.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise ValueError(f"The export in {folder} holds pickle files {pickles}; only safetensors are "
                         "allowed.")
    if "auto_map" not in config:
        raise ValueError(f"{folder}/config.json has no auto_map; trust_remote_code loading would fail.")
    _check_weights(folder, names)
    _check_tokenizer(folder)


def _read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict; ``ValueError`` for a file that is not a JSON object."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{folder}/config.json cannot be read as JSON: {error_reason(error)}") from error
    if not isinstance(config, dict):
        raise ValueError(f"{folder}/config.json must hold a JSON object, got a {type(config).__name__}.")
    return config


def _check_code_files(folder: Path, names: set[str], code: set[str]) -> None:
    """``ValueError`` unless the ``.py`` files are exactly ``code`` and what it imports."""
    from transformers.dynamic_module_utils import get_relative_imports

    # What Transformers copies: the direct relative imports of the files it loads (before 5.10 no others).
    code = code | {f"{name}.py" for file in sorted(code) for name in get_relative_imports(folder / file)}
    missing = sorted(code - names)
    extra_code = sorted(n for n in names if n.endswith(".py") and n not in code)
    if missing or extra_code:
        raise ValueError(
            f"The export in {folder} has code files {sorted(n for n in names if n.endswith('.py'))}, but "
            f"its model and config files import exactly {sorted(code)}: every imported file must be there, "
            "and no other."
        )


def _check_weights(folder: Path, names: set[str]) -> None:
    """``ValueError`` unless every top-level ``.safetensors`` file's header reads and every shard that
    ``model.safetensors.index.json`` names is there."""
    import json

    from safetensors import safe_open

    for name in sorted(n for n in names if n.endswith(".safetensors")):
        try:
            with safe_open(str(folder / name), framework="pt") as weights:
                weights.keys()
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types for a bad header
            raise ValueError(f"The export in {folder} has weights {name} that do not read as safetensors: "
                             f"{error_reason(error)}") from error
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{index} is not a safetensors index (a JSON object with a weight_map)."
                             ) from error
        if sorted(shards - names):
            raise ValueError(f"The export in {folder} lacks the shards {sorted(shards - names)} that "
                             "model.safetensors.index.json names.")


def _check_tokenizer(folder: Path) -> None:
    """``ValueError`` unless ``AutoTokenizer`` loads the folder's tokenizer (what a card's code reads)."""
    from transformers import AutoTokenizer

    try:
        with quiet_progress():
            AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - a tokenizer that does not load fails in many types
        raise ValueError(f"The export in {folder} has a tokenizer that does not load: "
                         f"{error_reason(error)}") from error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``ExportArguments`` field."""
    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, ExportArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: export and print the folder; a bad flag value gives one error line naming it, exit 2."""
    from ..cli_utils import run_dataclass_command

    return run_dataclass_command(
        "export", namespace, ExportArguments, export,
        lambda args, folder: f"Exported {folder} ({', '.join(sorted(p.name for p in folder.iterdir()))}).")


__all__ = ["ExportArguments", "add_arguments", "check_export", "check_paths", "export",
           "load_model_and_tokenizer", "run"]
