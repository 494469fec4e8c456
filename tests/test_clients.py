"""The tools people evaluate and deploy with, on exported folders loaded as remote code (docs/clients.md).

One child process (tests/clients_child.py) in the cached client environment (``client_python()``:
sentence-transformers, lm-eval, onnx, onnxruntime, onnxscript at the pins of ``locks/clients.txt``; built
once, about 4 minutes, never holding this package) runs every check; each test below reads its part:

- sentence-transformers: ``export --sentence-transformers`` folders of every family's encoder (mean pooling)
  and causal LM (last-token pooling); ``encode`` of one batch of mixed lengths equals this package's pooled
  states, ``similarity`` is their cosine, and the unpadded path is declined (it needs FlashAttention).
- ONNX: ``hub/onnx_export.export_onnx`` on every family's base model and causal LM; onnxruntime equals PyTorch
  at several batch sizes and lengths, with right and left padding.
- lm-eval: ``simple_evaluate(model="hf", model_args="pretrained=DIR,trust_remote_code=True")`` on local json
  tasks: ``loglikelihood``, ``loglikelihood_rolling`` and ``generate_until`` equal direct computations with
  the model and greedy ``generate``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import AutoModel, AutoModelForCausalLM

import hf_attn_variants
from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUForQuestionAnswering,
    GAUModel,
    SynthesizerConfig,
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
)
from hf_attn_variants.hub import ExportArguments, export
from hf_attn_variants.hub.onnx_export import output_names
from hf_attn_variants.training.corpus import embedded_tokenizer
from tests.remote_code import client_python

CHILD = Path(__file__).with_name("clients_child.py")
ONNX_MODULE = Path(hf_attn_variants.__file__).with_name("hub") / "onnx_export.py"
FAMILIES = {
    "entropy_invariant": (EntropyInvariantConfig, EntropyInvariantForMaskedLM, EntropyInvariantForCausalLM,
                          {"num_attention_heads": 2, "intermediate_size": 64, "base_length": 16}),
    "gau": (GAUConfig, GAUForMaskedLM, GAUForCausalLM, {"attention_key_size": 16, "base_length": 16}),
    "synthesizer": (SynthesizerConfig, SynthesizerForMaskedLM, SynthesizerForCausalLM,
                    {"num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 96}),
}
TEXTS = [
    "Lists",
    "The for statement is used to iterate over the elements of a sequence.",
    ("A class definition defines a class object. The inheritance list usually gives a list of base classes, "
     "and each item in the list should evaluate to a class object which allows subclassing."),
    "Names refer to objects.",
]
ONNX_SHAPES = ((1, 5, None), (3, 23, "right"), (2, 40, "left"))
LL_DOCS = [{"context": "The for statement is used to", "continuation": "iterate over a sequence"},
           {"context": "A class definition", "continuation": "defines a class object"},
           {"context": "Names refer", "continuation": "to objects"}]
ROLLING_DOCS = [{"text": TEXTS[1]}, {"text": TEXTS[2]}, {"text": TEXTS[3]}]
GEN_DOCS = [{"context": "The for statement is used to", "answer": "x"},
            {"context": "Names refer to", "answer": "x"},
            {"context": "A class definition defines a class object and", "answer": "x"}]
MAX_GEN_TOKENS = 6
STS_PAIRS = [("A cat sits on the mat.", "A cat is sitting on a mat.", 5),
             ("The for statement iterates.", "A for loop iterates over items.", 4),
             ("Names refer to objects.", "Objects have names.", 3),
             ("Lists are mutable.", "Tuples are immutable.", 2),
             ("Exceptions stop execution.", "The function returns a value.", 1),
             ("A class defines objects.", "The weather is warm.", 0)]
TASKS = {
    "clients_loglikelihood": """task: clients_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder}/loglikelihood.jsonl
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
metric_list:
  - metric: perplexity
  - metric: acc
""",
    "clients_rolling": """task: clients_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder}/rolling.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
""",
    "clients_generate": """task: clients_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder}/generate.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["QQQ"]
  do_sample: false
  max_gen_toks: {max_gen_toks}
metric_list:
  - metric: exact_match
""",
}


def write_tasks(folder: Path) -> None:
    """The three lm-eval task files (``TASKS``) and their local json data in ``folder``."""
    folder.mkdir(parents=True)
    for task, text in TASKS.items():
        (folder / f"{task}.yaml").write_text(text.format(folder=folder, max_gen_toks=MAX_GEN_TOKENS))
    for file, docs in (("loglikelihood", LL_DOCS), ("rolling", ROLLING_DOCS), ("generate", GEN_DOCS)):
        (folder / f"{file}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))


def build_models(tokenizer) -> dict[str, torch.nn.Module]:
    """A tiny encoder (MLM) and causal LM per family, peaked logits (initializer_range 0.2) for stable
    greedy."""
    models = {}
    for family, (config_class, mlm_class, clm_class, extra) in FAMILIES.items():
        common = {"vocab_size": len(tokenizer), "hidden_size": 32, "num_hidden_layers": 2,
                  "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                  "pad_token_id": tokenizer.pad_token_id, **extra}
        torch.manual_seed(0)
        models[f"{family}-encoder"] = mlm_class(config_class(**common)).eval()
        torch.manual_seed(0)
        models[f"{family}-causal"] = clm_class(config_class(**common, is_decoder=True, initializer_range=0.2,
                                                            bos_token_id=None, eos_token_id=None)).eval()
    return models


def onnx_only_models(vocab_size: int) -> dict[str, tuple[torch.nn.Module, str]]:
    """Models only the ONNX part exports, with their Auto class: FLASH, whose chunked shapes depend on the
    length modulo ``chunk_size`` (a graph traced at 8 tokens ran at 8 or at multiples of 4 only), causal
    with chunk 4 and bidirectional with chunk 8, and a question-answering head (two outputs)."""
    common = {"vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2, "attention_key_size": 16,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "bos_token_id": None,
              "eos_token_id": None}
    flash = {**common, "attention_normalization": "relu2"}
    torch.manual_seed(0)
    return {
        "gau-flash-causal": (GAUForCausalLM(GAUConfig(**flash, chunk_size=4, is_decoder=True)).eval(),
                             "AutoModelForCausalLM"),
        "gau-flash-encoder": (GAUModel(GAUConfig(**flash, chunk_size=8)).eval(), "AutoModel"),
        "gau-question-answering": (GAUForQuestionAnswering(GAUConfig(**common)).eval(),
                                   "AutoModelForQuestionAnswering"),
    }


def add_onnx_case(manifest: dict, expected: dict, tmp: Path, name: str, folder: Path, auto_class: str,
                  reference: torch.nn.Module) -> None:
    """One ONNX case: its input files at ``ONNX_SHAPES`` and PyTorch's outputs (``output_names``) on them."""
    files = []
    for i, (batch, length, padding) in enumerate(ONNX_SHAPES):
        inputs = onnx_inputs(batch, length, padding, seed=i)
        torch.save(inputs, tmp / f"{name}.onnx{i}.pt")
        files.append(str(tmp / f"{name}.onnx{i}.pt"))
        with torch.no_grad():
            outputs = reference(**inputs)
        expected["onnx"][f"{name}/{i}"] = ([outputs[key] for key in output_names(reference)],
                                           inputs["attention_mask"])
    manifest["onnx"].append({"name": name, "folder": str(folder), "auto_class": auto_class,
                             "path": str(tmp / "onnx" / f"{name}.onnx"), "inputs": files})


def pooled(model, tokenizer, texts: list[str], pooling: str, max_length: int) -> torch.Tensor:
    """This package's embeddings: the base model's last hidden states pooled over the attention mask."""
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"]
    if pooling == "mean":
        return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    assert pooling == "lasttoken" and tokenizer.padding_side == "right"
    return hidden[torch.arange(len(texts)), mask.sum(1) - 1]


def onnx_inputs(batch: int, length: int, padding: str | None, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 500, (batch, length), generator=generator)
    mask = torch.ones_like(input_ids)
    if padding:
        for row in range(1, batch):  # row 0 stays full length
            cut = length // (row + 1)  # real tokens of this row
            if padding == "right":
                mask[row, cut:] = 0
            else:
                mask[row, : length - cut] = 0
    return {"input_ids": input_ids, "attention_mask": mask}


def loglikelihood(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """lm-eval's split (trailing context spaces move to the continuation, the pair is encoded whole), then the
    sum of the continuation's log-probabilities and whether each is the argmax."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    continuation_ids = whole[len(context_ids):]
    with torch.no_grad():
        logits = model(torch.tensor([whole[:-1]])).logits[0].log_softmax(-1)
    scores = logits[-len(continuation_ids):]
    target = torch.tensor(continuation_ids)
    return float(scores.gather(-1, target[:, None]).sum()), bool((scores.argmax(-1) == target).all())


def rolling(model, tokenizer, text: str) -> float:
    """Log-likelihood of the whole text after the BOS prefix token (one window: the texts are short)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    with torch.no_grad():
        logits = model(torch.tensor([[tokenizer.bos_token_id, *ids[:-1]]])).logits[0].log_softmax(-1)
    return float(logits.gather(-1, torch.tensor(ids)[:, None]).sum())


def greedy_text(model, tokenizer, context: str, until: list[str]) -> str:
    ids = torch.tensor([tokenizer.encode(context, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_GEN_TOKENS,
                             min_new_tokens=MAX_GEN_TOKENS, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    for stop in until:
        text = text.split(stop)[0]
    return text


@pytest.fixture(scope="module")
def clients(tmp_path_factory) -> dict:
    """Export every model, run the child once, and return ``{"expected", "got", "folders", "tmp"}``."""
    tmp = tmp_path_factory.mktemp("clients")
    python = client_python()
    tokenizer = embedded_tokenizer()
    manifest = {"sentence_transformers": [], "onnx": [], "onnx_module": str(ONNX_MODULE),
                "lm_eval": {"tasks": sorted(TASKS), "include_path": str(tmp / "tasks"), "models": []}}
    expected = {"sentence_transformers": {}, "onnx": {}, "lm_eval": {}}
    models_by_name = build_models(tokenizer)
    for name, model in models_by_name.items():
        source = tmp / "trained" / name
        model.save_pretrained(source)
        tokenizer.save_pretrained(source)
        folder = export(ExportArguments(model_name_or_path=str(source), output_dir=str(tmp / "export" / name),
                                        sentence_transformers=True))
        base = AutoModel.from_pretrained(folder).eval()
        pooling = "lasttoken" if model.config.is_decoder else "mean"
        expected["sentence_transformers"][name] = {
            "pooling": pooling,
            "embeddings": pooled(base, tokenizer, TEXTS, pooling, model.config.max_position_embeddings)}
        manifest["sentence_transformers"].append({"name": name, "folder": str(folder), "texts": TEXTS})
        reference = AutoModelForCausalLM.from_pretrained(folder).eval() if model.config.is_decoder else base
        auto_class = "AutoModelForCausalLM" if model.config.is_decoder else "AutoModel"
        add_onnx_case(manifest, expected, tmp, name, folder, auto_class, reference)
        if model.config.is_decoder:
            manifest["lm_eval"]["models"].append({"name": name, "folder": str(folder)})
            expected["lm_eval"][name] = reference
    for name, (model, auto_class) in onnx_only_models(len(tokenizer)).items():
        model.save_pretrained(tmp / "onnx-only" / name)
        add_onnx_case(manifest, expected, tmp, name, tmp / "onnx-only" / name, auto_class, model)
    write_tasks(tmp / "tasks")
    (tmp / "sts.jsonl").write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": score}) + "\n"
                                           for a, b, score in STS_PAIRS))
    manifest["mteb"] = {"folder": str(tmp / "export" / "entropy_invariant-encoder"),
                        "pairs": str(tmp / "sts.jsonl")}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    # make test sends this module to one xdist worker (ONE_WORKER_MODULES in tests/conftest.py); under another
    # --dist its tests may land on several: the first runs the child, the others read its results (the
    # models are built from fixed seeds, so every worker's expected values are the same).
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    with FileLock(shared / "clients-child.lock"):
        done = shared / "clients-child.json"
        if not done.exists():
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_MODULES_CACHE=str(tmp / "hf_modules"),
                       HF_DATASETS_CACHE=str(tmp / "datasets"), TRANSFORMERS_VERBOSITY="error",
                       TOKENIZERS_PARALLELISM="false")
            result = subprocess.run([str(python), str(CHILD), str(tmp / "manifest.json"),
                                     str(tmp / "results.json")],
                                    cwd=tmp, env=env, capture_output=True, text=True, timeout=1200,
                                    check=False)
            assert result.returncode == 0, (f"client child failed:\n{result.stdout[-3000:]}\n"
                                            f"{result.stderr[-6000:]}")
            done.write_text(json.dumps({"tmp": str(tmp)}))
        child_tmp = Path(json.loads(done.read_text())["tmp"])
    got = json.loads((child_tmp / "results.json").read_text())
    print("client child seconds:", got["seconds"])
    return {"expected": expected, "got": got, "tokenizer": tokenizer, "tmp": child_tmp,
            "models": models_by_name}


def test_sentence_transformers_encode_equals_pooled_states(clients: dict) -> None:
    """``SentenceTransformer(folder, trust_remote_code=True).encode`` of one batch of mixed lengths equals
    this package's pooled last hidden states (1e-5); ``similarity`` is their cosine; the unpadded path is
    declined (GAU/Synthesizer: ``is_backend_compatible()`` is False; entropy-invariant: no FlashAttention on
    CPU)."""
    gaps = {}
    for name, want in clients["expected"]["sentence_transformers"].items():
        got = clients["got"]["sentence_transformers"][name]
        gaps[name] = float((torch.tensor(got["embeddings"]) - want["embeddings"]).abs().max())
        assert got["pooling"] == want["pooling"], name
        embeddings = torch.tensor(got["embeddings"])
        torch.testing.assert_close(embeddings, want["embeddings"], atol=1e-5, rtol=1e-5, msg=name)
        unit = torch.nn.functional.normalize(want["embeddings"], dim=-1)
        torch.testing.assert_close(torch.tensor(got["similarity"]), unit @ unit.T, atol=1e-5, rtol=1e-5,
                                   msg=name)
        assert got["unpads"] is False, name
        assert got["is_backend_compatible"] is name.startswith("entropy_invariant"), name
    print("sentence-transformers max |encode - pooled|:", {k: f"{v:.1e}" for k, v in gaps.items()})


def test_onnx_runtime_equals_pytorch_with_dynamic_axes_and_padding(clients: dict) -> None:
    """One graph per model (exported at batch 2 × 8 tokens) runs at 1×5, 3×23 right-padded and 2×40
    left-padded; onnxruntime equals PyTorch on every real token within 1e-4."""
    gaps = {}
    for key, (wanted, mask) in clients["expected"]["onnx"].items():
        name, i = key.split("/")
        outputs = torch.load(clients["tmp"] / f"{name}.onnx{i}.pt.onnx.pt")
        assert len(outputs) == len(wanted), key
        for got, want in zip(outputs, wanted, strict=True):
            assert got.shape == want.shape, key
            gap = float((got - want)[mask.bool()].abs().max())
            gaps[name] = max(gaps.get(name, 0.0), gap)
            assert gap < 1e-4, f"{key}: onnxruntime differs from PyTorch by {gap:.2e}"
    print("onnxruntime max |ort - torch|:", {k: f"{v:.1e}" for k, v in gaps.items()})
    for name, info in clients["got"]["onnx"].items():
        assert all(isinstance(dim, str) for shape in info["input_shapes"].values()
                   for dim in shape), (name, info)


def test_lm_eval_requests_equal_direct_computation(clients: dict) -> None:
    """lm-eval's ``hf`` model on the exported causal LMs: every loglikelihood (and its is_greedy), rolling
    loglikelihood (1e-4) and generate_until text (greedy ``generate``) equals this package's model."""
    tokenizer = clients["tokenizer"]
    gaps = {}
    for name, model in clients["expected"]["lm_eval"].items():
        got = clients["got"]["lm_eval"][name]
        assert (len(got["clients_loglikelihood"]) == len(LL_DOCS)
                and len(got["clients_generate"]) == len(GEN_DOCS))
        for sample in got["clients_loglikelihood"]:
            context, continuation = sample["arguments"][0]
            value, greedy = loglikelihood(model, tokenizer, context, continuation)
            got_value, got_greedy = sample["resps"][0][0]  # [[ [loglikelihood, is_greedy] ]]
            assert math.isclose(got_value, value, abs_tol=1e-4), (name, context, got_value, value)
            assert bool(got_greedy) == greedy, (name, context)
            gaps[name] = max(gaps.get(name, 0.0), abs(got_value - value))
        for sample in got["clients_rolling"]:
            (text,) = sample["arguments"][0][:1]
            value = rolling(model, tokenizer, text)
            got_value = sample["resps"][0][0]  # [[loglikelihood]]
            assert math.isclose(got_value, value, abs_tol=1e-4), (name, text, got_value, value)
            gaps[name] = max(gaps.get(name, 0.0), abs(got_value - value))
        for sample in got["clients_generate"]:
            context, _ = sample["arguments"][0]
            want = greedy_text(model, tokenizer, context, ["QQQ"])
            assert sample["resps"][0][0] == want, (name, context, sample["resps"][0][0], want)
    print("lm-eval max |loglikelihood - direct|:", {k: f"{v:.1e}" for k, v in gaps.items()})


def test_export_flags_write_the_client_files(tmp_path: Path) -> None:
    """``hf-attn-variants export --sentence-transformers`` writes the module list and the family's pooling;
    ``--onnx`` writes ``onnx/model.onnx`` where onnx and onnxscript are installed, and otherwise stops before
    writing anything with one sentence naming the flag and the packages."""
    import importlib.util

    from hf_attn_variants.cli import main

    tokenizer = embedded_tokenizer()
    models = build_models(tokenizer)
    for name in ("gau-encoder", "synthesizer-causal"):
        models[name].save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        assert main(["export", "--model_name_or_path", str(tmp_path / name), "--output_dir",
                     str(tmp_path / "out" / name), "--sentence-transformers"]) == 0
        folder = tmp_path / "out" / name
        modules = json.loads((folder / "modules.json").read_text())
        assert [m["path"] for m in modules] == ["", "1_Pooling"]
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        assert pooling["pooling_mode"] == ("lasttoken" if name.endswith("causal") else "mean")
        assert pooling["embedding_dimension"] == 32
    has_onnx = all(importlib.util.find_spec(n) is not None for n in ("onnx", "onnxscript"))
    code = main(["export", "--model_name_or_path", str(tmp_path / "gau-encoder"), "--output_dir",
                 str(tmp_path / "onnx-out"), "--onnx"])
    if has_onnx:
        assert code == 0 and (tmp_path / "onnx-out" / "onnx" / "model.onnx").stat().st_size > 0
    else:
        assert code == 2 and not (tmp_path / "onnx-out").exists()


def test_mteb_sts_on_local_pairs_equals_cosine_of_pooled_states(clients: dict) -> None:
    """MTEB 2.x, offline: an STS task over local sentence pairs on the exported entropy-invariant encoder
    (through sentence-transformers). Its cosine Pearson equals the Pearson correlation of the gold scores with
    the cosine of this package's mean-pooled states (1e-5); the number itself is meaningless for an untrained
    model."""
    tokenizer = clients["tokenizer"]
    model = clients["models"]["entropy_invariant-encoder"].model
    first = pooled(model, tokenizer, [a for a, _, _ in STS_PAIRS], "mean", 512)
    second = pooled(model, tokenizer, [b for _, b, _ in STS_PAIRS], "mean", 512)
    cosine = torch.nn.functional.cosine_similarity(first, second).double()
    gold = torch.tensor([score for _, _, score in STS_PAIRS], dtype=torch.float64)
    pearson = float(torch.corrcoef(torch.stack([cosine, gold]))[0, 1])
    got = clients["got"]["mteb"]
    assert math.isclose(got["cosine_pearson"], pearson, abs_tol=1e-5), (got, pearson)
    print(f"MTEB local STS: cosine_pearson {got['cosine_pearson']:.4f} (direct {pearson:.4f}), "
          f"cosine_spearman {got['cosine_spearman']:.4f}")
