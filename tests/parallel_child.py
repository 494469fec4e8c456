"""Run under ``torchrun``: load saved models with Transformers' native parallelism and record
what tests/test_parallelism.py compares with one process.

Usage: ``torchrun --nproc_per_node N tests/parallel_child.py SPEC.json OUT_DIR``. The spec lists cases
``{"name", "path", "mode", "generate"}``, with ``mode`` one of ``tp`` (``DistributedConfig(tp_size=2)``),
``tp_auto`` (``from_pretrained(..., tp_plan="auto")``), ``fsdp`` (``DistributedConfig(fsdp_size=2)``),
``hsdp`` (``DistributedConfig(dp_replicate_size=2)``: two replicas), ``tp_fsdp`` (``tp_size=2, fsdp_size=2``,
four processes) and ``pp`` (``pp_size=2``), and
the path of a ``.pt`` file with the batch. Rank 0 writes
``OUT_DIR/<name>.pt``: the placements of the loaded model's parameters (``placements``), logits, full
gradients, greedy tokens, and for ``fsdp`` the logits and full weights after one SGD step on each
data-parallel rank's share of the batch (with gradient checkpointing if ``case["checkpointing"]``); and,
except for ``pp``, ``save_pretrained`` of the sharded model into ``OUT_DIR/<name>-saved``; or
``{"error": message}`` when loading or running raised.

``record_sharded_loads`` does the same recording for the workers of a ``torchrun`` of the CLI (``pretrain``,
``finetune``), through a ``sitecustomize.py`` that ``placement_recording_env`` puts on their ``PYTHONPATH``.
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
PLACEMENTS_FILE_VARIABLE = "HF_ATTN_VARIANTS_TEST_PLACEMENTS"
SITE_HOOK = f'''"""Written by tests/parallel_child.py: a torchrun worker (RANK set) records its \
sharded load."""
import os
if "RANK" in os.environ and os.environ.get("{PLACEMENTS_FILE_VARIABLE}"):
    from tests.parallel_child import record_sharded_loads
    record_sharded_loads(os.environ["{PLACEMENTS_FILE_VARIABLE}"])
'''


def placements(model: torch.nn.Module) -> dict[str, dict[str, str] | None]:
    """Parameter name → ``{mesh dimension: repr(placement)}`` of a DTensor parameter, ``None`` for a plain
    tensor: what tensor parallelism and FSDP2 really made of each parameter. Read right after loading: FSDP2
    unshards parameters during forward (and a ``keep_full_weight`` group stays unsharded after it)."""
    return {
        name: dict(zip(p.device_mesh.mesh_dim_names, map(repr, p.placements), strict=True))
        if isinstance(p, DTensor) else None
        for name, p in model.named_parameters()
    }


def record_sharded_loads(path: str) -> None:
    """From now on, ``hf_attn_variants.training.sharded.load_sharded`` — how ``pretrain`` and ``finetune``
    load a sharded model — also writes ``placements`` of the model it loaded to ``path`` (JSON; rank 0; the
    last load wins). Called at start-up (``SITE_HOOK``), before ``finetune`` imports the function by name."""
    from hf_attn_variants.training import sharded

    load = sharded.load_sharded

    def load_and_record(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = load(*args, **kwargs)
        if dist.get_rank() == 0:
            Path(path).write_text(json.dumps(placements(model)))
        return model

    sharded.load_sharded = load_and_record
    if "hf_attn_variants.training.finetune" in sys.modules:
        sys.modules["hf_attn_variants.training.finetune"].load_sharded = load_and_record


def placement_recording_env(folder: Path) -> dict[str, str]:
    """Environment variables for a ``torchrun`` of the CLI whose rank 0 writes the placements of the model it
    loads sharded to ``folder/placements.json`` (read it with ``recorded_placements``): ``SITE_HOOK`` as
    ``sitecustomize.py`` on ``PYTHONPATH``, with the repository (for ``tests``)."""
    hook = folder / "placement_hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITE_HOOK)
    (folder / "placements.json").unlink(missing_ok=True)
    path = [str(hook), str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(part for part in path if part),
            PLACEMENTS_FILE_VARIABLE: str(folder / "placements.json")}


def recorded_placements(folder: Path) -> dict[str, dict[str, str] | None]:
    """What the launch that ``placement_recording_env(folder)`` set up recorded."""
    path = folder / "placements.json"
    assert path.is_file(), f"the workers recorded no placements in {path} (tests/parallel_child.py SITE_HOOK)"
    return json.loads(path.read_text())


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from its shards when it is a DTensor."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def load(case: dict[str, Any]) -> torch.nn.Module:
    """The saved model with the case's parallelism: remote code (as from the Hub) unless
    ``case["package"]``."""
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
    # From the sharded parameters, before any forward (as FSDP2 asks): a group that keeps its full weights
    # after forward (the final norm) would show its gathered tensors until the next backward.
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE) if case["mode"] in STEP_MODES else None
    result: dict[str, Any] = {"placements": placements(model)}
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        result["logits"] = full(model(**inputs).logits)
    if case["mode"] == "pp":
        result["stage_identity_layers"] = sum(type(m).__name__ == "PipelineIdentityLayer"
                                              for m in model.modules())
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
        # every rank: Transformers gathers, rank 0 writes
        model.save_pretrained(out_dir / f"{case['name']}-saved")
        return result
    # fsdp, hsdp, tp_fsdp: one SGD step, each data-parallel rank on its share of the batch (no padding: equal
    # token counts). Ranks are laid out (fsdp, tp), so the data-parallel rank is rank // tp_size.
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
    # A collective that never completes (one rank failed alone) would hang every worker; torchrun starts each
    # in a session of its own, so the test's kill cannot reach them: each dumps its stack and exits on its
    # own.
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
