"""Views of ``docs/results/triton-resources-<triton>.json``, written by ``scripts/triton_resources.py``: what
each Triton kernel of GAU costs an NVIDIA GPU (registers, spilled bytes, shared memory, tensor-core
instructions), from Triton's compiler for sm_90 and sm_80, without a GPU.

Data: ``settings`` (``shape``, ``dtypes``, ``targets``: ``{name: {arch, gpus, shared_limit}}``, ``variants``),
``rows`` of ``{kernel, variant, target, dtype, num_warps, num_stages, blocks, registers, spill_bytes,
shared_bytes, shared_limit, wgmma, mma_sync, compile_s}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def _kib(size: int) -> str:
    return f"{size / 1024:.0f}"


def table(data: dict[str, Any]) -> str:
    """One row per kernel, variant and dtype: its launch, then per target registers, spilled bytes, shared
    KiB and tensor-core instructions."""
    targets = data["settings"]["targets"]
    by = {(r["kernel"], r["variant"], r["dtype"], r["target"]): r for r in data["rows"]}
    order = list(dict.fromkeys((r["kernel"], r["variant"], r["dtype"]) for r in data["rows"]))
    head = ["kernel", "variant", "dtype", "warps, stages"]
    for name, target in targets.items():
        head += [f"{name}: registers", "spilled B", f"shared KiB (of {_kib(target['shared_limit'])})",
                 "tensor-core instr.", "compile s"]
    rows = []
    for kernel, variant, dtype in order:
        first = next(by[(kernel, variant, dtype, t)] for t in targets if (kernel, variant, dtype, t) in by)
        row = [f"`{kernel}`", variant, dtype, f"{first['num_warps']}, {first['num_stages']}"]
        for name in targets:
            found = by.get((kernel, variant, dtype, name))
            row += (["—"] * 5 if found is None else
                    [str(found["registers"]), str(found["spill_bytes"]), _kib(found["shared_bytes"]),
                     str(found["wgmma"] + found["mma_sync"]), f"{found['compile_s']:.1f}"])
        rows.append(row)
    body = markdown_table(head, rows, ["---", "---", "---", "---:", *["---:"] * (len(head) - 4)])
    shape = data["settings"]["shape"]
    setting = (f"Key size {shape['key_size']}, value width {shape['width']}, chunk {shape['chunk_size']}; "
               f"Triton {data['versions']['triton']}, ptxas {data['versions']['ptxas']}; "
               + "; ".join(f"{name}: {t['gpus']}" for name, t in targets.items())
               + "; compile s: with an empty cache, two compiles at a time on the machine below.")
    return f"{setting}\n\n{body}\n\n{source_line(data)}"


def summary(data: dict[str, Any]) -> str:
    """One sentence on the bf16 compiles: how many, their spills, the tensor cores, the most shared memory."""
    rows = [r for r in data["rows"] if r["dtype"] == "bfloat16"]
    spilled = sum(r["spill_bytes"] > 0 for r in rows)
    without = sum(r["wgmma"] + r["mma_sync"] == 0 for r in rows)
    fullest = max(rows, key=lambda r: r["shared_bytes"] / r["shared_limit"])
    spills = "none spills a register" if not spilled else f"{spilled} spill registers"
    cores = "every one multiplies on the tensor cores" if not without else f"{without} use no tensor core"
    return (f"with Triton {data['versions']['triton']}, {len(rows)} compiles in bf16, {spills}, {cores}, "
            f"and the fullest uses {_kib(fullest['shared_bytes'])} of {_kib(fullest['shared_limit'])} KiB of "
            f"shared memory ({fullest['target']})")


def float32_summary(data: dict[str, Any]) -> str:
    """One sentence on the float32 compiles: tensor-core instructions and the most bytes spilled."""
    rows = [r for r in data["rows"] if r["dtype"] == "float32"]
    cores = sum(r["wgmma"] + r["mma_sync"] for r in rows)
    spilled = [r["spill_bytes"] for r in rows if r["spill_bytes"]]
    fullest = max(rows, key=lambda r: r["shared_bytes"] / r["shared_limit"])
    return (f"{cores} tensor-core instructions in {len(rows)} float32 compiles, {len(spilled)} of them "
            f"spilling {min(spilled, default=0):,}–{max(spilled, default=0):,} B per thread, and at most "
            f"{_kib(fullest['shared_bytes'])} of {_kib(fullest['shared_limit'])} KiB of shared memory "
            f"({fullest['target']}, Triton {data['versions']['triton']})")


__all__ = ["float32_summary", "summary", "table"]
