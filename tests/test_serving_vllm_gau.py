"""GAU served natively by vLLM (issue 37): this package's wheel in vLLM's environment registers
``GAUForCausalLM`` (``serving/vllm_plugin.py``), and vLLM runs ``serving/vllm_gau.GAUVllmForCausalLM``.

Each check saves tiny causal GAU folders (hidden 64, 2 layers, s = 32, e = 128, the embedded tokenizer) and
serves them with ``vllm.LLM`` in the cached vLLM environment of tests/test_serving_vllm.py (one child for the
checks of ``served``), one engine per model (float32, ``enforce_eager``, in-process engine). vLLM's greedy
tokens must equal Transformers' ``generate`` on every prompt, and the log-probabilities of the chosen tokens
agree within 1e-4 (one FLASH folder also in bf16, within bf16's rounding). Every call to ``generate`` in
vLLM holds 8 prompts of different lengths, so they run concurrently.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_attn_variants import GAUConfig, GAUForCausalLM, SynthesizerConfig, SynthesizerForCausalLM
from hf_attn_variants.training.corpus import embedded_tokenizer
from tests.test_serving_vllm import (
    NEW_TOKENS,
    child_env,
    completion_from_server,
    free_port,
    greedy,
    mismatches,
    run_vllm,
    save,
    vllm_python,
)

BFLOAT16_TIE = 0.2
"""Logits and log-probabilities agree within this in bf16: three units in the last place of a logit below 16
(0.0625 apart there). Measured: equal tokens, log-probabilities equal but one of 0.052 (2-core AMD EPYC)."""


def gau_config(tokenizer, **overrides) -> GAUConfig:
    """A tiny causal GAU whose greedy tokens vary (FLASH's initialisation at a wide range)."""
    values = {"vocab_size": len(tokenizer), "hidden_size": 64, "num_hidden_layers": 2,
              "attention_key_size": 32, "expansion_factor": 2, "is_decoder": True, "gau_init": "flash",
              "initializer_range": 0.5,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 256,
              "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None, "eos_token_id": None}
    values.update(overrides)
    return GAUConfig(**values)


def chunk_prompts(chunk_size: int, vocab_size: int) -> list[list[int]]:
    """8 prompts: g − 1, g, g + 1 and 3g + 5 tokens (the issue's cases), and 4 other lengths."""
    lengths = [chunk_size - 1, chunk_size, chunk_size + 1, 3 * chunk_size + 5, 1, 2, 2 * chunk_size + 3, 41]
    generator = torch.Generator().manual_seed(chunk_size)
    return [torch.randint(5, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def model_case(name: str, config: GAUConfig, tokenizer, folder: Path, prompt_list: list[list[int]],
               **extra) -> tuple[dict, dict]:
    """The manifest entry of a GAU folder to serve natively (no ``model_impl``), and Transformers' tokens."""
    torch.manual_seed(0)
    model = GAUForCausalLM(config).eval()
    entry = {"name": name, "folder": save(model, tokenizer, folder), "expect": "serve",
             "prompts": prompt_list, "engine": {"model_impl": None, **extra.pop("engine", {})}, **extra}
    return entry, greedy(model, prompt_list)


def bfloat16_greedy(model: GAUForCausalLM, prompt_list: list[list[int]]) -> dict[str, list]:
    """``greedy`` of a bf16 model, with each step's gap between its two largest logits."""
    tokens, logprobs, gaps = [], [], []
    with torch.no_grad():
        for prompt in prompt_list:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, len(prompt):]
            steps = torch.stack(out.scores, dim=1)[0].float()
            top = steps.topk(2, dim=-1).values
            tokens.append(new.tolist())
            logprobs.append(steps.log_softmax(-1).gather(-1, new[:, None])[:, 0].tolist())
            gaps.append((top[:, 0] - top[:, 1]).tolist())
    return {"tokens": tokens, "logprobs": logprobs, "gaps": gaps}


@pytest.fixture(scope="module")
def served(vllm: Path, package_overlay: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One vLLM child (with this package's wheel) for both checks below, which read their models from it:
    ``{"expected": Transformers' tokens per served model, "got": the child's results}``. The GAU folders to
    serve:

    - FLASH with chunk sizes 4 and 16 (prompts of g−1, g, g+1 and 3g+5 tokens among 8 concurrent ones), with a
      ``max_num_batched_tokens`` of 8 that splits prefills mid-chunk, with prefix caching hit by a second
      round of the same prompts, and one request at a time in room for about two state slots, so that a
      one-token prompt (which vLLM decodes at position 0) lands on a slot an earlier request filled;
    - softmax and softmax_plus GAU on paged attention;

    and the two it must refuse: quadratic relu² GAU and the Synthesizer."""
    tmp_path = tmp_path_factory.mktemp("vllm_gau")
    tokenizer = embedded_tokenizer()
    vocab = len(tokenizer)
    short = chunk_prompts(4, vocab)  # 1-token prompts at [4], 2 tokens at [5], 41 at [7]
    cases = [
        ("flash_g4", gau_config(tokenizer, chunk_size=4, attention_normalization="relu2"),
         chunk_prompts(4, vocab), {}),
        ("flash_g16", gau_config(tokenizer, chunk_size=16, attention_normalization="relu2"),
         chunk_prompts(16, vocab), {}),
        ("flash_g4_chunked_prefill", gau_config(tokenizer, chunk_size=4, attention_normalization="relu2"),
         chunk_prompts(4, vocab), {"engine": {"max_num_batched_tokens": 8, "max_num_seqs": 8,
                                              "enable_prefix_caching": False}}),
        ("flash_g4_fixed_length", gau_config(tokenizer, chunk_size=4, attention_normalization="relu2",
                                             relu2_length="fixed", base_length=8),
         chunk_prompts(4, vocab), {}),
        ("flash_g4_prefix_cache", gau_config(tokenizer, chunk_size=4, attention_normalization="relu2",
                                             max_position_embeddings=512),
         [chunk_prompts(16, vocab)[6] * 8 + tail for tail in chunk_prompts(4, vocab)],
         {"engine": {"enable_prefix_caching": True, "max_model_len": 512}, "rounds": 2}),
        ("flash_g4_reused_slot", gau_config(tokenizer, chunk_size=4, attention_normalization="relu2"),
         [short[4], short[7], short[4], short[5]],
         {"engine": {"max_num_seqs": 1, "enable_prefix_caching": False, "kv_cache_memory_bytes": 200_000}}),
        ("softmax", gau_config(tokenizer, attention_normalization="softmax"), chunk_prompts(16, vocab), {}),
        ("softmax_plus", gau_config(tokenizer, attention_normalization="softmax_plus", base_length=8),
         chunk_prompts(16, vocab), {}),
    ]
    models, expected = [], {}
    for name, config, prompt_list, extra in cases:
        entry, expected[name] = model_case(name, config, tokenizer, tmp_path / name, prompt_list, **extra)
        models.append(entry)
    flash = GAUForCausalLM(gau_config(tokenizer, chunk_size=16, attention_normalization="relu2")).eval()
    prompt_list = chunk_prompts(16, vocab)
    models.append({"name": "flash_g16_bfloat16", "folder": save(flash, tokenizer, tmp_path / "bfloat16"),
                   "expect": "serve", "prompts": prompt_list,
                   "engine": {"model_impl": None, "dtype": "bfloat16"}})
    bfloat16 = bfloat16_greedy(flash.to(torch.bfloat16), prompt_list)
    relu2 = GAUForCausalLM(gau_config(tokenizer, attention_normalization="relu2"))
    synthesizer = SynthesizerForCausalLM(SynthesizerConfig(vocab_size=len(tokenizer), hidden_size=64,
                                                           num_hidden_layers=1, num_attention_heads=2,
                                                           is_decoder=True, max_position_embeddings=256))
    models += [{"name": "relu2", "folder": save(relu2, tokenizer, tmp_path / "relu2"), "expect": "refuse",
                "engine": {"model_impl": None}},
               {"name": "synthesizer", "folder": save(synthesizer, tokenizer, tmp_path / "synthesizer"),
                "expect": "refuse"}]
    got = run_vllm(vllm, tmp_path, models, [], package_path=package_overlay)
    return {"expected": expected, "got": got, "bfloat16": bfloat16}


def test_vllm_serves_flash_and_softmax_gau_with_transformers_tokens(served: dict) -> None:
    """FLASH (chunk sizes, split prefills, prefix caching) and softmax / softmax_plus GAU (``served``): every
    greedy token equals ``generate``."""
    expected, got = served["expected"], served["got"]
    assert expected["softmax"]["tokens"] != expected["softmax_plus"]["tokens"], "log n must matter here"
    assert not mismatches(expected, got), "\n".join(mismatches(expected, got))
    cached = got["flash_g4_prefix_cache"]
    assert cached["later_rounds"] == [expected["flash_g4_prefix_cache"]["tokens"]]
    assert min(cached["cached_tokens"][1]) > 0, cached["cached_tokens"]  # the second round hit the cache


def test_vllm_serves_flash_in_bfloat16_as_transformers_does(served: dict) -> None:
    """bf16, vLLM's dtype on a GPU (the slots' keys and values in bf16, their sums in float32, each step's
    numerators in bf16): every prompt's tokens equal Transformers' bf16 ``generate`` up to a step whose two
    largest logits there tie within bf16's rounding, with the log-probabilities of the tokens before it."""
    want, got = served["bfloat16"], served["got"]["flash_g16_bfloat16"]
    compared = 0
    for prompt, (tokens, reference) in enumerate(zip(got["tokens"], want["tokens"], strict=True)):
        same = next((step for step, (a, b) in enumerate(zip(tokens, reference)) if a != b), len(reference))
        if same < len(reference):
            assert want["gaps"][prompt][same] < BFLOAT16_TIE, (prompt, same, tokens, reference)
        pairs = zip(got["logprobs"][prompt][:same], want["logprobs"][prompt][:same])
        gap = max((abs(a - b) for a, b in pairs), default=0.0)
        assert gap < BFLOAT16_TIE, (prompt, gap)
        compared += same
    assert compared > len(want["tokens"]) * NEW_TOKENS // 2, compared


def test_vllm_refuses_gau_it_cannot_serve_in_one_sentence(served: dict) -> None:
    """With the package installed: quadratic relu² GAU raises ``native_refusal``'s sentence (naming what
    serves), and the Synthesizer (not registered, so vLLM takes its Transformers backend) raises its remote
    code's refusal."""
    got = served["got"]
    relu2_error = got["relu2"]["error"]
    assert relu2_error is not None, "quadratic relu² GAU was served"
    assert "GAU with attention_normalization='relu2' and no chunk_size" in relu2_error, relu2_error
    assert "chunk_size (FLASH)" in relu2_error and "'softmax_plus'" in relu2_error, relu2_error
    assert got["synthesizer"]["error"] is not None
    assert "Synthesizer models cannot be served by vLLM" in got["synthesizer"]["error"]


def test_gau_config_declares_its_layer_types_for_vllm() -> None:
    """vLLM serves a class declared hybrid as a plain decoder when every ``layer_types`` entry is full
    attention: quadratic GAU declares that, FLASH has no such attribute (a model of state layers). It is
    derived, never written to config.json."""
    config = GAUConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, attention_key_size=16)
    assert config.layer_types == ["full_attention", "full_attention"]
    assert "layer_types" not in config.to_dict()
    config.chunk_size, config.attention_normalization = 4, "relu2"
    assert getattr(config, "layer_types", None) is None and not hasattr(config, "layer_types")


def test_vllm_openai_server_serves_a_flash_folder(vllm: Path, package_overlay: Path, tmp_path: Path) -> None:
    """vLLM's OpenAI-compatible server on a FLASH folder (no ``--model-impl``): one ``/v1/completions``
    request returns Transformers' greedy tokens."""
    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    model = GAUForCausalLM(gau_config(tokenizer, chunk_size=4, attention_normalization="relu2")).eval()
    folder = save(model, tokenizer, tmp_path / "flash")
    prompt = chunk_prompts(4, len(tokenizer))[3]
    want = greedy(model, [prompt])["tokens"][0]
    port = free_port()
    command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
               "--trust-remote-code", "--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
               "--kv-cache-memory-bytes", str(64 * 2**20), "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "model"]
    env = child_env(tmp_path)
    env["PYTHONPATH"] = str(package_overlay)
    reply, log = completion_from_server(command, env, tmp_path, prompt)
    assert "Resolved architecture: GAUForCausalLM" in log
    assert reply["choices"][0]["token_ids"] == want
