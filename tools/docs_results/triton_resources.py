"""Views of ``docs/results/triton-resources-<triton>.json``, written by ``scripts/triton_resources.py``: what
each Triton kernel of GAU costs an NVIDIA GPU (registers, spilled bytes, shared memory, tensor-core
instructions), from Triton's compiler for sm_90 and sm_80, without a GPU.

Data: ``settings`` (``shape``, ``targets``: ``{name: {arch, gpus, shared_limit}}``, ``variants``), ``rows`` of
``{kernel, variant, target, num_warps, num_stages, blocks, registers, spill_bytes, shared_bytes, shared_limit,
wgmma, mma_sync}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def _kib(size: int) -> str:
    return f"{size / 1024:.0f}"


def table(data: dict[str, Any]) -> str:
    """One row per kernel and variant: its launch, then per target registers, spilled bytes, shared KiB and
    tensor-core instructions."""
    targets = data["settings"]["targets"]
    by = {(r["kernel"], r["variant"], r["target"]): r for r in data["rows"]}
    order = list(dict.fromkeys((r["kernel"], r["variant"]) for r in data["rows"]))
    head = ["kernel", "variant", "warps, stages"]
    for name, target in targets.items():
        head += [f"{name}: registers", "spilled B", f"shared KiB (of {_kib(target['shared_limit'])})",
                 "tensor-core instr."]
    rows = []
    for kernel, variant in order:
        first = next(by[(kernel, variant, t)] for t in targets if (kernel, variant, t) in by)
        row = [f"`{kernel}`", variant, f"{first['num_warps']}, {first['num_stages']}"]
        for name in targets:
            found = by.get((kernel, variant, name))
            row += (["—"] * 4 if found is None else
                    [str(found["registers"]), str(found["spill_bytes"]), _kib(found["shared_bytes"]),
                     str(found["wgmma"] + found["mma_sync"])])
        rows.append(row)
    body = markdown_table(head, rows, ["---", "---", "---:", *["---:"] * (len(head) - 3)])
    shape = data["settings"]["shape"]
    setting = (f"Key size {shape['key_size']}, value width {shape['width']}, chunk {shape['chunk_size']}, "
               f"{shape['dtype']}; Triton {data['versions']['triton']}, ptxas {data['versions']['ptxas']}; "
               + "; ".join(f"{name}: {t['gpus']}" for name, t in targets.items()) + ".")
    return f"{setting}\n\n{body}\n\n{source_line(data)}"


def summary(data: dict[str, Any]) -> str:
    """One sentence: how many kernels compiled, their spills, the most shared memory, the tensor cores."""
    rows = data["rows"]
    spilled = sum(r["spill_bytes"] > 0 for r in rows)
    without = sum(r["wgmma"] + r["mma_sync"] == 0 for r in rows)
    fullest = max(rows, key=lambda r: r["shared_bytes"] / r["shared_limit"])
    spills = "none spills a register" if not spilled else f"{spilled} spill registers"
    cores = "every one multiplies on the tensor cores" if not without else f"{without} use no tensor core"
    return (f"with Triton {data['versions']['triton']}, {len(rows)} compiles, {spills}, {cores}, and the "
            f"fullest uses {_kib(fullest['shared_bytes'])} of {_kib(fullest['shared_limit'])} KiB of shared "
            f"memory ({fullest['target']})")


__all__ = ["summary", "table"]
