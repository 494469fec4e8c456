"""Model cards for exported folders, rendered with ``huggingface_hub.ModelCard`` from
``model_cards/<family>.md`` (package data next to this module, read through ``importlib.resources``, so a
wheel install has them too).

The YAML header is a ``ModelCardData``: ``library_name: transformers``, ``pipeline_tag``, tags
(``custom_code``, the family, the task, ``hf_attn_variants``), ``license`` and ``model-index`` with the
evaluation results found next to the model (``all_results.json``/``eval_results.json`` written by
pretrain/finetune, and ``eval_by_length.json`` written by the demo / length studies). The body comes from
the family's Jinja template, filled with the architecture and attention settings (read generically from
the config: every argument the family adds to the shared base config), the training data, a results
table, a usage snippet with ``trust_remote_code=True`` and the citations.
"""

from __future__ import annotations

import inspect
import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..models.compat import MIN_TRANSFORMERS_VERSION
from ..models.configuration_common import AttnVariantConfig, MultiHeadAttnVariantConfig
from ..models.standalone import SHARED_FILE, shared_code_sha256

TASKS = {
    # architecture suffix: (pipeline tag, Auto class, task name for model-index)
    "ForMaskedLM": ("fill-mask", "AutoModelForMaskedLM", "Masked language modeling"),
    "ForCausalLM": ("text-generation", "AutoModelForCausalLM", "Causal language modeling"),
    "ForSequenceClassification": ("text-classification", "AutoModelForSequenceClassification",
                                  "Text classification"),
    "ForTokenClassification": ("token-classification", "AutoModelForTokenClassification",
                               "Token classification"),
    "ForQuestionAnswering": ("question-answering", "AutoModelForQuestionAnswering", "Question answering"),
    "Model": ("feature-extraction", "AutoModel", "Feature extraction"),
}
ARCHITECTURE_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
    "max_position_embeddings", "position_embedding_type", "rope_theta", "hidden_act", "norm_type",
    "norm_position", "use_bias", "hidden_dropout_prob", "attention_probs_dropout_prob", "tie_word_embeddings",
)
METRIC_NAMES = {"loss": "loss", "perplexity": "perplexity", "accuracy": "accuracy", "f1": "f1",
                "precision": "precision", "recall": "recall", "mse": "mse"}

DEFAULT_TEMPLATE = """---
{{ card_data }}
---

# {{ model_id }}

A `{{ model_type }}` model (`{{ architecture }}`) made with the `hf_attn_variants` package. Load it with
`trust_remote_code=True`: the model code is in this repository, the package is not needed.

## Architecture
{{ architecture_table }}

## Attention settings
{{ attention_table }}

## Training data
{{ training_data }}

## Evaluation
{{ results_table }}

## Usage
```python
{{ usage }}
```
"""


def model_cards_dir() -> Traversable:
    """The package's ``model_cards/`` folder (package data of ``hf_attn_variants.hub``)."""
    return resources.files(__package__).joinpath("model_cards")


def template_for(model_type: str, explicit: str | None = None) -> tuple[str | None, str | None]:
    """``(template_path, template_str)`` for ``ModelCard.from_template``: explicit path, the family's file in
    ``model_cards/``, or the generic built-in template (a model type without a card of its own)."""
    if explicit is not None:
        if not Path(explicit).is_file():
            raise FileNotFoundError(f"model_card_template: no such file {explicit!r}.")
        return explicit, None
    card = model_cards_dir().joinpath(f"{model_type}.md")
    if card.is_file():
        return None, card.read_text(encoding="utf-8")
    return None, DEFAULT_TEMPLATE


def _markdown_table(rows: list[tuple[str, Any]], header: tuple[str, str] = ("setting", "value")) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| `{name}` | {value if not isinstance(value, (list, dict)) else json.dumps(value)} |"
              for name, value in rows]
    return "\n".join(lines)


def _init_parameters(config_class: type) -> list[str]:
    return [name for name, p in inspect.signature(config_class.__init__).parameters.items()
            if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


def attention_settings(config: Any) -> list[tuple[str, Any]]:
    """The fields a family adds to the shared config (its attention settings): its ``__init__`` arguments that
    the shared base configs do not have."""
    shared = {*_init_parameters(AttnVariantConfig), *_init_parameters(MultiHeadAttnVariantConfig)}
    return [(name, getattr(config, name)) for name in _init_parameters(type(config)) if name not in shared]


def architecture_settings(config: Any, num_parameters: int | None) -> list[tuple[str, Any]]:
    """Shape and shared settings present on ``config`` (``num_attention_heads`` only where it exists)."""
    rows = [(name, getattr(config, name)) for name in ARCHITECTURE_FIELDS if hasattr(config, name)]
    if getattr(config, "pruned_heads", None):
        rows.append(("pruned_heads", config.pruned_heads))
    if num_parameters is not None:
        rows.insert(0, ("parameters", f"{num_parameters:,}"))
    return rows


def _read_json(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else {}


def _numbers(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def collect_results(source: Path) -> dict[str, Any]:
    """Metrics and training information stored next to a trained model by pretrain/finetune/demo; for a
    checkpoint of a run (``checkpoint_results``), what its run recorded up to it."""
    checkpoint = checkpoint_results(source)
    if checkpoint is not None:
        return checkpoint
    metrics = {**_read_json(source, "all_results.json"), **_read_json(source, "eval_results.json")}
    return {
        "metrics": _numbers(metrics),
        "pretrain": _read_json(source, "pretrain_args.json"),
        "task": _read_json(source, "task_config.json"),
        "by_length": _read_json(source, "eval_by_length.json"),
    }


def checkpoint_results(source: Path) -> dict[str, Any] | None:
    """``collect_results`` for a checkpoint (``None`` for any other folder): a ``pretrain`` checkpoint
    (``checkpoints/step_<k>``) or a ``finetune`` one (``checkpoint-<k>``) holds no results files of its own,
    so the training data comes from its run's ``run.json`` (the run's arguments), the last evaluation from the
    checkpoint's ``trainer_state.json`` (finetune), and ``"checkpoint"`` says at which step of how many it
    was saved."""
    from types import SimpleNamespace

    from ..training.checkpoint_model import checkpoint_of, is_pretrain_checkpoint, run_folder
    from ..training.outputs import RunRecord
    from ..training.pretrain import dataset_info

    checkpoint = checkpoint_of(source)
    if checkpoint is None:
        return None
    step = checkpoint.step
    pretrain = is_pretrain_checkpoint(source)
    record = RunRecord.read(run_folder(source))
    arguments = record.arguments if record is not None else {}
    results: dict[str, Any] = {"metrics": {}, "pretrain": {}, "task": {}, "by_length": {}}
    if pretrain:
        total = arguments.get("max_train_steps")
        if arguments:
            names = ("dataset_name", "dataset_config_name", "train_file")
            results["pretrain"] = {**arguments,
                                   **dataset_info(SimpleNamespace(**{n: arguments.get(n) for n in names}))}
    else:
        state = _read_json(source, "trainer_state.json")
        total = state.get("max_steps")
        evaluations = [row for row in state.get("log_history", []) if "eval_loss" in row]
        results["metrics"] = _numbers(evaluations[-1]) if evaluations else {}
        if arguments:
            labels = _read_json(source, "config.json").get("id2label") or {}
            results["task"] = {**arguments, "label_list": list(labels.values()) or None}
    results["checkpoint"] = {"step": step, "of": total if isinstance(total, int) and total > 0 else None}
    return results


def _eval_results(model_id: str, task: tuple[str, str, str], results: dict[str, Any]) -> list[EvalResult]:
    pipeline_tag, _, task_name = task
    info = results["pretrain"] or results["task"]
    dataset = str(info.get("dataset") or info.get("validation_file") or info.get("train_file") or "unknown")
    dataset_name = info.get("dataset_name") or dataset
    out = []
    for key, value in sorted(results["metrics"].items()):
        name = key.removeprefix("eval_")
        if key.startswith("eval_") and name in METRIC_NAMES:
            out.append(EvalResult(task_type=pipeline_tag, task_name=task_name, dataset_type=dataset,
                                  dataset_name=str(dataset_name)[:120], dataset_split="validation",
                                  metric_type=METRIC_NAMES[name], metric_name=f"validation {name}",
                                  metric_value=round(float(value), 6)))
    for row in results["by_length"].get("results", []):
        for name in ("loss", "accuracy"):
            if name in row:
                out.append(EvalResult(task_type=pipeline_tag, task_name=task_name, dataset_type=dataset,
                                      dataset_name=str(dataset_name)[:120], dataset_split="validation",
                                      metric_type=name,
                                      metric_name=f"validation {name} @ {row['length']} tokens",
                                      metric_value=round(float(row[name]), 6)))
    return out


def _results_table(results: dict[str, Any]) -> str:
    rows = [(k, round(v, 4) if isinstance(v, float) else v) for k, v in sorted(results["metrics"].items())
            if k.startswith("eval_") and k.removeprefix("eval_") in METRIC_NAMES]
    text = (_markdown_table(rows, ("metric", "value")) if rows
            else "No evaluation results were stored with the model.")
    by_length = results["by_length"].get("results", [])
    if by_length:
        train_length = results["by_length"].get("train_length")
        text += f"\n\nValidation at the training length L = {train_length} and beyond:\n\n"
        text += "| length | loss | accuracy |\n|---|---|---|\n"
        text += "\n".join(f"| {r['length']} | {r['loss']:.4f} | {r.get('accuracy', float('nan')):.4f} |"
                          for r in by_length)
    return text


def _checkpoint_sentence(results: dict[str, Any]) -> str:
    """For a checkpoint: the step it was saved at (of how many the run was to train), else ``""``."""
    checkpoint = results.get("checkpoint")
    if checkpoint is None:
        return ""
    of = f" of the run's {checkpoint['of']}" if checkpoint["of"] else ""
    return (f"This is the checkpoint saved after training step {checkpoint['step']}{of}, exported before the "
            "run finished.\n\n")


def _training_data(results: dict[str, Any]) -> str:
    pre, task = results["pretrain"], results["task"]
    prefix = _checkpoint_sentence(results)
    if pre:
        keys = ("objective", "max_seq_length", "per_device_train_batch_size", "gradient_accumulation_steps",
                "learning_rate", "max_train_steps", "num_train_epochs", "lr_scheduler_type", "seed")
        rows = [(k, pre[k]) for k in keys if pre.get(k) is not None]
        blocks = f" ({pre['train_blocks']} training blocks)" if pre.get("train_blocks") is not None else ""
        return (prefix + "Pretrained with `hf-attn-variants pretrain` on "
                f"{pre.get('dataset_description', pre.get('dataset'))}{blocks}.\n\n"
                + _markdown_table(rows, ("argument", "value")))
    if task:
        return (prefix + f"Finetuned with `hf-attn-variants finetune` ({task.get('task')}) on "
                f"`{task.get('train_file')}`; labels: {task.get('label_list')}.")
    return prefix + "Not recorded."


GENERATION_PROMPT = "the assert statement"
"""The text-generation card's prompt."""


def _usage(model_id: str, task: tuple[str, str, str], model_type: str, mask_token: str | None,
           max_new_tokens: int = 20) -> str:
    """The card's usage block: a pipeline (question answering: the model's start and end logits, as
    Transformers 5.10 removed that pipeline), then the tokenizer and the model, every ``from_pretrained`` with
    ``trust_remote_code=True`` (without it Transformers asks "Do you wish to run the custom code? [y/N]" and
    waits), so that it runs unattended (tests/test_model_cards.py runs it with stdin closed). Text generation
    asks for ``max_new_tokens`` tokens, which the caller fits into the model's positions."""
    pipeline_tag, auto_class, _ = task
    header = (f'# pip install torch "transformers>={MIN_TRANSFORMERS_VERSION}"  (nothing else: the model '
              'code is in the repo)\n')
    load = (f'tokenizer = AutoTokenizer.from_pretrained("{model_id}", trust_remote_code=True)\n'
            f'model = {auto_class}.from_pretrained("{model_id}", trust_remote_code=True)  # {model_type} '
            'code from the repo\n')
    if pipeline_tag == "question-answering":
        return (header + f"import torch\nfrom transformers import AutoTokenizer, {auto_class}\n\n" + load
                + 'question, context = "what is the assert statement used for?", "it is used for debugging."'
                  '\ninputs = tokenizer(question, context, return_tensors="pt")\n'
                  "with torch.no_grad():\n"
                  "    outputs = model(**inputs)\n"
                  "start, end = int(outputs.start_logits.argmax()), int(outputs.end_logits.argmax())\n"
                  'print(repr(tokenizer.decode(inputs["input_ids"][0, start : end + 1])))  # the answer '
                  'span\n'
                  'print(type(model).__name__, model.num_parameters())')
    examples = {"fill-mask": f'"the {mask_token or "[MASK]"} statement raises an exception."',
                "text-generation": f'"{GENERATION_PROMPT}", max_new_tokens={max_new_tokens}'}
    example = examples.get(pipeline_tag, '"the assert statement is used for debugging."')
    return (
        header + "from transformers import AutoTokenizer, " + auto_class + ", pipeline\n\n"
        f'pipe = pipeline("{pipeline_tag}", model="{model_id}", trust_remote_code=True)\n'
        f"print(pipe({example}))\n\n" + load
        + 'print(type(model).__name__, model.num_parameters())'
    )


def generation_budget(config: Any, tokenizer: Any | None) -> int:
    """New tokens the text-generation card asks for: 20, or fewer so that the prompt and they fit in
    ``max_position_embeddings`` (the Synthesizer's patterns and learned positions end there), at least 1."""
    prompt = len(tokenizer(GENERATION_PROMPT)["input_ids"]) if tokenizer is not None else 8
    limit = getattr(config, "max_position_embeddings", None)
    return 20 if not limit else max(1, min(20, limit - prompt))


def render_model_card(
    model: Any,
    source: str | Path,
    *,
    model_id: str,
    license: str = "apache-2.0",
    extra_tags: list[str] | None = None,
    template: str | None = None,
    mask_token: str | None = "[MASK]",
    tokenizer: Any | None = None,
) -> ModelCard:
    """The ``ModelCard`` of ``model`` (trained in ``source``) for the repository ``model_id``; ``tokenizer``
    (optional) sizes the text-generation example to the model's positions (``generation_budget``)."""
    config = model.config
    architecture = (config.architectures or [type(model).__name__])[0]
    suffix = next((s for s in TASKS if architecture.endswith(s) and s != "Model"), "Model")
    task = TASKS[suffix]
    results = collect_results(Path(source))
    task_tag = task[0]
    tags = ["custom_code", config.model_type, task_tag, "hf_attn_variants", *(extra_tags or [])]
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="transformers",
        pipeline_tag=task_tag,
        tags=list(dict.fromkeys(tags)),
        model_name=model_id.split("/")[-1],
        eval_results=_eval_results(model_id, task, results) or None,
    )
    num_parameters = sum(p.numel() for p in model.parameters())
    template_path, template_str = template_for(config.model_type, template)
    return ModelCard.from_template(
        card_data,
        template_path=template_path,
        template_str=template_str,
        model_id=model_id,
        model_type=config.model_type,
        architecture=architecture,
        auto_class=task[1],
        pipeline_tag=task_tag,
        architecture_table=_markdown_table(architecture_settings(config, num_parameters)),
        attention_table=_markdown_table(attention_settings(config)),
        config=config,
        training_data=_training_data(results),
        results_table=_results_table(results),
        usage=_usage(model_id, task, config.model_type, mask_token, generation_budget(config, tokenizer)),
        shared_file=f"{SHARED_FILE}.py",
        shared_sha256=shared_code_sha256(),
    )


__all__ = ["TASKS", "attention_settings", "checkpoint_results", "collect_results", "model_cards_dir",
           "render_model_card", "template_for"]
