"""Run inside the cached client environment (tests/remote_code.py:client_python): sentence-transformers, ONNX
(torch.onnx dynamo export + onnxruntime) and lm-evaluation-harness on exported folders, as remote code.

    python clients_child.py manifest.json results.json

This package must not be importable here; the one file of it the ONNX part uses, ``hub/onnx_export.py``
(torch and the standard library only), is loaded by path from ``manifest["onnx_module"]``. The manifest has:

- ``sentence_transformers``: ``[{name, folder, texts}]`` → embeddings of ``encode(texts)`` (one batch of mixed
  lengths), ``similarity`` of the embeddings, the pooling mode read from the folder, and whether the module
  would unpad inputs (``_can_flatten_inputs``);
- ``onnx``: ``[{name, folder, auto_class, path, inputs}]`` → export, then onnxruntime's output for every input
  file (``input_ids``/``attention_mask`` saved with torch), written next to it as ``<inputs>.onnx.pt``;
- ``lm_eval``: ``{tasks, include_path, models: [{name, folder}]}`` → ``lm_eval.simple_evaluate``
  (``model="hf"``, ``pretrained=<folder>,trust_remote_code=True,add_bos_token=False``) with ``log_samples``:
  each sample's arguments and responses;
- ``mteb``: ``{folder, pairs}`` → ``mteb.evaluate`` of an STS task over the local pairs (jsonl), the folder
  loaded with sentence-transformers: MTEB's scores.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

if importlib.util.find_spec("hf_attn_variants") is not None:
    raise SystemExit("hf_attn_variants must not be importable in the client environment")


def sentence_transformers_part(cases: list[dict]) -> dict:
    from sentence_transformers import SentenceTransformer

    results = {}
    for case in cases:
        model = SentenceTransformer(case["folder"], trust_remote_code=True, device="cpu")
        assert not type(model[0].model).__module__.startswith("hf_attn_variants")
        embeddings = model.encode(case["texts"], convert_to_tensor=True, batch_size=len(case["texts"]))
        results[case["name"]] = {
            "embeddings": embeddings.tolist(),
            "similarity": model.similarity(embeddings, embeddings).tolist(),
            "pooling": model[1].pooling_mode,
            "max_seq_length": model.max_seq_length,
            "unpads": bool(model[0]._can_flatten_inputs()),
            "is_backend_compatible": bool(model[0].model.is_backend_compatible()),
        }
    return results


def onnx_part(cases: list[dict], module_path: str) -> dict:
    import onnxruntime
    import transformers

    spec = importlib.util.spec_from_file_location("onnx_export", module_path)
    onnx_export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(onnx_export)
    results = {}
    for case in cases:
        model = getattr(transformers, case["auto_class"]).from_pretrained(case["folder"],
                                                                          trust_remote_code=True).eval()
        start = time.perf_counter()
        path = onnx_export.export_onnx(model, case["path"])
        seconds = time.perf_counter() - start
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        dims = {i.name: i.shape for i in session.get_inputs()}
        for inputs_file in case["inputs"]:
            inputs = torch.load(inputs_file)
            feed = {name: inputs[name].numpy() for name in onnx_export.INPUT_NAMES}
            outputs = [torch.from_numpy(output) for output in session.run(None, feed)]
            torch.save(outputs, f"{inputs_file}.onnx.pt")
        results[case["name"]] = {"export_s": seconds, "input_shapes": dims}
    return results


def lm_eval_part(spec: dict) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = {}
    # only the local tasks: indexing lm-eval's thousands of built-in task files takes about 12 s each time
    task_manager = TaskManager(include_path=spec["include_path"], include_defaults=False)
    for model in spec["models"]:
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model['folder']},trust_remote_code=True,add_bos_token=False,dtype=float32",
            tasks=spec["tasks"], task_manager=task_manager, batch_size=4,
            device="cpu", log_samples=True, num_fewshot=0,
        )
        results[model["name"]] = {
            task: [{"arguments": [list(a) if isinstance(a, (list, tuple)) else a for a in s["arguments"]],
                    "resps": s["resps"], "doc": s["doc"]} for s in samples]
            for task, samples in out["samples"].items()
        }
        results[model["name"]]["_metrics"] = {k: {m: v for m, v in d.items() if isinstance(v, (int, float))}
                                             for k, d in out["results"].items()}
    return results


def mteb_part(spec: dict) -> dict:
    """An offline MTEB (2.x) STS evaluation: a task over local sentence pairs, the encoder through
    sentence-transformers; MTEB's scores of the one split."""
    from typing import Any

    import mteb
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
    from sentence_transformers import SentenceTransformer

    pairs = [json.loads(line) for line in Path(spec["pairs"]).read_text().splitlines()]

    class LocalSTS(AbsTaskSTS):
        metadata = TaskMetadata(
            type="STS", name="HfAttnVariantsLocalSTS", main_score="cosine_spearman",
            description="Local sentence pairs.", reference="https://github.com/embeddings-benchmark/mteb",
            dataset={"path": "NA", "revision": "NA"}, category="t2t", eval_splits=["test"],
            eval_langs=["eng-Latn"], date=("2026-01-01", "2026-01-01"), dialect=["Written"], domains=[],
            task_subtypes=[], license="cc-by-4.0", annotations_creators="derived", modalities=["text"],
            sample_creation="found", bibtex_citation="",
        )
        min_score = 0
        max_score = 5

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            columns = ("sentence1", "sentence2", "score")
            self.dataset = DatasetDict({"test": Dataset.from_dict({k: [p[k] for p in pairs]
                                                                   for k in columns})})
            self.data_loaded = True

    model = SentenceTransformer(spec["folder"], trust_remote_code=True, device="cpu")
    result = mteb.evaluate(model, LocalSTS(), cache=None, show_progress_bar=False)
    (scores,) = result.task_results[0].scores["test"]
    return {k: v for k, v in scores.items() if isinstance(v, float)}


def main(manifest_path: str, results_path: str) -> None:
    manifest = json.loads(Path(manifest_path).read_text())
    results, seconds = {}, {}
    for part, run in (("sentence_transformers",
                       lambda: sentence_transformers_part(manifest["sentence_transformers"])),
                      ("onnx", lambda: onnx_part(manifest["onnx"], manifest["onnx_module"])),
                      ("lm_eval", lambda: lm_eval_part(manifest["lm_eval"])),
                      ("mteb", lambda: mteb_part(manifest["mteb"]))):
        if manifest.get(part):
            start = time.perf_counter()
            results[part] = run()
            seconds[part] = time.perf_counter() - start
            print("done", part, round(seconds[part], 1), flush=True)
    results["seconds"] = seconds
    Path(results_path).write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:3])
