"""The model inside a ``pretrain`` checkpoint (``output_dir/checkpoints/step_<k>``), for ``export``.

A checkpoint holds what resuming needs: the training module's full state (``model.safetensors``; the
accelerate path's MLMs carry ``TargetOnlyMLMLoss``'s ``model.`` key prefix), the optimizer, the scheduler and
the random states (``safe_state.py``). So that a run stopped early (Ctrl-C, a preemption, a kill) still leaves
something usable, every checkpoint also carries the language model's ``config.json`` (with its architecture)
and the tokenizer (``write_model_files``), and ``training_state.json`` records the objective.
``load_checkpoint_model`` rebuilds the language model from those files: the training module of the same kind
the run trained, its state loaded strictly, the ``*ForMaskedLM`` / ``*ForCausalLM`` inside returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..cli_utils import FlagError, check_no_remote_code, error_reason
from .checkpoints import (
    STATE_FILE,
    Checkpoint,
    broken_checkpoint_error,
    pretrain_checkpoints,
    read_pretrain_checkpoint,
)
from .safe_state import MODEL_FILE, load_safely, read_tensors

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer_config.json"


def is_pretrain_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` is a ``pretrain`` checkpoint (its ``training_state.json`` and weights are there)."""
    path = Path(folder)
    return (path / STATE_FILE).is_file() and (path / MODEL_FILE).is_file()


def write_model_files(folder: Path, model: PreTrainedModel, tokenizer: Any) -> None:
    """Into a checkpoint being written: the language model's ``config.json`` (``architectures`` set, no code
    files) and the tokenizer's files."""
    config = model.config
    architectures = config.architectures
    config.architectures = [type(model).__name__]
    try:
        config.to_json_file(folder / CONFIG_FILE)
    finally:
        config.architectures = architectures
    tokenizer.save_pretrained(folder)


def tokenizer_source(checkpoint: Path) -> Path | None:
    """Where the tokenizer of ``checkpoint`` is: the checkpoint itself, else its run's output folder (two
    levels up) when that holds one; ``None`` otherwise."""
    for folder in (checkpoint, checkpoint.parent.parent):
        if (folder / TOKENIZER_FILE).is_file():
            return folder
    return None


def checkpoint_of(folder: Path) -> Checkpoint | None:
    """``folder`` as a checkpoint, or ``None`` when it is not one: a ``pretrain`` one
    (``training_state.json``), or a ``Trainer`` one (``checkpoint-<step>`` with ``trainer_state.json``). A
    ``finetune`` run's (its folder has ``run.json``) must have its manifest: without one its save did not
    finish. Any other ``Trainer`` checkpoint is probed with the safe loaders."""
    from .outputs import RUN_FILE
    from .trainer_hooks import CHECKPOINT_NAME, read_trainer_checkpoint

    if (checkpoint := read_pretrain_checkpoint(folder)) is not None:
        return checkpoint
    if CHECKPOINT_NAME.fullmatch(folder.name) is None or not (folder / "trainer_state.json").is_file():
        return None
    return read_trainer_checkpoint(folder, require_manifest=(folder.parent / RUN_FILE).is_file())


def run_folder(checkpoint: Path) -> Path:
    """The output folder of the run that wrote ``checkpoint``: ``pretrain``'s ``<run>/checkpoints/<name>``,
    a ``Trainer`` checkpoint's ``<run>/checkpoint-<step>``."""
    return checkpoint.parent.parent if (checkpoint / STATE_FILE).is_file() else checkpoint.parent


def check_checkpoint_complete(flag: str, folder: str | Path) -> None:
    """``FlagError`` naming ``flag`` when ``folder`` is a checkpoint that is not whole (a file cut short or
    changed since the save, a save that did not finish: ``Checkpoint.problem``), with the newest complete
    checkpoint of its run before it; nothing for a complete checkpoint or a folder that is not one."""
    from .trainer_hooks import trainer_checkpoints

    checkpoint = checkpoint_of(Path(folder))
    if checkpoint is None or (problem := checkpoint.problem()) is None:
        return
    run = run_folder(checkpoint.path)
    pretrain = (checkpoint.path / STATE_FILE).is_file()
    raise broken_checkpoint_error(flag, checkpoint, problem,
                                  pretrain_checkpoints(run) if pretrain else trainer_checkpoints(run))


def load_checkpoint_model(checkpoint: str | Path, flag: str = "model_name_or_path") -> torch.nn.Module:
    """The language model trained up to ``checkpoint`` (a ``pretrain`` checkpoint folder), in eval mode;
    ``FlagError`` naming ``flag`` in one sentence for a checkpoint that cannot give one."""
    from transformers import AutoConfig

    from .modeling import TargetOnlyMLMLoss, build_lm_model, has_target_only_mlm_head

    folder = Path(checkpoint)
    if not (folder / CONFIG_FILE).is_file():
        raise FlagError(flag, f"{flag}: the checkpoint {str(folder)!r} was written before checkpoints "
                              "carried config.json; export the run's finished output folder instead, or "
                              "resume the run for one more checkpoint.")
    state = json.loads((folder / STATE_FILE).read_text())
    check_no_remote_code(flag, folder / CONFIG_FILE)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    objective = state.get("objective") or (
        "clm" if any(name.endswith("ForCausalLM") for name in config.architectures or ()) else "mlm")
    model = build_lm_model(config, objective)
    wrapped = not state.get("sharded") and objective == "mlm" and has_target_only_mlm_head(model)
    module = TargetOnlyMLMLoss(model) if wrapped else model
    tensors = load_safely(folder / MODEL_FILE, read_tensors, flag)
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        reason = error_reason(error, 300)
        raise FlagError(flag, f"{flag}: the weights of the checkpoint {str(folder)!r} do not fit its "
                              f"config.json ({reason}).") from error
    return model.eval()


__all__ = ["CONFIG_FILE", "check_checkpoint_complete", "checkpoint_of", "is_pretrain_checkpoint",
           "load_checkpoint_model", "run_folder", "tokenizer_source", "write_model_files"]
