"""Run under ``torchrun``: load saved models with Transformers' native parallelism and record
what tests/test_parallelism.py compares with one process.

Usage: ``torchrun --nproc_per_node N tests/parallel_child.py SPEC.json OUT_DIR``. The spec lists cases
``{"name", "path", "mode", "generate"}``, with ``mode`` one of ``tp`` (``DistributedConfig(tp_size=2)``),
``tp_auto`` (``from_pretrained(..., tp_plan="auto")``), ``fsdp`` (``DistributedConfig(fsdp_size=2)``),
``hsdp`` (``DistributedConfig(dp_replicate_size=2)``: two replicas), ``tp_fsdp`` (``tp_size=2, fsdp_size=2``,
four processes) and ``pp`` (``pp_size=2``), and
the path of a ``.pt`` file with the batch. Rank 0 writes
``OUT_DIR/<name>.pt``: logits, full gradients, greedy tokens, and for ``fsdp`` the logits and full weights after
one SGD step on each data-parallel rank's share of the batch (with gradient checkpointing if
``case["checkpointing"]``); and, except for ``pp``, ``save_pretrained`` of the sharded model into
``OUT_DIR/<name>-saved``; or ``{"error": message}`` when loading or running raised.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.distributed import DistributedConfig

LEARNING_RATE = 0.5
NEW_TOKENS = 6
STEP_MODES = ("fsdp", "hsdp", "tp_fsdp")
WATCHDOG_SECONDS = 540  # below tests/test_parallelism.py's 600 s timeout


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from its shards when it is a DTensor."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def load(case: dict[str, Any]) -> torch.nn.Module:
    """The saved model with the case's parallelism: remote code (as from the Hub) unless ``case["package"]``."""
    auto = AutoModelForCausalLM if case["causal"] else AutoModelForMaskedLM
    options: dict[str, Any] = {"trust_remote_code": not case.get("package", False)}
    if case.get("package"):
        import hf_attn_variants  # noqa: F401 — registers the families with the auto classes
    if case["mode"] == "tp_auto":
        return auto.from_pretrained(case["path"], tp_plan="auto", **options)
    sizes = {"tp": {"tp_size": 2}, "fsdp": {"fsdp_size": 2}, "pp": {"pp_size": 2},
             "tp_fsdp": {"tp_size": 2, "fsdp_size": 2}, "hsdp": {"dp_replicate_size": 2}}[case["mode"]]
    return auto.from_pretrained(case["path"], distributed_config=DistributedConfig(**sizes), **options)


def run_case(case: dict[str, Any], batch: dict[str, torch.Tensor], out_dir: Path) -> dict[str, Any]:
    model = load(case)
    model.eval()
    # From the sharded parameters, before any forward (as FSDP2 asks): a group that keeps its full weights after
    # forward (the final norm) would show its gathered tensors until the next backward.
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE) if case["mode"] in STEP_MODES else None
    result: dict[str, Any] = {}
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        result["logits"] = full(model(**inputs).logits)
    if case["mode"] == "pp":
        result["stage_identity_layers"] = sum(type(m).__name__ == "PipelineIdentityLayer" for m in model.modules())
        return result
    if case["mode"] in ("tp", "tp_auto"):
        loss = model(**inputs, labels=batch["labels"]).loss
        loss.backward()
        result["loss"] = loss.detach()
        result["grads"] = {name: full(p.grad) for name, p in model.named_parameters() if p.grad is not None}
        if case["generate"]:
            prompt = batch["input_ids"][:, :5]
            result["generated"] = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False
            )
        model.save_pretrained(out_dir / f"{case['name']}-saved")  # every rank: Transformers gathers, rank 0 writes
        return result
    # fsdp, hsdp, tp_fsdp: one SGD step, each data-parallel rank on its share of the batch (no padding: equal token
    # counts). Ranks are laid out (fsdp, tp), so the data-parallel rank is rank // tp_size.
    tp_size = 2 if case["mode"] == "tp_fsdp" else 1
    rank, ranks = dist.get_rank() // tp_size, dist.get_world_size() // tp_size
    rows = slice(rank * len(batch["step_ids"]) // ranks, (rank + 1) * len(batch["step_ids"]) // ranks)
    if case.get("checkpointing"):
        model.gradient_checkpointing_enable()
        model.train()  # checkpointing is active in training mode; the models have no dropout
    ids = batch["step_ids"][rows]
    model(input_ids=ids, labels=ids).loss.backward()
    result["step_grads"] = {name: full(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    result["step_weights"] = {name: full(p) for name, p in model.named_parameters()}
    with torch.no_grad():
        result["step_logits"] = full(model(**inputs).logits)
    model.save_pretrained(out_dir / f"{case['name']}-saved")
    return result


def main() -> None:
    # A collective that never completes (one rank failed alone) would hang every worker; torchrun starts each in a
    # session of its own, so the test's kill cannot reach them: each dumps its stack and exits on its own.
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    spec_path, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    torch.manual_seed(0)
    for case in spec["cases"]:
        batch = torch.load(case["batch"])
        try:
            result = run_case(case, batch, out_dir)
        except Exception as error:  # noqa: BLE001 — recorded for the parent test, which names the case
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(result, out_dir / f"{case['name']}.pt")
        if dist.is_initialized():
            dist.barrier()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
