"""Run inside the cached vLLM environment: serve saved folders with vLLM and write what it generated.

    python vllm_child.py manifest.json results.json

The models always load as remote code. This package is importable only where the manifest says
``with_package`` (the test of its vLLM plugin puts it on ``PYTHONPATH``); otherwise the script refuses to run.
The manifest lists ``models`` (``name``, ``folder``, ``expect``: ``"serve"`` or ``"refuse"``; optionally
their own ``prompts``, ``engine`` settings over the defaults below and ``rounds``), ``prompts`` (token ids)
and ``max_tokens``. For a model to serve, the greedy tokens of every prompt (and their
log-probabilities) are written; for one to refuse, the error message. Each model gets its own ``LLM``,
deleted before the next. Settings: float32, eager, 256 MiB of KV cache, in-process engine. With ``lm_eval``
(``folder``, ``tasks``, ``include_path``), lm-evaluation-harness's ``vllm`` model runs those tasks with the
same settings (lm-eval is installed in the vLLM environment; the record of a package named "vllm" that its
backend asks for comes from an overlay on ``PYTHONPATH``, see ``lm_eval_overlay`` in test_serving_vllm.py).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
import time
from pathlib import Path

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

ENGINE_ARGS = {
    "trust_remote_code": True,
    "model_impl": "transformers",
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 2**20,
    "max_model_len": 256,
    "seed": 0,
}


def engine_args(engine: dict | None) -> dict:
    """``ENGINE_ARGS`` with a model's ``engine`` entries over them (``None`` removes a setting)."""
    merged = {**ENGINE_ARGS, **(engine or {})}
    return {key: value for key, value in merged.items() if value is not None}


def serve(folder: str, prompts: list[list[int]], max_tokens: int, engine: dict | None = None,
          rounds: int = 1) -> dict:
    """Greedy tokens and their log-probabilities for each prompt (all prompts in one ``generate`` call, so
    they run concurrently), with the engine's start time. ``rounds`` > 1 generates again on the same engine
    (prefix caching then reuses the first round's prompts); every round must give the same tokens."""
    start = time.perf_counter()
    llm = LLM(model=folder, **engine_args(engine))
    started = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    results = []
    for _ in range(rounds):
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        results.append(([list(o.outputs[0].token_ids) for o in outputs], [
            [step[token].logprob for step, token in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
            for o in outputs
        ], [o.num_cached_tokens or 0 for o in outputs]))
    del llm
    gc.collect()
    tokens, logprobs, _ = results[0]
    return {"tokens": tokens, "logprobs": logprobs, "engine_start_s": started,
            "later_rounds": [round_tokens for round_tokens, _, _ in results[1:]],
            "cached_tokens": [cached for _, _, cached in results]}


def refuse(folder: str, engine: dict | None = None) -> dict:
    """The error vLLM raises for a model it must not serve (``None`` if it served it)."""
    try:
        llm = LLM(model=folder, **engine_args(engine))
    except Exception as error:  # noqa: BLE001 (the message is the result)
        return {"error": f"{type(error).__name__}: {error}"}
    del llm
    gc.collect()
    return {"error": None}


def lm_eval_vllm(spec: dict) -> dict:
    """``lm_eval.simple_evaluate(model="vllm", ...)`` on local tasks (``spec``: ``folder``, ``tasks``,
    ``include_path``): each sample's arguments and responses."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    args = ",".join([f"pretrained={spec['folder']}", "trust_remote_code=True", "add_bos_token=False",
                     "dtype=float32", "model_impl=transformers", "enforce_eager=True", "max_model_len=256",
                     f"kv_cache_memory_bytes={ENGINE_ARGS['kv_cache_memory_bytes']}", "seed=0"])
    out = lm_eval.simple_evaluate(model="vllm", model_args=args, tasks=spec["tasks"], batch_size=4,
                                  log_samples=True,
                                  # only the local tasks (lm-eval's built-in ones take about 12 s to index)
                                  task_manager=TaskManager(include_path=spec["include_path"],
                                                           include_defaults=False))
    return {task: [{"arguments": [list(a) if isinstance(a, (list, tuple)) else a for a in s["arguments"]],
                    "resps": s["resps"]} for s in samples] for task, samples in out["samples"].items()}


def main(manifest_path: str, results_path: str) -> None:
    manifest = json.loads(Path(manifest_path).read_text())
    if importlib.util.find_spec("hf_attn_variants") is not None and not manifest.get("with_package"):
        raise SystemExit("hf_attn_variants must not be importable in the vLLM environment")
    results = {}
    for model in manifest["models"]:
        if model["expect"] == "serve":
            results[model["name"]] = serve(model["folder"], model.get("prompts", manifest["prompts"]),
                                           manifest["max_tokens"], model.get("engine"),
                                           model.get("rounds", 1))
        else:
            results[model["name"]] = refuse(model["folder"], model.get("engine"))
        print("done", model["name"], flush=True)
    if manifest.get("lm_eval"):
        results["lm_eval"] = lm_eval_vllm(manifest["lm_eval"])
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
