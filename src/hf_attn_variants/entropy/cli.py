"""``hf-attn-variants entropy``: attention entropy per layer and head against the number of keys a row sees.

Examples::

    hf-attn-variants entropy --models runs/hybrid/passkey/runs/ei_standard/seed_0/model --task passkey \\
        --train_length 32 --output runs/entropy/passkey.json
    hf-attn-variants entropy --models /path/to/all-MiniLM-L6-v2 --names MiniLM --train_length 128

Each model becomes one series, measured on the same inputs at every length (default L/4, L/2, L, 2L … 64L; a
model with learned absolute positions stops at its ``max_position_embeddings``). This package's families are
measured as saved, with eager attention; a stock model twice (``--stock_modes``): with its own eager attention
and with this package's stock log-n scaling (``attn_implementation="entropy_invariant_eager"``,
``base_length`` = L, ``--stock_scope``). Inputs: the task's sequences (``--task passkey|mqar``, as
``lengthgen`` generates them) or windows of text (``--task text``: ``--text_file`` or the embedded corpus,
tokenized by the model's tokenizer). The results file holds, per series, the entropy per length, layer and
head, the slope dH/d log n of every head and their mean, and the slope over the diffuse heads (H at L at least
half the uniform row's). The plot shows the mean entropy against n, one panel per position scheme and one line
per study series (``<series>@<seed>`` labels averaged over their seeds), with log n (the uniform row) for
scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

STOCK_MODES = {"eager": "eager", "log_n": "entropy_invariant_eager"}
"""``--stock_modes`` → the attention implementation a stock model is loaded with."""
RESULTS_KIND = "attention_entropy"
"""The ``"kind"`` of the results file, by which a rerun knows its own file (``is_entropy_results``)."""
QUADRATIC_SOFTMAX = ("softmax", "softmax_plus")


@dataclass
class EntropyArguments:
    """The flags of ``hf-attn-variants entropy``."""

    models: list[str] = field(metadata={"help": "Model folders (this package's families or stock "
                                                "Transformers models)."})
    names: list[str] | None = field(default=None, metadata={"help": "A label per model (default: the folder "
                                                                     "name); <series>@<seed> labels one seed "
                                                                     "of a study series."})
    output: str = field(default="runs/entropy/attention-entropy.json",
                        metadata={"help": "The results file (JSON); the plot goes beside it (.png)."})
    no_plot: bool = field(default=False, metadata={"help": "Write no plot."})
    task: Literal["text", "passkey", "mqar"] = field(
        default="text", metadata={"help": "Inputs: windows of text, or the retrieval task's sequences."})
    train_length: int | None = field(
        default=None, metadata={"help": "L (default: the first model's base_length, else its "
                                        "max_position_embeddings); stock log-n uses it as base_length."})
    lengths: list[int] | None = field(default=None,
                                      metadata={"help": "Input lengths (default L/4, L/2, L, 2L … 64L)."})
    samples: int = field(default=8, metadata={"help": "Sequences per length."})
    seed: int = field(default=0, metadata={"help": "Seed of the inputs."})
    text_file: str | None = field(default=None,
                                  metadata={"help": "--task text: a UTF-8 text file (default: the embedded "
                                                    "corpus's validation split)."})
    task_vocab_size: int = field(default=64, metadata={"help": "Tasks: vocabulary size (as lengthgen)."})
    passkey_digits: int = field(default=3, metadata={"help": "passkey: digits of the passkey."})
    num_kv_pairs: int = field(default=2, metadata={"help": "mqar: key-value pairs per example."})
    stock_modes: list[str] = field(default_factory=lambda: ["eager", "log_n"],
                                   metadata={"help": "Stock models: eager and/or log_n (this package's "
                                                     "training-free log-n scaling)."})
    stock_scope: Literal["beyond", "all"] = field(
        default="beyond", metadata={"help": "Stock log-n: scale rows beyond L only, or all rows."})
    memory_gib: float = field(default=2.0, metadata={"help": "Batches sized so that one layer's attention "
                                                             "maps (fp32) and their entropy fit this much."})

    def __post_init__(self) -> None:
        """Each value has its type (``check_field_types``); the rest is checked by ``check_arguments``."""
        from ..cli_utils import check_field_types

        check_field_types(self)


@dataclass(frozen=True)
class Series:
    """One measured series: a model folder loaded one way."""

    name: str
    path: str
    attn_implementation: str
    stock: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli_utils import add_dataclass_arguments

    add_dataclass_arguments(parser, EntropyArguments)


def is_entropy_results(path: Path) -> bool:
    """Whether ``path`` is a results file this command wrote (JSON with ``"kind": "attention_entropy"``)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("kind") == RESULTS_KIND
    except (OSError, ValueError, AttributeError):
        return False


def check_arguments(args: EntropyArguments) -> None:
    """Every flag checked before anything is loaded or written (``FlagError`` naming it)."""
    from ..cli_utils import (
        FlagError,
        check_int,
        check_model_folder,
        check_number,
        check_result_files,
        check_seed,
        check_text_file,
    )

    for path in args.models:
        check_model_folder("models", path, weights=True)
    if args.names is not None and len(args.names) != len(args.models):
        raise FlagError("names", f"names: {len(args.names)} names for {len(args.models)} models.")
    output = Path(args.output)
    files = {"results file": output} if args.no_plot else {"results file": output,
                                                           "plot": output.with_suffix(".png")}
    inputs = {"models": args.models, "text_file": [args.text_file] if args.text_file else []}
    check_result_files("output", files, ours=is_entropy_results, tool="hf-attn-variants entropy",
                       inputs=inputs)
    check_int("samples", args.samples, 1)
    check_seed("seed", args.seed)
    check_number("memory_gib", args.memory_gib, 0.0, open_low=True)
    if args.train_length is not None:
        check_int("train_length", args.train_length, 4)
    check_int("task_vocab_size", args.task_vocab_size, 2)
    check_int("passkey_digits", args.passkey_digits, 1)
    check_int("num_kv_pairs", args.num_kv_pairs, 1)
    for length in args.lengths or ():
        check_int("lengths", length, 2)
    for mode in args.stock_modes:
        if mode not in STOCK_MODES:
            raise FlagError("stock_modes", f"stock_modes: {mode!r} is not one of {sorted(STOCK_MODES)}.")
    if args.text_file is not None:
        if args.task != "text":
            raise FlagError("text_file", f"text_file: inputs are the {args.task} task's, not text.")
        check_text_file("text_file", args.text_file)


def mode_label(name: str, mode: str) -> str:
    """The series label of a stock model measured in ``mode``: ``name``, or ``name + log-n`` (before an
    ``@<seed>`` ending: ``llama + log-n@0``)."""
    if mode == "eager":
        return name
    base, at, seed = name.rpartition("@")
    return f"{base} + log-n@{seed}" if at else f"{name} + log-n"


def series_of(args: EntropyArguments, configs: dict[str, Any]) -> list[Series]:
    """The series to measure: one per model of this package, one per ``--stock_modes`` of a stock model."""
    from ..models import FAMILIES

    names = args.names or [Path(path).resolve().name for path in args.models]
    series = []
    for name, path in zip(names, args.models):
        if configs[path].model_type in FAMILIES:
            series.append(Series(name, path, "eager", stock=False))
            continue
        for mode in args.stock_modes:
            series.append(Series(mode_label(name, mode), path, STOCK_MODES[mode], stock=True))
    return series


def load(series: Series, args: EntropyArguments, train_length: int, config: Any) -> tuple[Any, Any]:
    """The base model of ``series`` in eval mode and its config, a copy of ``config`` (stock log-n:
    ``base_length`` = L and ``--stock_scope`` set on it)."""
    import copy

    from transformers import AutoModel

    config = copy.deepcopy(config)
    if series.attn_implementation == STOCK_MODES["log_n"]:
        config.base_length = train_length
        config.entropy_invariant_scope = args.stock_scope
    model = AutoModel.from_pretrained(series.path, config=config, trust_remote_code=False,
                                      attn_implementation=series.attn_implementation)
    return model.eval(), config


def default_train_length(config: Any) -> int | None:
    """L of a model as stock log-n takes it (``stock.resolve_base_length``): its ``base_length``, else RoPE's
    ``original_max_position_embeddings``, else ``max_position_embeddings``; ``None`` where the config has
    none of them (T5, MPT), rather than log-n's fallback of 512."""
    from ..stock.stock_attention import original_context, resolve_base_length

    if not (getattr(config, "base_length", None) or original_context(getattr(config, "rope_parameters", None))
            or getattr(config, "max_position_embeddings", None)):
        return None
    return resolve_base_length(config)


def default_lengths(train_length: int) -> list[int]:
    """L/4, L/2, L, 2L … 64L."""
    return sorted({max(2, train_length // 4), max(2, train_length // 2),
                   *(train_length * 2**k for k in range(7))})


def input_lengths(args: EntropyArguments, train_length: int) -> list[int]:
    """``--lengths``, or the default lengths that hold one example of the task; ``FlagError`` for a given
    length that holds none."""
    from ..cli_utils import FlagError
    from ..lengthgen.tasks import min_length

    shortest = 2 if args.task == "text" else min_length(args.task, digits=args.passkey_digits,
                                                         num_kv_pairs=args.num_kv_pairs)
    if args.lengths is None:
        return [length for length in default_lengths(train_length) if length >= shortest]
    if min(args.lengths) < shortest:
        raise FlagError("lengths", f"lengths: {min(args.lengths)} is shorter than one {args.task} example "
                        f"({shortest} tokens).")
    return sorted(set(args.lengths))


ABSOLUTE_POSITION_TABLES = ("position_embeddings", "wpe", "embed_positions")
"""What Transformers' models (BERT and its kin, GPT-2, OPT/BART) and this package's ``absolute`` call a
learned table of absolute positions; a relative one (DeBERTa-v2's ``rel_embeddings``, as many rows) caps
nothing."""


def length_cap(config: Any, model: Any) -> int | None:
    """The longest input a model can take: ``max_position_embeddings`` (``n_positions``) where ``model`` (its
    skeleton will do) holds a learned position table, an embedding of that many rows (BERT, GPT-2, our
    ``absolute``; OPT's has 2 more) besides the token embedding, or the Synthesizer's per-position weights;
    else ``None``."""
    import torch

    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    if config.model_type == "synthesizer":
        return limit
    try:
        tokens = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        tokens = None
    tables = [module for name, module in model.named_modules() if isinstance(module, torch.nn.Embedding)
              and module is not tokens and name.rsplit(".", 1)[-1] in ABSOLUTE_POSITION_TABLES
              and limit <= module.num_embeddings <= limit + 2]
    return limit if tables else None


POSITION_WORDS = {"rope": "RoPE", "none": "no position embedding", "absolute": "learned positions"}


def describe_attention(config: Any, series: Series) -> str:
    """The attention a series measures, in a few words: ``"entropy_invariant scale, RoPE 1 1 1 0, scaled on
    NoPE layers only"``, ``"GAU softmax_plus, RoPE"``, ``"llama, eager + stock log-n"``."""
    if series.stock:
        mode = " + stock log-n" if series.attn_implementation == STOCK_MODES["log_n"] else ""
        return f"{config.model_type}, eager{mode}"
    position = getattr(config, "position_embedding_type", None)
    words = [f"GAU {config.attention_normalization}" if config.model_type == "gau"
             else f"{getattr(config, 'attention_scale', config.model_type)} scale",
             POSITION_WORDS.get(position, str(position))]
    if getattr(config, "no_rope_layers", None) is not None:
        words[-1] = "RoPE " + " ".join(map(str, config.no_rope_layers))
    if getattr(config, "attention_scale_layers", "all") == "no_rope":
        words.append("scaled on NoPE layers only")
    return ", ".join(words)


def normalizes_rows(config: Any) -> bool:
    """GAU's relu² and Laplace rows are not probabilities: they are normalised before H."""
    return config.model_type == "gau" and config.attention_normalization not in QUADRATIC_SOFTMAX


def text_stream(args: EntropyArguments, path: str, vocab_size: int) -> tuple[list[int], int | None]:
    """The token ids of the text (``--text_file`` or the embedded corpus) by the model's tokenizer (the
    embedded one where the folder has none), and the id to put first (CLS or BOS), if any."""
    from transformers import AutoTokenizer

    from ..cli_utils import FlagError

    if any((Path(path) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    else:
        from ..training.corpus import embedded_tokenizer

        tokenizer = embedded_tokenizer()
    if args.text_file is not None:
        text = Path(args.text_file).read_text(encoding="utf-8")
    else:
        from ..training.corpus import corpus_splits

        text = "\n\n".join(corpus_splits()["validation"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise FlagError("text_file", "text_file: the text has no tokens.")
    if max(ids) >= vocab_size:
        raise FlagError("models", f"models: the tokenizer of {path} gives ids up to {max(ids)}, beyond the "
                        f"model's vocab_size={vocab_size}.")
    return ids, tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id


def text_batches(stream: list[int], first: int | None, length: int, count: int, seed: int) -> Any:
    """``count`` windows of ``length`` tokens at seeded offsets of ``stream`` (repeated when shorter), the
    first token replaced by ``first`` when given."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + length)
    tokens = torch.tensor(stream * math.ceil((length + 1) / len(stream) + 1))
    starts = torch.randint(0, len(tokens) - length, (count,), generator=generator)
    windows = torch.stack([tokens[start:start + length] for start in starts.tolist()])
    if first is not None:
        windows[:, 0] = first
    return windows


def input_source(args: EntropyArguments, path: str, config: Any) -> Callable[[int], Any]:
    """length → ``(samples, length)`` input ids for the model in ``path`` (task sequences, or text windows:
    the text is tokenized here, once per model)."""
    if args.task == "text":
        stream, first = text_stream(args, path, config.vocab_size)
        return lambda length: text_batches(stream, first, length, args.samples, args.seed)
    from ..lengthgen.tasks import make_batch

    spec = task_spec(args)
    return lambda length: make_batch(spec, length, args.seed, 0, args.samples)["input_ids"]


def task_spec(args: EntropyArguments) -> Any:
    """The ``TaskSpec`` of ``--task passkey|mqar`` (``FlagError`` naming ``task_vocab_size`` if too small)."""
    from ..cli_utils import FlagError
    from ..lengthgen.tasks import TaskSpec

    spec = TaskSpec(args.task, args.task_vocab_size, args.passkey_digits, args.num_kv_pairs)
    try:
        spec.vocab
    except ValueError as error:
        raise FlagError("task_vocab_size", str(error)) from error
    return spec


def check_models(args: EntropyArguments) -> dict[str, Any]:
    """Each model's config (path → config): it reads and has attention rows to measure (``FlagError``
    naming ``models``: FLASH GAU has none) and takes the task's token ids (naming ``task_vocab_size``)."""
    from transformers import AutoConfig

    from ..cli_utils import FlagError, error_reason

    if args.task != "text":
        task_spec(args)
    configs = {}
    for path in args.models:
        try:
            configs[path] = AutoConfig.from_pretrained(path, trust_remote_code=False)
        except (OSError, ValueError, KeyError) as error:
            raise FlagError("models", f"models: the config of {path} cannot be read "
                            f"({error_reason(error)}).") from error
        if configs[path].model_type == "gau" and getattr(configs[path], "chunk_size", None) is not None:
            raise FlagError("models", f"models: {path} is FLASH GAU (chunk_size={configs[path].chunk_size}), "
                            "whose effective weights take both signs (q′·k′ across chunks): its rows are not "
                            "distributions and have no entropy. Measure a quadratic GAU (chunk_size None).")
        check_config(path, configs[path])
        vocab_size = configs[path].vocab_size
        if args.task != "text" and args.task_vocab_size > vocab_size:
            raise FlagError("task_vocab_size", f"task_vocab_size={args.task_vocab_size} exceeds the "
                            f"vocab_size={vocab_size} of {path}.")
    first = args.models[0]
    if args.train_length is None and default_train_length(configs[first]) is None:
        raise FlagError("train_length", f"train_length: the config of {first} ({configs[first].model_type}) "
                        "gives no length (base_length, max_position_embeddings) to take L from; give "
                        "--train_length.")
    return configs


def check_config(path: str, config: Any) -> None:
    """``FlagError`` naming ``models`` for a config this command cannot measure: an encoder-decoder (T5,
    BART), whose decoder attends to a second sequence as well and is not run by ``input_ids`` alone."""
    from ..cli_utils import FlagError

    if getattr(config, "is_encoder_decoder", False):
        raise FlagError("models", f"models: {path} is an encoder-decoder model ({config.model_type}): this "
                        "command measures the self-attention of one stack run on input_ids alone; measure a "
                        "decoder-only or encoder-only model.")


def model_skeleton(path: str, config: Any) -> Any:
    """``AutoModel`` of ``config`` on the meta device (no weights, no memory): what its modules are."""
    import torch
    from transformers import AutoModel

    from ..cli_utils import FlagError, error_reason

    try:
        with torch.device("meta"):
            return AutoModel.from_config(config, trust_remote_code=False, attn_implementation="eager")
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        raise FlagError("models", f"models: {path} cannot be built from its config "
                        f"({error_reason(error)}).") from error


def check_structure(args: EntropyArguments, path: str, config: Any, model: Any) -> None:
    """``FlagError`` before anything is measured for a model (``model``: its skeleton) whose rows are not
    distributions over the keys (attention sinks take part of the mass: GPT-OSS; naming ``models``), or, for
    a stock model's ``log_n`` mode, one whose attention log-n does not reach: computed by the model itself,
    not through ``ALL_ATTENTION_FUNCTIONS`` (XGLM, Bloom: the series would be eager's), or soft-capped
    (Gemma 2; naming ``stock_modes``)."""
    from ..cli_utils import FlagError
    from ..models import FAMILIES
    from ..stock.stock_attention import dispatches_attention

    sinks = [name for name, _ in model.named_parameters() if name.rsplit(".", 1)[-1] in ("sinks", "s_aux")]
    if sinks:
        raise FlagError("models", f"models: {path} ({config.model_type}) has attention sinks ({sinks[0]}), "
                        "which take part of each row's weight: its rows over the keys are not distributions "
                        "and their entropy is not comparable with log n.")
    if config.model_type in FAMILIES or "log_n" not in args.stock_modes:
        return
    if not dispatches_attention(model):
        raise FlagError("stock_modes", f"stock_modes: log_n cannot apply to {path} ({config.model_type}), "
                        "which computes its attention itself, not through Transformers' "
                        "ALL_ATTENTION_FUNCTIONS: its + log-n series would be eager's; give --stock_modes "
                        "eager for it.")
    if getattr(config, "attn_logit_softcapping", None):
        raise FlagError("stock_modes", f"stock_modes: log_n cannot apply to {path} ({config.model_type}), "
                        "whose attention logits are soft-capped (attn_logit_softcapping), which stock log-n "
                        "does not compute; give --stock_modes eager for it.")


def plan_lengths(args: EntropyArguments, configs: dict[str, Any],
                 lengths: Sequence[int]) -> dict[str, list[int]]:
    """Path → the lengths its model is measured at: ``lengths`` up to its ``length_cap``, each checked
    (``check_structure``) before anything is measured. ``FlagError`` naming ``lengths`` when none fits a
    model, or when one sequence of a length needs more than ``--memory_gib`` for a layer's maps (batches are
    cut down to one sequence, never below)."""
    from ..cli_utils import FlagError
    from ..lengthgen.retrieval import attention_heads
    from .measure import layer_memory_bytes

    plans = {}
    for path, config in configs.items():
        skeleton = model_skeleton(path, config)
        check_structure(args, path, config, skeleton)
        cap = length_cap(config, skeleton)
        plans[path] = [length for length in lengths if cap is None or length <= cap]
        if not plans[path]:
            raise FlagError("lengths", f"lengths: no length fits {path}, whose learned positions stop at "
                            f"{cap} tokens (lengths {', '.join(map(str, lengths))}); give --lengths up to "
                            f"{cap}.")
        for length in plans[path]:
            need = layer_memory_bytes(length, attention_heads(config)) / 2**30
            if need > args.memory_gib:
                raise FlagError("lengths", f"lengths: one sequence of {length} tokens needs {need:.3g} GiB "
                                f"for a layer's attention maps of {path}, over --memory_gib "
                                f"{args.memory_gib:g}; give shorter --lengths or a larger --memory_gib.")
    return plans


def batched(source: Callable[[int], Any], per_sample_bytes: Callable[[int], float],
            memory_gib: float) -> Callable[[int], list[Any]]:
    """``source``'s sequences at a length cut into batches whose attention maps fit ``memory_gib``."""
    def batches(length: int) -> list[Any]:
        ids = source(length)
        size = max(1, int(memory_gib * 2**30 // per_sample_bytes(length)))
        return list(ids.split(size))

    return batches


def finite(value: float) -> float | None:
    """``value``, or ``None`` for NaN (no slope: one length, or a layer whose nᵢ did not change): the results
    file is strict JSON, which has no NaN."""
    return None if math.isnan(value) else value


def mean_of(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not ``None``; ``None`` when none is."""
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def measure(series: Series, args: EntropyArguments, train_length: int, lengths: Sequence[int],
            usable: Sequence[int], config: Any, source: Callable[[int], Any]) -> dict[str, Any]:
    """The results entry of one series (its model's ``config`` and input ``source``) at the ``usable`` of
    ``lengths`` (``plan_lengths``); causal or not as its maps say (``attends_causally``)."""
    from tqdm.auto import tqdm

    from ..lengthgen.retrieval import attention_heads
    from .measure import attends_causally, diffuse_heads, entropy_by_length, fit_slope, head_slopes
    from .measure import layer_memory_bytes

    model, config = load(series, args, train_length, config)
    heads = attention_heads(config)
    batches = batched(source, lambda length: layer_memory_bytes(length, heads), args.memory_gib)
    causal = attends_causally(model, batches(usable[0])[0])
    with tqdm(total=len(usable), desc=series.name, unit="length") as bar:
        points = entropy_by_length(model, batches, usable, causal=causal, normalize=normalizes_rows(config),
                                   progress=lambda _: bar.update())
    slopes = [[finite(value) for value in layer] for layer in head_slopes(points)]
    diffuse = diffuse_heads(points, train_length)
    return {
        "name": series.name, "model": str(series.path), "model_type": config.model_type,
        "attention": describe_attention(config, series), "position": position_of(config),
        "attn_implementation": series.attn_implementation, "stock": series.stock, "causal": causal,
        "normalized": normalizes_rows(config),
        "skipped_lengths": [length for length in lengths if length not in usable],
        "lengths": [point.length for point in points], "log_keys": [point.log_keys for point in points],
        "layer_log_keys": [point.layer_log_keys for point in points],
        "mean_entropy": [point.mean_entropy for point in points],
        "entropy": [point.entropy for point in points],
        "head_slopes": slopes, "slope": mean_of([value for layer in slopes for value in layer]),
        "slope_of_mean": finite(fit_slope([p.log_keys for p in points], [p.mean_entropy for p in points])),
        "diffuse_heads": [list(pair) for pair in diffuse],
        "diffuse_slope": mean_of([slopes[layer][head] for layer, head in diffuse]),
    }


def environment() -> dict[str, Any]:
    import torch
    import transformers

    from ..models.version import __version__
    from ..records import cpu_model

    return {"date": datetime.date.today().isoformat(), "cpu": cpu_model(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__, "hf_attn_variants": __version__}}


def position_of(config: Any) -> str:
    """The position scheme of a model in words (a panel of the plot)."""
    if getattr(config, "no_rope_layers", None) is not None:
        return "RoPE with NoPE layers"
    position = getattr(config, "position_embedding_type", None) or "rope"
    return POSITION_WORDS.get(position, str(position))


def study_groups(results: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Position → study series (a label up to its ``@<seed>``) → its entries, in order of appearance."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for entry in results["series"]:
        name = entry["name"].rpartition("@")[0] or entry["name"]
        groups.setdefault(entry["position"], {}).setdefault(name, []).append(entry)
    return groups


def plot(results: dict[str, Any], path: Path) -> Path:
    """Mean entropy against n (log axis), one panel per position scheme, one line per study series (the mean
    over its seeds, a band from the lowest to the highest seed), labelled with its mean slope; log n for
    scale."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from ..cli_utils import save_figure

    groups = study_groups(results)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.0 * len(groups), 4.6), squeeze=False, sharey=True)
    for ax, (position, series) in zip(axes[0], groups.items()):
        keys = sorted({math.exp(x) for entries in series.values() for e in entries for x in e["log_keys"]})
        ax.plot(keys, [math.log(n) for n in keys], color="0.6", linestyle="--", label="log n (uniform row)")
        for name, entries in series.items():
            x = [math.exp(v) for v in entries[0]["log_keys"]]
            curves = [e["mean_entropy"] for e in entries]
            mean = [sum(values) / len(values) for values in zip(*curves)]
            slope = mean_of([e["slope"] for e in entries])
            shown = "–" if slope is None else f"{slope:.2f}"
            line = ax.plot(x, mean, marker="o", markersize=3, label=f"{name} (dH/dlog n = {shown})")[0]
            if len(entries) > 1:
                ax.fill_between(x, [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)],
                                color=line.get_color(), alpha=0.15)
        ax.axvline(results["train_length"], color="0.8", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_title(position)
        ax.set_xlabel(f"keys each row sees, n (dotted: L = {results['train_length']})")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("attention entropy H (nats), mean over heads")
    fig.tight_layout()
    return save_figure(fig, path)


def measure_all(args: EntropyArguments) -> dict[str, Any]:
    """Check the flags and every model, measure every series, write the results file (and the plot); returns
    the results.

    Ctrl-C (``KeyboardInterrupt``) after the first series writes the series finished before it, the file
    marked ``"interrupted"``, and then goes on as a ``KeyboardInterrupt``; Ctrl-C while the results are being
    written leaves every series in the file, marked ``"interrupted"``, and no plot (not the last run's)."""
    check_arguments(args)
    configs = check_models(args)
    train_length = args.train_length or default_train_length(configs[args.models[0]])
    lengths = input_lengths(args, train_length)
    plans = plan_lengths(args, configs, lengths)
    sources = {path: input_source(args, path, config) for path, config in configs.items()}
    results = {"kind": RESULTS_KIND, **environment(), "task": args.task, "train_length": train_length,
               "settings": dataclasses.asdict(args), "series": []}
    todo = series_of(args, configs)
    try:
        for one in todo:
            results["series"].append(measure(one, args, train_length, lengths, plans[one.path],
                                             configs[one.path], sources[one.path]))
        write_results(args, results)
    except KeyboardInterrupt:
        done = len(results["series"])
        if done == len(todo):
            results["interrupted"] = ("stopped by Ctrl-C while writing the results: every series is kept, "
                                      "the plot was not written")
            write_results(args, results, plot_too=False)
        elif done:
            results["interrupted"] = (f"stopped by Ctrl-C while measuring {todo[done].name!r}: the {done} of "
                                      f"{len(todo)} series before it are kept")
            write_results(args, results)
        raise
    return results


def write_results(args: EntropyArguments, results: dict[str, Any], plot_too: bool = True) -> None:
    """The results file at ``--output`` and, unless ``--no_plot`` (or not ``plot_too``), its plot beside it
    (``.png``). The last run's plot goes first, so a plot beside the file is always this file's."""
    from ..cli_utils import atomic_write_text
    from ..records import format_results

    output = Path(args.output)
    if not args.no_plot:
        output.with_suffix(".png").unlink(missing_ok=True)  # ours: check_result_files allowed it
    atomic_write_text(output, format_results(results, inline_depth=3))
    if plot_too and not args.no_plot:
        plot(results, output.with_suffix(".png"))


def report(args: EntropyArguments, results: dict[str, Any]) -> str:
    lines = [f"{'series':40s} {'slope':>6s} {'diffuse':>8s}  H at each n"]
    for entry in results["series"]:
        diffuse, slope = entry["diffuse_slope"], entry["slope"]
        values = " ".join(f"{n}:{h:.2f}" for n, h in zip(entry["lengths"], entry["mean_entropy"]))
        shown, diffuse_shown = ("-" if value is None or math.isnan(value) else format(value, ".2f")
                                for value in (slope, diffuse))
        lines.append(f"{entry['name'][:40]:40s} {shown:>6s} {diffuse_shown:>8s}  {values}")
    if any(entry["slope"] is None for entry in results["series"]):
        lines.append("slope -: dH/dlog n needs two values of n: two --lengths or more, and rows that see "
                     "more keys than a sliding window")
    plot_path = "" if args.no_plot else f" and {Path(args.output).with_suffix('.png')}"
    lines.append(f"wrote {args.output}{plot_path}")
    return "\n".join(lines)


def run(namespace: argparse.Namespace) -> int:
    from ..cli_utils import run_dataclass_command

    return run_dataclass_command("entropy", namespace, EntropyArguments, measure_all, report)


__all__ = ["EntropyArguments", "Series", "add_arguments", "default_lengths", "measure_all", "run"]
