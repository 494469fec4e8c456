"""Transformers' native parallelism with two CPU processes (gloo): tensor, FSDP2 and pipeline parallel.

One ``torchrun --nproc_per_node 2`` (tests/parallel_child.py) loads every saved model below with
``DistributedConfig(tp_size=2)`` / ``tp_plan="auto"`` / ``DistributedConfig(fsdp_size=2)`` / ``pp_size=2`` and
records the placements of its parameters, logits, full gradients, greedy tokens, and the weights and logits
after one SGD step; each test checks that every parameter is the DTensor its plan declares
(``planned_placements``: a plan that did nothing would still give the same logits) and compares one case with
the same model in this process. The models cover every tensor-parallel style the families use:
per-head ``ssmax_scale``, the Synthesizer's dense/factorized branches and random matrices (trainable and fixed
buffers) with replicated mixing logits, GAU's gathered ``in_proj`` with replicated q/k scale-offset (quadratic
and FLASH), a post-norm GAU-α-style encoder, and pruned models whose heads do or do not divide by 2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.distributed import DistributedConfig

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
    SynthesizerConfig,
    SynthesizerForCausalLM,
)
from hf_attn_variants.pruning import prune_heads
from tests.utils import needs_fsdp2_torch

from .test_pretrain import free_port

CHILD = Path(__file__).with_name("parallel_child.py")
TOLERANCE = 1e-5
MODE_SIZES = {"tp": {"tp_size": 2}, "tp_auto": {"tp_size": 2}, "fsdp": {"fsdp_size": 2},
              "hsdp": {"dp_replicate_size": 2}, "tp_fsdp": {"tp_size": 2, "fsdp_size": 2}}
COMMON = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2, "hidden_dropout_prob": 0.0,
          "attention_probs_dropout_prob": 0.0, "tie_word_embeddings": False}
HEADS = {"num_attention_heads": 4, "intermediate_size": 64}


def build_models() -> dict[str, tuple[torch.nn.Module, bool]]:
    """name → (model, causal): untied LM heads unless the name says ``tied``."""
    torch.manual_seed(0)
    ei = EntropyInvariantConfig(**COMMON, **HEADS, attention_scale="ssmax", base_length=8)
    synth = {**COMMON, **HEADS, "max_position_embeddings": 32, "factorized_random_rank": 4}
    models = {
        "ei": EntropyInvariantForCausalLM(ei),
        "ei_tied": EntropyInvariantForCausalLM(EntropyInvariantConfig(
            **{**COMMON, "tie_word_embeddings": True}, **HEADS, no_rope_layers=[0, 1],
            attention_scale_layers="no_rope")),
        "ei_pruned_even": prune_heads(EntropyInvariantForCausalLM(ei), {0: [1, 3]}),
        "ei_pruned_odd": prune_heads(EntropyInvariantForCausalLM(ei), {1: [0]}),
        "synth_all": SynthesizerForCausalLM(SynthesizerConfig(**synth, synthesizer_components=[
            "dense", "random", "factorized_dense", "factorized_random", "vanilla"])),
        "synth_fixed": SynthesizerForCausalLM(SynthesizerConfig(
            **synth, random_trainable=False,
            synthesizer_components=["random", "factorized_random", "vanilla"])),
        "gau": GAUForCausalLM(GAUConfig(**COMMON, expansion_factor=2, attention_key_size=8)),
        "gau_flash": GAUForCausalLM(GAUConfig(**COMMON, expansion_factor=2, attention_key_size=8,
                                              chunk_size=4, attention_normalization="relu2")),
        "gau_alpha_mlm": GAUForMaskedLM(GAUConfig(**COMMON, expansion_factor=2, attention_key_size=8,
                                                  norm_position="post",
                                                  attention_normalization="softmax_plus")),
    }
    return {name: (model, name != "gau_alpha_mlm") for name, model in models.items()}


CASES = [
    *((name, "tp") for name in ("ei", "ei_tied", "ei_pruned_even", "ei_pruned_odd", "synth_all",
                                 "synth_fixed", "gau", "gau_flash", "gau_alpha_mlm")),
    ("ei", "tp_auto"),
    *((name, "fsdp") for name in ("ei", "ei_tied", "synth_all", "synth_fixed", "gau", "gau_alpha_mlm")),
    ("gau", "hsdp"),
    *((name, "pp") for name in ("ei", "synth_all", "gau")),  # Transformers' pipeline runs causal LMs only
]
FOUR_PROCESS_CASES = [(name, "tp_fsdp") for name in ("ei", "ei_tied", "synth_all", "gau")]


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (4, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding in one row
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100),
            "step_ids": torch.randint(3, 97, (4, 10), generator=generator)}


def run_children(root: Path, names: list[tuple[str, str]], causal: dict[str, bool], processes: int) -> None:
    """One torchrun of tests/parallel_child.py over the cases ``names``; results land in ``root / "out"``."""
    cases = [{"name": f"{name}-{mode}", "path": str(root / name), "mode": mode, "causal": causal[name],
              "generate": causal[name], "package": mode == "tp_auto", "checkpointing": mode == "tp_fsdp",
              "batch": str(root / "batch.pt")}
             for name, mode in names]
    spec = root / f"spec-{processes}.json"
    spec.write_text(json.dumps({"cases": cases}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_port", str(free_port()), str(CHILD), str(spec), str(root / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    # Own process group: on a timeout (a collective that never completes) torchrun's workers die with it.
    process = subprocess.Popen(command, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"torchrun over {processes} processes timed out after 600 s:\n{stderr[-4000:]}")
    assert process.returncode == 0, stderr[-4000:]


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory) -> dict[str, Any]:
    """Save the models and run both torchruns once per session. make test sends this module to one xdist
    worker (``ONE_WORKER_MODULES`` in tests/conftest.py); under another ``--dist`` the first worker does it
    under a file lock in the session's shared temporary folder, the others reuse the results. That folder is
    the parent of an xdist worker's own (``popen-gw<n>``), but without workers it is the session's own: its
    parent holds every session of this user, whose results (of another checkout, or of older code) must not
    be reused."""
    basetemp = tmp_path_factory.getbasetemp()
    root = (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "parallel"
    root.mkdir(exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if not (root / "done").exists():
            torch.save(batch(), root / "batch.pt")
            models = build_models()
            for name, (model, _) in models.items():
                model.save_pretrained(root / name)
            (root / "out").mkdir(exist_ok=True)
            causal = {name: is_causal for name, (_, is_causal) in models.items()}
            run_children(root, CASES, causal, processes=2)
            run_children(root, FOUR_PROCESS_CASES, causal, processes=4)
            (root / "causal.json").write_text(json.dumps(causal))
            (root / "done").touch()
    causal = json.loads((root / "causal.json").read_text())
    # the package's classes; the children ran the remote code
    models = {name: (AutoModelForCausalLM if is_causal else AutoModelForMaskedLM).from_pretrained(root / name)
              .eval() for name, is_causal in causal.items()}
    return {"root": root, "out": root / "out", "models": models}


TENSOR_PARALLEL_PLACEMENTS = tuple((re.compile(pattern), placement) for pattern, placement in (
    # Transformers' own rules: the embedding's vocabulary rows ("embedding_rowwise", added by Transformers),
    # the LM head's ("colwise_gather_output")
    (r"model\.embed_tokens\.weight|lm_head\.weight", "Shard(dim=0)"),
    # "colwise" (GAU's in_proj: "colwise_gather_partial"): the output features, weight and bias
    (r".+\.(self_attn\.[qkv]_proj|mlp\.up_proj|gau\.in_proj)\.(weight|bias)", "Shard(dim=0)"),
    # "rowwise": the input features; the bias is added once, after the all-reduce
    (r".+\.(self_attn\.o_proj|mlp\.down_proj|gau\.out_proj)\.weight", "Shard(dim=1)"),
    (r".+\.(self_attn\.o_proj|mlp\.down_proj|gau\.out_proj)\.bias", "Replicate()"),
    # "local_shard": per-head tensors, head first — SSMax's scale, the Synthesizer's R, R₁/R₂, dense W₁, b₁,
    # W₂, b₂
    (r".+\.self_attn\.(ssmax_scale|random_(matrix|left|right)|(dense|factor_a|factor_b)\.[wb][12])",
     "Shard(dim=0)"),
))
"""Parameter name → its placement on the ``tp`` mesh dimension, as the families' tensor-parallel plans declare
it (``base_model_tp_plan``, the heads' ``_tp_plan``, hf_attn_variants.models.tensor_parallel). Every other
parameter stays a plain tensor under tensor parallelism: norms, and the replicated tensors whose gradients
"local_shard" sums (the Synthesizer's mixing logits, GAU's q/k scale and offset)."""


def planned_placements(name: str, *, tp_size: int = 1, fsdp_size: int = 1,
                       dp_replicate_size: int = 1) -> dict[str, str] | None:
    """``{mesh dimension: repr(placement)}`` that the plans make of parameter ``name`` on a (dp_replicate,
    fsdp, tp) layout; ``None`` for a plain tensor. FSDP2 shards every parameter's dim 0 over ``fsdp`` (its
    mesh dimension exists, of size 1, under HSDP alone) and replicates it over ``dp_replicate``; over a
    tensor-parallel ``Shard(dim=0)`` its shard is strided (``_StridedShard``, split factor tp_size)."""
    tp = None if tp_size == 1 else next(
        (placement for pattern, placement in TENSOR_PARALLEL_PLACEMENTS if pattern.fullmatch(name)), None)
    planned = {}
    if dp_replicate_size > 1:
        planned["dp_replicate"] = "Replicate()"
    if fsdp_size > 1 or dp_replicate_size > 1:
        planned["fsdp"] = f"_StridedShard(dim=0, sf={tp_size})" if tp == "Shard(dim=0)" else "Shard(dim=0)"
    if tp is not None:
        planned["tp"] = tp
    return planned or None


def assert_sharded_as_planned(recorded: dict[str, dict[str, str] | None], names: Iterable[str],
                              **sizes: int) -> None:
    """Every parameter of the sharded model (``recorded``: tests/parallel_child.py ``placements``) is the
    DTensor ``planned_placements`` says — or plain where it says so — and they are the parameters ``names`` of
    the model."""
    names = sorted(names)
    assert sorted(recorded) == names, f"sharded {sorted(recorded)} != one-process {names}"
    wrong = {name: {"got": recorded[name], "planned": planned_placements(name, **sizes)} for name in names
             if recorded[name] != planned_placements(name, **sizes)}
    assert not wrong, f"{len(wrong)} parameters are not sharded as planned: {wrong}"


def recorded(parallel_run: dict[str, Any], name: str, mode: str) -> dict[str, Any]:
    result = torch.load(parallel_run["out"] / f"{name}-{mode}.pt")
    assert "error" not in result, result.get("traceback", result.get("error"))
    return result


def one_process(
    parallel_run: dict[str, Any], name: str
) -> tuple[dict[str, torch.Tensor], torch.nn.Module, dict]:
    """The batch, the model ``name`` in this process, and its forward inputs (ids and padding mask)."""
    data = torch.load(parallel_run["root"] / "batch.pt")
    return data, parallel_run["models"][name], {"input_ids": data["input_ids"],
                                                "attention_mask": data["attention_mask"]}


def saved_weights(parallel_run: dict[str, Any], name: str, mode: str) -> dict[str, torch.Tensor]:
    """The weights of the folder the sharded model's ``save_pretrained`` wrote, loaded as from the Hub."""
    folder = parallel_run["out"] / f"{name}-{mode}-saved"
    model = parallel_run["models"][name]
    with safe_open(folder / "model.safetensors", framework="pt") as saved:  # a tied head is written once
        assert set(saved.keys()) == set(model.state_dict()) - set(model.all_tied_weights_keys)
    auto = AutoModelForCausalLM if model.config.is_decoder else AutoModelForMaskedLM
    return dict(auto.from_pretrained(folder, trust_remote_code=True).named_parameters())


def max_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max((got[name] - want[name]).abs().max().item() for name in want)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), [case for case in CASES if case[1] in ("tp", "tp_auto")
                                            and case[0] != "ei_pruned_odd"])
def test_tensor_parallel_logits_gradients_and_generate_equal_one_process(
    parallel_run, name: str, mode: str
) -> None:
    result = recorded(parallel_run, name, mode)
    data, model, inputs = one_process(parallel_run, name)
    assert_sharded_as_planned(result["placements"], dict(model.named_parameters()), **MODE_SIZES[mode])
    model.zero_grad()
    loss = model(**inputs, labels=data["labels"]).loss
    loss.backward()
    torch.testing.assert_close(result["logits"], model(**inputs).logits.detach(), atol=TOLERANCE, rtol=0)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert max_difference(result["grads"], grads) <= TOLERANCE
    if "generated" in result:
        prompt = data["input_ids"][:, :5]
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                  do_sample=False)
        assert torch.equal(result["generated"], expected)
    assert max_difference(saved_weights(parallel_run, name, mode), dict(model.named_parameters())) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("case", "message"), [
    ("ei_pruned_odd-tp", ("ValueError: Tensor parallelism splits attention heads evenly across ranks, "
                          "but layer 1 has 3 attention heads, which tp_size=2 does not divide")),
    pytest.param("ei_tied-tp_fsdp", ("ValueError: tie_word_embeddings=True cannot be trained with tensor "
                                     "parallelism and FSDP together (tp_size=2, fsdp × replicas = 2)"),
                 marks=needs_fsdp2_torch()),
])
def test_what_cannot_be_sharded_right_is_refused_in_one_sentence(
    parallel_run, case: str, message: str
) -> None:
    result = torch.load(parallel_run["out"] / f"{case}.pt")
    assert result["error"].startswith(message), result


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), [case for case in CASES + FOUR_PROCESS_CASES
                                            if case[1] in ("fsdp", "hsdp", "tp_fsdp")
                                            and case != ("ei_tied", "tp_fsdp")])
@needs_fsdp2_torch()
def test_fsdp2_logits_and_one_optimizer_step_equal_one_process(parallel_run, name: str, mode: str) -> None:
    """FSDP2 and HSDP (two replicas) on two processes; tensor parallel × FSDP2 (2 × 2) with gradient
    checkpointing on four."""
    result = recorded(parallel_run, name, mode)
    data, model, inputs = one_process(parallel_run, name)
    assert_sharded_as_planned(result["placements"], dict(model.named_parameters()), **MODE_SIZES[mode])
    with torch.no_grad():
        torch.testing.assert_close(result["logits"], model(**inputs).logits, atol=TOLERANCE, rtol=0)
    stepped = type(model).from_pretrained(parallel_run["root"] / name).eval()
    optimizer = torch.optim.SGD(stepped.parameters(), lr=0.5)
    ids = data["step_ids"]  # no padding, so both ranks' halves hold equally many tokens
    stepped(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert max_difference(result["step_weights"], dict(stepped.named_parameters())) <= TOLERANCE
    assert max_difference(saved_weights(parallel_run, name, mode), result["step_weights"]) == 0
    with torch.no_grad():
        torch.testing.assert_close(result["step_logits"], stepped(**inputs).logits, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [case[0] for case in CASES if case[1] == "pp"])
def test_pipeline_parallel_logits_equal_one_process(parallel_run, name: str) -> None:
    result = recorded(parallel_run, name, "pp")
    _, model, inputs = one_process(parallel_run, name)
    assert result["stage_identity_layers"] >= 1  # rank 0 really holds only part of the stack
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(result["logits"], expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(("model_class", "sizes", "message"), [
    (GAUForMaskedLM, {"pp_size": 2},
     "pp_size=2: Transformers' pipeline parallelism runs causal language models only"),
    (EntropyInvariantForCausalLM, {"tp_size": 2, "fsdp_size": 2},
     "tie_word_embeddings=True cannot be trained with tensor parallelism and FSDP together"),
])
def test_layouts_that_cannot_work_are_refused_while_the_model_is_built(model_class, sizes, message) -> None:
    """Checked at construction, before Transformers shards anything (no processes needed): ``from_pretrained``
    sets ``config.distributed_config`` before it builds the model."""
    config = model_class.config_class(**{**COMMON, "tie_word_embeddings": True, **(
        HEADS if model_class is EntropyInvariantForCausalLM
        else {"expansion_factor": 2, "attention_key_size": 8})})
    config.distributed_config = DistributedConfig(**sizes)
    with pytest.raises(ValueError, match=re.escape(message)):
        model_class(config)
