"""Serving numbers for docs/serving.md: vLLM (Transformers backend) vs Transformers ``generate``, on CPU.

Two steps, because vLLM needs its own environment (it pins Transformers < 5.20; see docs/serving.md):

    .venv/bin/python scripts/serving_bench.py save runs/serving/model       # this package's environment
    export VLLM_ENABLE_V1_MULTIPROCESSING=0                                  # then in the vLLM environment:
    $VLLM_PYTHON scripts/serving_bench.py vllm runs/serving/model            # vLLM's numbers
    $VLLM_PYTHON scripts/serving_bench.py transformers runs/serving/model    # generate's, in another process
    .venv/bin/python scripts/serving_bench.py publish                        # docs/results/serving-cpu.json
    .venv/bin/python tools/render_docs.py                                    # docs/serving.md's table

``save`` writes a randomly initialised ``EntropyInvariantForCausalLM`` (Llama-shaped: hidden 512, 8 layers,
8 heads of 64, FFN 2048, RMSNorm, RoPE, ``attention_scale="entropy_invariant"``; the embedded 4,096-token
tokenizer) with its standalone code. The other two steps load it as remote code, float32, and add their
rows to ``--json``: the time ``vllm.LLM(...)`` takes to start, then for batch 1 and 16 prompts of 64 tokens
and 128 new tokens each (greedy, end-of-sequence ignored) the median wall time of ``--repeats`` runs after one
warm-up, as generated tokens per second. Transformers runs in its own process (vLLM patches the remote-code
classes it loads) with the torch thread count vLLM's worker used. ``publish`` (in this package's environment:
the vLLM one does not have it) turns ``--json`` into the results file ``docs/results/serving-cpu.json`` (kind
``serving``) that docs/serving.md renders.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from scripts.script_paths import foreign_files, output_folder_problem  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS = 64, 128
RESULTS_NAME = "serving-cpu"
COMMAND = ("scripts/serving_bench.py save runs/serving/model; scripts/serving_bench.py vllm "
           "runs/serving/model; scripts/serving_bench.py transformers runs/serving/model; "
           "scripts/serving_bench.py publish")
"""The four steps that produce ``docs/results/serving-cpu.json`` (the middle two in vLLM's environment)."""


def save(folder: Path) -> None:
    """Write the benchmark model and tokenizer to ``folder``."""
    import torch

    from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForCausalLM
    from hf_attn_variants.training.corpus import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    config = EntropyInvariantConfig(
        vocab_size=len(tokenizer), hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
        intermediate_size=2048, is_decoder=True, norm_type="rmsnorm", max_position_embeddings=2048,
        base_length=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    model = EntropyInvariantForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    readable(folder)
    print(f"saved {model.num_parameters() / 1e6:.1f}M parameters to {folder}")


def readable(folder: Path) -> None:
    """Give the files of ``folder`` the modes a new file gets (the umask's), not the 0600 of the temporary
    file some writers rename into place (``model.safetensors``)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def batch_prompts(batch: int, vocab_size: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(batch)
    return torch.randint(5, vocab_size, (batch, PROMPT_TOKENS), generator=generator).tolist()


def timed(function, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def record(json_path: Path, engine: str, rows: list[dict], **fields) -> None:
    """Replace ``engine``'s rows (and set ``fields``) in the results file ``json_path``."""
    import torch

    results = json.loads(json_path.read_text()) if json_path.exists() else {"rows": []}
    results["rows"] = [row for row in results["rows"] if row["engine"] != engine] + rows
    results.setdefault("environment", {})[engine] = {
        "torch": torch.__version__, "python": platform.python_version(), "cores": os.cpu_count(),
        "load_average": os.getloadavg(), "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS,
        "repeats": fields.pop("repeats", None),
    }
    results.update(fields)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2))


def measure_vllm(folder: Path, json_path: Path, repeats: int, batches: list[int]) -> None:
    """vLLM's engine start and generation speed on ``folder``."""
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=str(folder), trust_remote_code=True, model_impl="transformers", dtype="float32",
              enforce_eager=True, kv_cache_memory_bytes=1 << 30, max_model_len=1024, seed=0)
    engine_start = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    rows = []
    for batch in batches:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in batch_prompts(batch, vocab_size)]
        seconds = timed(lambda prompts=prompts: llm.generate(prompts, params, use_tqdm=False), repeats)
        rows.append({"engine": "vllm", "batch": batch, "seconds": seconds,
                     "tokens_per_s": batch * NEW_TOKENS / seconds})
        print(rows[-1], flush=True)
    record(json_path, "vllm", rows, engine_start_s=engine_start, torch_threads=torch.get_num_threads(),
           vllm=vllm.__version__, repeats=repeats)


def measure_transformers(folder: Path, json_path: Path, repeats: int, batches: list[int]) -> None:
    """Transformers ``generate`` speed on ``folder`` (remote code), with vLLM's torch thread count."""
    import torch
    import transformers

    results = json.loads(json_path.read_text()) if json_path.exists() else {}
    torch.set_num_threads(int(results.get("torch_threads", torch.get_num_threads())))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                              dtype=torch.float32).eval()
    rows = []
    for batch in batches:
        ids = torch.tensor(batch_prompts(batch,
                                         json.loads((folder / "config.json").read_text())["vocab_size"]))

        def generate(ids=ids) -> None:
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS, do_sample=False)

        seconds = timed(generate, repeats)
        rows.append({"engine": "transformers", "batch": batch, "seconds": seconds,
                     "tokens_per_s": batch * NEW_TOKENS / seconds})
        print(rows[-1], flush=True)
    record(json_path, "transformers", rows, transformers=transformers.__version__, repeats=repeats)


def publish(json_path: Path, root: Path, name: str = RESULTS_NAME) -> Path:
    """Write the results file ``docs/results/<name>.json`` from the raw ``json_path`` of the two measuring
    steps (kept from the earlier file: ``vllm_environment``, which the test suite measures, not this
    script)."""
    from tools.docs_results import load_results, results_path, write_results
    from tools.docs_results._common import machine_description, run_metadata

    raw = json.loads(json_path.read_text())
    environment = raw.get("environment", {})
    missing = {"vllm", "transformers"} - set(environment)
    if missing:
        raise SystemExit(f"publish: {json_path} has no {' and no '.join(sorted(missing))} rows; run those "
                         "steps first.")
    loads = "; ".join(f"load average {' / '.join(f'{x:.1f}' for x in environment[e]['load_average'])} after "
                      f"the {e} step" for e in ("vllm", "transformers"))
    data = run_metadata("serving", COMMAND, machine=machine_description(loads))
    data["versions"] = {"python": environment["vllm"]["python"], "torch": environment["vllm"]["torch"],
                        "vllm": raw.get("vllm", "?"), "transformers": raw.get("transformers", "?")}
    data["settings"] = {"prompt_tokens": environment["vllm"]["prompt_tokens"],
                        "new_tokens": environment["vllm"]["new_tokens"],
                        "repeats": environment["vllm"].get("repeats"),
                        "torch_threads": raw.get("torch_threads")}
    data["engine_start_s"] = raw["engine_start_s"]
    data["rows"] = [{k: row[k] for k in ("engine", "batch", "seconds", "tokens_per_s")}
                    for row in raw["rows"]]
    if results_path(root, name).is_file():
        earlier = load_results(root, name)
        if "vllm_environment" in earlier:
            data["vllm_environment"] = earlier["vllm_environment"]
    return write_results(root, name, data)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` (status 2) naming the first bad argument, before anything is built or written."""
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}.")
    if min(args.batches) < 1:
        parser.error(f"--batches must be >= 1, got {min(args.batches)}.")
    if args.step == "save":
        problem = output_folder_problem(args.folder)
        if problem:
            parser.error(f"folder: {problem}")
        others = foreign_files(args.folder, "config.json")
        if others:
            parser.error(f"folder: {str(args.folder)!r} holds other files ({', '.join(others[:5])}); name a "
                         "new folder or an earlier save's")
    if args.step == "publish":
        if not args.json.is_file():
            parser.error(f"--json {args.json}: no such file; run the vllm and transformers steps first.")
        try:
            raw = json.loads(args.json.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            parser.error(f"--json {args.json}: not JSON ({' '.join(str(error).split())[:200]})")
        if not isinstance(raw, dict) or not isinstance(raw.get("rows"), list):
            parser.error(f"--json {args.json}: not the measuring steps' file (no list of rows)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("save", "vllm", "transformers", "publish"))
    parser.add_argument("folder", type=Path, nargs="?", default=Path("runs/serving/model"))
    parser.add_argument("--json", type=Path, default=Path("runs/serving/cpu.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="repository root for publish (default: this script's repository)")
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.step == "save":
        save(args.folder)
    elif args.step == "publish":
        try:
            path = publish(args.json, args.root)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            parser.error(f"--json {args.json}: not the measuring steps' file: {type(error).__name__}: "
                         f"{' '.join(str(error).split())[:200]}")
        print(f"wrote {path}; now run `python tools/render_docs.py`")
    elif not (args.folder / "config.json").is_file():
        parser.error(f"folder: no config.json in {args.folder}; run the 'save' step first.")
    elif args.step == "vllm":
        measure_vllm(args.folder, args.json, args.repeats, args.batches)
    else:
        measure_transformers(args.folder, args.json, args.repeats, args.batches)


if __name__ == "__main__":
    sys.exit(main())
