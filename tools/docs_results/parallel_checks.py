"""Views of ``docs/results/parallel-cpu.json``: the largest differences between sharded runs (tensor,
pipeline, FSDP2, HSDP parallelism on CPU processes with gloo) and one process, measured by the multi-process
tests (tests/test_parallelism.py, tests/test_pretrain_sharded.py, tests/test_finetune_sharded.py), for
docs/scaling.md and docs/training.md.

Sections of the file: ``model_checks`` (rows of ``check``, ``models``, ``differences``),
``tied_fsdp2_upstream`` (the stock tied Llama under FSDP2), ``pretrain`` (rows of ``layout``, ``processes``,
per family ``[loss, weights]``), ``pretrain_resume`` and ``finetune``. A difference is ``{"what", "max",
"bound", "worst", "others"}`` (``bound``: a maximum over several models, shown as ≤) or ``{"text"}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def sci(value: float) -> str:
    """``1.9e-7``; an exact 0 is ``0``."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _difference(item: dict[str, Any]) -> str:
    if "text" in item:
        return item["text"]
    text = (f"{item['what']} " if item.get("what") else "") + ("≤ " if item.get("bound")
                                                               else "") + sci(item["max"])
    extra = [item["worst"]] if item.get("worst") else []
    extra += [f"{name} {sci(value)}" for name, value in (item.get("others") or {}).items()]
    return text + (f" ({'; '.join(extra)})" if extra else "")


def model_checks(data: dict[str, Any]) -> str:
    """docs/scaling.md: sharded model vs one process, per check."""
    rows = [[r["check"], r["models"], ", ".join(_difference(d) for d in r["differences"])]
            for r in data["model_checks"]]
    return markdown_table(["check", "models", "largest difference"], rows) + "\n\n" + source_line(data)


def tied_fsdp2(data: dict[str, Any]) -> str:
    """docs/scaling.md: the upstream problem, measured on a stock Llama, tied and untied."""
    t = data["tied_fsdp2_upstream"]
    rows = [["tied", f"{t['tied']:.2f}"], ["untied", f"{t['untied']:.1f}"]]
    return markdown_table(["stock `LlamaForCausalLM`", "largest difference of the last hidden states"], rows,
                          ["---", "---:"])


def pretrain(data: dict[str, Any]) -> str:
    """docs/training.md: sharded ``pretrain`` vs one process (largest difference over losses / over
    weights)."""
    families = data["pretrain_families"]
    rows = []
    for r in data["pretrain"]:
        cells = [f"{sci(r[f][0])} / {sci(r[f][1])}" if r.get(f) else "" for f in families]
        rows.append([r["layout"], str(r["processes"]), *cells])
    return markdown_table(["layout", "processes", *families], rows)


def pretrain_resume(data: dict[str, Any]) -> str:
    """docs/training.md: the sharded layouts whose resumed run did not reproduce the uninterrupted one exactly
    (loss / weights difference), and the source line."""
    r = data["pretrain_resume"]
    rows = [[e["family"].upper() if e["family"] == "gau" else e["family"], e["layout"],
             "0" if e["loss"] == 0 else sci(e["loss"]), sci(e["weights"])] for e in r["exceptions"]]
    head = ["family", "layout", "losses", "weights"]
    align = ["---", "---", "---:", "---:"]
    body = markdown_table(head, rows, align) if rows else "*Every one reproduced exactly.*"
    return body + "\n\n" + source_line(data)


def resume_step(data: dict[str, Any]) -> str:
    """The step of the checkpoint the sharded runs resumed from (one figure)."""
    return str(data["pretrain_resume"]["step"])


def finetune(data: dict[str, Any]) -> str:
    """docs/training.md: sharded ``finetune`` vs one process, largest difference per quantity."""
    f = data["finetune"]
    rows = [["`train_loss`", sci(f["train_loss"])], ["final weights", sci(f["weights"])],
            ["evaluation metrics", "0"]]
    return markdown_table(["quantity", "largest difference to one process"], rows, ["---", "---:"])
