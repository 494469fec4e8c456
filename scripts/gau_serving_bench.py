"""FLASH served natively by vLLM, against our ``generate`` and a stock Llama of about the same size in vLLM
(docs/serving.md, issue 37). Three steps, because vLLM has its own environment:

    .venv/bin/python scripts/gau_serving_bench.py save runs/gau_serving               # this environment
    $VLLM_PYTHON -m pip install --no-deps --target runs/gau_serving/package dist/hf_attn_variants-*.whl
    PYTHONPATH=runs/gau_serving/package $VLLM_PYTHON scripts/gau_serving_bench.py run runs/gau_serving
    .venv/bin/python scripts/gau_serving_bench.py publish runs/gau_serving   # the results file

``publish`` writes ``docs/results/gau-serving-cpu.json``. ``save`` writes two randomly initialised causal
models with the embedded 4,096-token tokenizer: FLASH (``GAUForCausalLM``, hidden 256, 4 layers, e = 512,
s = 128, chunk_size 256, relu²) and a stock ``LlamaForCausalLM`` (hidden 256, 4 layers, 4 heads of 64, FFN
224). ``run`` measures, each engine in its own process, float32, greedy, ``NEW_TOKENS`` new tokens per
prompt, end-of-sequence ignored, the best of ``REPEATS`` timed calls per setting (new prompts each time)
after one warm-up call:

- **throughput** at batch 1 and 16 and contexts 512 … 8,192 (random prompts of that many tokens): generated
  tokens per second of one ``generate`` call, prefill included, for FLASH through vLLM (native, with this
  package's plugin), FLASH through Transformers' ``generate`` (this package's class, its constant-size cache),
  and the Llama through vLLM (its own Llama);
- **memory per sequence**: for each context, an engine with ``max_model_len`` = context + ``NEW_TOKENS`` and a
  fixed KV-cache budget; vLLM prints how many requests of that length fit ("Maximum concurrency"), and the
  budget divided by it is what vLLM reserves per sequence. FLASH is measured with prefix caching on (vLLM's
  default; its "align" mode keeps states per block) and off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.script_paths import foreign_files, output_folder_problem  # noqa: E402

CONTEXTS = (512, 1024, 2048, 4096, 8192)
BATCHES = (1, 16)
NEW_TOKENS = 32
REPEATS = 2
MEMORY_BUDGET = 256 * 2**20
"""The KV-cache bytes of the memory engines."""
RESULTS_NAME = "gau-serving-cpu"
COMMAND = ("scripts/gau_serving_bench.py save runs/gau_serving; scripts/gau_serving_bench.py run "
           "runs/gau_serving; scripts/gau_serving_bench.py publish runs/gau_serving")
ENGINES = ("flash_vllm", "flash_generate", "llama_vllm")


def save(folder: Path) -> None:
    """Write the FLASH and Llama folders under ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_attn_variants import GAUConfig, GAUForCausalLM
    from hf_attn_variants.training.corpus import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    common = {"vocab_size": len(tokenizer), "hidden_size": 256, "num_hidden_layers": 4,
              "max_position_embeddings": max(CONTEXTS) + NEW_TOKENS, "pad_token_id": tokenizer.pad_token_id,
              "bos_token_id": None, "eos_token_id": None}
    torch.manual_seed(0)
    flash = GAUForCausalLM(GAUConfig(**common, is_decoder=True, expansion_factor=2, attention_key_size=128,
                                     chunk_size=256, attention_normalization="relu2", gau_init="flash",
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    llama = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4,
                                         intermediate_size=224, tie_word_embeddings=True)).eval()
    sizes = {}
    for name, model in (("flash", flash), ("llama", llama)):
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        sizes[name] = model.num_parameters()
    (folder / "parameters.json").write_text(json.dumps(sizes))
    print(f"saved {sizes} to {folder}")


def prompts(batch: int, context: int, vocab_size: int, repeat: int = 0) -> list[list[int]]:
    """Random prompts, new for every setting and repeat (a repeated prompt would be served from vLLM's prefix
    cache)."""
    import torch

    generator = torch.Generator().manual_seed((repeat * 100 + batch) * 100_000 + context)
    return torch.randint(5, vocab_size, (batch, context), generator=generator).tolist()


CONCURRENCY = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
                         r"request: ([\d.,]+)x")
"""The line vLLM prints when it allocates the cache."""
ENGINE_SCRIPT = """
import json, sys
from vllm import LLM
folder, length, budget, settings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
LLM(model=folder, trust_remote_code=True, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=budget,
    max_model_len=length, seed=0, **settings)
"""


def vllm_engine(folder: Path, max_model_len: int, budget: int, **settings):
    from vllm import LLM

    return LLM(model=str(folder), trust_remote_code=True, dtype="float32", enforce_eager=True,
               kv_cache_memory_bytes=budget, max_model_len=max_model_len, seed=0, **settings)


def measure_memory(folder: Path, label: str, **settings) -> list[dict]:
    """vLLM's reservation per sequence at each context: an engine each, in a process of its own, whose
    printed line gives the maximum concurrency for the budget."""
    rows = []
    for context in CONTEXTS:
        printed = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, str(folder), str(context + NEW_TOKENS),
                                  str(MEMORY_BUDGET), json.dumps(settings)],
                                 capture_output=True, text=True, check=True)
        match = CONCURRENCY.search(printed.stdout + printed.stderr)
        if match is None:
            raise SystemExit(f"vLLM printed no cache size for {folder} at {context}:\n"
                             f"{printed.stderr[-3000:]}")
        tokens, length, concurrency = (float(group.replace(",", "")) for group in match.groups())
        rows.append({"model": label, "context": context, "kv_cache_tokens": tokens, "request_tokens": length,
                     "concurrency": concurrency, "bytes_per_sequence": MEMORY_BUDGET / concurrency})
        print(rows[-1], flush=True)
    return rows


def generated_per_second(run, batch: int) -> tuple[float, float]:
    """The best wall time of ``run(repeat)`` over ``REPEATS`` repeats (the least disturbed by other work on
    the machine), and the generated tokens per second it gives."""
    times = []
    for repeat in range(REPEATS):
        start = time.perf_counter()
        run(repeat)
        times.append(time.perf_counter() - start)
    return min(times), batch * NEW_TOKENS / min(times)


def throughput_vllm(folder: Path, engine: str) -> list[dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    budget = (3 if engine == "llama_vllm" else 1) * 2**30
    llm = vllm_engine(folder, max(CONTEXTS) + NEW_TOKENS, budget)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rows = []
    llm.generate([TokensPrompt(prompt_token_ids=prompts(1, 64, vocab, repeat=-1)[0])], params,
                 use_tqdm=False)  # warm-up
    for context in CONTEXTS:
        for batch in BATCHES:
            def call(repeat: int, batch: int = batch, context: int = context) -> None:
                batch_prompts = prompts(batch, context, vocab, repeat)
                llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch_prompts], params,
                             use_tqdm=False)

            seconds, rate = generated_per_second(call, batch)
            rows.append({"engine": engine, "context": context, "batch": batch, "seconds": seconds,
                         "tokens_per_s": rate})
            print(rows[-1], flush=True)
    return rows


def throughput_generate(folder: Path) -> list[dict]:
    import torch

    from hf_attn_variants import GAUForCausalLM

    model = GAUForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    def generate(ids: torch.Tensor) -> None:
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, do_sample=False)

    rows = []
    generate(torch.tensor(prompts(1, 64, vocab, repeat=-1)))  # warm-up
    for context in CONTEXTS:
        for batch in BATCHES:
            def run(repeat: int, batch: int = batch, context: int = context) -> None:
                generate(torch.tensor(prompts(batch, context, vocab, repeat)))

            seconds, rate = generated_per_second(run, batch)
            rows.append({"engine": "flash_generate", "context": context, "batch": batch, "seconds": seconds,
                         "tokens_per_s": rate})
            print(rows[-1], flush=True)
    return rows


def measure(step: str, folder: Path, out: Path) -> None:
    """One engine's measurements (in its own process) into ``out``."""
    import torch

    if step == "flash_generate":
        rows: dict = {"throughput": throughput_generate(folder / "flash")}
    elif step == "flash_vllm":
        rows = {"throughput": throughput_vllm(folder / "flash", step)}
    elif step == "llama_vllm":
        rows = {"throughput": throughput_vllm(folder / "llama", step)}
    else:
        rows = {"memory": measure_memory(folder / "flash", "FLASH (prefix caching on)")
                + measure_memory(folder / "flash", "FLASH (prefix caching off)", enable_prefix_caching=False)
                + measure_memory(folder / "llama", "Llama")}
    rows["threads"] = torch.get_num_threads()
    out.write_text(json.dumps(rows))


def run(folder: Path) -> None:
    """Every engine in a process of its own; the raw rows go to ``folder/raw.json``."""
    import torch
    import transformers
    import vllm

    raw: dict = {"throughput": [], "memory": [], "load_average": [],
                 "versions": {"vllm": vllm.__version__, "transformers": transformers.__version__,
                              "torch": torch.__version__, "python": platform.python_version()}}
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    for step in (*ENGINES, "memory"):
        out = folder / f"{step}.json"
        subprocess.run([sys.executable, __file__, "measure", str(folder), "--step", step, "--out", str(out)],
                       check=True, env=env)
        part = json.loads(out.read_text())
        raw["throughput"] += part.get("throughput", [])
        raw["memory"] += part.get("memory", [])
        raw["threads"] = part["threads"]
        raw["load_average"].append(os.getloadavg()[0])
    (folder / "raw.json").write_text(json.dumps(raw, indent=1))


def publish(folder: Path, root: Path) -> Path:
    """``docs/results/gau-serving-cpu.json`` from ``folder/raw.json`` and the parameter counts."""
    from tools.docs_results import write_results
    from tools.docs_results._common import machine_description, run_metadata

    raw = json.loads((folder / "raw.json").read_text())
    loads = raw["load_average"]
    data = run_metadata("gau_serving", COMMAND,
                        machine=machine_description(f"load average {min(loads):.1f}–{max(loads):.1f}"))
    data["versions"] = raw["versions"]
    data["settings"] = {"new_tokens": NEW_TOKENS, "memory_budget_bytes": MEMORY_BUDGET, "repeats": REPEATS,
                        "torch_threads": raw["threads"],
                        "parameters": json.loads((folder / "parameters.json").read_text())}
    data["throughput"], data["memory"] = raw["throughput"], raw["memory"]
    return write_results(root, RESULTS_NAME, data)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` (status 2) naming the bad argument, before anything is built or written: ``save``
    into a folder that can be written and holds no one else's files, ``publish`` from a folder with the
    ``run`` step's ``raw.json`` and ``save``'s ``parameters.json``."""
    if args.action == "save":
        problem = output_folder_problem(args.folder)
        if problem:
            parser.error(f"folder: {problem}")
        others = foreign_files(args.folder, "parameters.json", "flash")
        if others:
            parser.error(f"folder: {str(args.folder)!r} holds other files ({', '.join(others[:5])}); name a "
                         "new folder or an earlier save's")
    if args.action == "publish":
        for name in ("raw.json", "parameters.json"):
            path = args.folder / name
            if not path.is_file():
                parser.error(f"folder: no {name} in {str(args.folder)!r}; run the 'save' and 'run' steps "
                             "first.")
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as error:
                parser.error(f"folder: {str(path)!r} is not JSON ({' '.join(str(error).split())[:200]})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("save", "run", "measure", "publish"))
    parser.add_argument("folder", type=Path, nargs="?", default=Path("runs/gau_serving"))
    parser.add_argument("--step", choices=(*ENGINES, "memory"), help="measure: which engine")
    parser.add_argument("--out", type=Path, help="measure: where its rows go")
    parser.add_argument("--root", type=Path, default=REPO, help="publish: the repository root")
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.action == "save":
        save(args.folder)
    elif args.action == "publish":
        try:
            path = publish(args.folder, args.root)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            parser.error(f"folder: {str(args.folder)!r}'s raw.json or parameters.json is not the run step's: "
                         f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")
        print(f"wrote {path}; now run `python tools/render_docs.py`")
    elif not (args.folder / "flash" / "config.json").is_file():
        parser.error(f"folder: no flash/config.json in {args.folder}; run the 'save' step first.")
    elif args.action == "run":
        run(args.folder)
    else:
        if args.step is None or args.out is None:
            parser.error("measure needs --step and --out.")
        measure(args.step, args.folder, args.out)


if __name__ == "__main__":
    main()
