"""The results file of a benchmark run (results kind ``bench``): ``BenchRun`` ⇄ JSON, and ``--merge``.

A full ``hf-attn-variants bench`` writes ``docs/results/benchmarks-cpu.json`` (``benchmarks-gpu.json`` on
CUDA); docs/benchmarks.md, its speed summary and the tables of docs/gau.md and docs/synthesizer.md are views
of it (the repository's ``tools/docs_results/bench.py``). A partial run (``--only``, ``--lengths``,
``--repeats``…) writes the same format under ``runs/``, or with ``--merge`` replaces the rows it measured
in the committed file: ``merge_results`` records in ``replaced`` which rows, by which command, when and
under what load, and tags every row it brought with ``"merge": k``, which the report shows.

One row per (variant, mode, phase, n): the per-round times of both clocks (ms), the peak step memory
(bytes) and the FLOPs of one step — everything a ratio, a throughput or a target of the report is computed
from. A training loop's row (``bench/loops.py``; n = its block length) holds each round's mean time per
optimizer step and, under ``loop``, the loop, objective, batch, steps and each round's mean training loss.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .runner import BenchRun, Result
from .specs import COMPARISONS, Comparison, Preset

KIND = "bench"
"""The repository's docs renderer shows these files with ``tools/docs_results/bench.py``."""

SCHEMA = 1

_ROW_KEYS = ("variant", "mode", "phase", "n")


class MergeError(ValueError):
    """A partial run that cannot be merged into the committed results (other preset, device, timer…)."""


def is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def results_name(device: str) -> str:
    """Name of the committed results file (under docs/results/, without ``.json``) of a device."""
    return "benchmarks-gpu" if is_cuda(device) else "benchmarks-cpu"


def committed_results_path(device: str) -> Path:
    """The committed results file of a device (``--publish``, ``--merge``), relative to the repository
    root."""
    return Path("docs") / "results" / f"{results_name(device)}.json"


def report_path(device: str) -> Path:
    """The committed report rendered from ``results_name(device)``, relative to the repository root."""
    return Path("docs") / ("benchmarks-gpu.md" if is_cuda(device) else "benchmarks.md")


def plot_prefix(device: str) -> str:
    """Stem of the committed plots: ``docs/<prefix>_time.png`` and ``docs/<prefix>_memory.png``."""
    return report_path(device).stem


def _ms(values: list[float]) -> list[float]:
    return [round(1e3 * value, 3) for value in values]


def _row(result: Result) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": result.variant, "mode": result.mode, "phase": result.phase,
                           "n": result.length, "status": result.status}
    if result.reason:
        row["reason"] = result.reason
    if result.cpu or result.wall:
        row["cpu_ms"], row["wall_ms"] = _ms(result.cpu), _ms(result.wall)
    for name in ("peak_bytes", "flops"):
        if getattr(result, name) is not None:
            row[name] = getattr(result, name)
    if result.compile_s is not None:
        row["compile_s"] = round(result.compile_s, 2)
    if result.merge:
        row["merge"] = result.merge
    if result.loop is not None:
        row["loop"] = result.loop
    return row


def row_key(row: dict[str, Any]) -> tuple[str, str, str, int]:
    return tuple(row[k] for k in _ROW_KEYS)  # type: ignore[return-value]


def to_results(run: BenchRun) -> dict[str, Any]:
    """The results-file object of ``run`` (plain JSON types: lists, not tuples)."""
    env = run.environment
    data = {
        "kind": KIND,
        "schema": SCHEMA,
        "command": env.get("command", "hf-attn-variants bench"),
        "date": env.get("date"),
        "duration_s": round(run.elapsed_s, 1),
        "machine": {
            "cpu": env.get("cpu"), "cpu_count": env.get("cpu_count"), "platform": env.get("platform"),
            "device": run.device, "gpu": env.get("gpu"), "cuda": env.get("cuda"), "threads": run.threads,
            "load_average_start": env.get("load_average_start"),
            "load_average_end": env.get("load_average_end"),
            **({"environment": env["environment"]} if "environment" in env else {}),
        },
        "versions": {k: env.get(k) for k in ("python", "torch", "transformers", "hf_attn_variants")},
        "settings": {"dtype": run.dtype, "timer": run.timer, "peak_tflops": run.peak_tflops,
                     "preset": asdict(run.preset)},
        "comparisons": [asdict(c) for c in run.comparisons],
        "variants": run.variants,
        "graph_checks": run.graph_checks,
        "replaced": run.replaced,
        **({"interrupted": run.interrupted} if run.interrupted else {}),
        "results": [_row(r) for r in run.results],
    }
    return json.loads(json.dumps(data))


def _tuples(values: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def from_results(data: dict[str, Any]) -> BenchRun:
    """The ``BenchRun`` a results file describes (``ValueError`` if it is not one of kind ``bench``)."""
    if data.get("kind") != KIND or data.get("schema") != SCHEMA:
        raise ValueError(f"not a results file of kind {KIND!r}, schema {SCHEMA} (kind {data.get('kind')!r}, "
                         f"schema {data.get('schema')!r})")
    machine, settings = data["machine"], data["settings"]
    environment = {**data["versions"], **{k: v for k, v in machine.items() if k not in ("device", "threads")},
                   "date": data["date"], "command": data["command"]}
    preset_fields = {f.name for f in fields(Preset)}
    preset = Preset(**_tuples({k: v for k, v in settings["preset"].items() if k in preset_fields}))
    comparisons = tuple(Comparison(**_tuples(c)) for c in data["comparisons"])
    run = BenchRun(
        preset=preset, device=machine["device"], dtype=settings["dtype"], timer=settings["timer"],
        threads=machine["threads"], environment=environment, comparisons=comparisons,
        variants=data["variants"], graph_checks=data.get("graph_checks", []),
        peak_tflops=settings.get("peak_tflops"), elapsed_s=data.get("duration_s", 0.0),
        replaced=data.get("replaced", []), interrupted=data.get("interrupted"),
    )
    for row in data["results"]:
        variant = row["variant"]
        run.results.append(Result(
            variant, data["variants"].get(variant, {}).get("family", ""), row["mode"], row["phase"], row["n"],
            (row.get("loop") or {}).get("batch_size", preset.batch_size), row["status"],
            row.get("reason", ""),
            wall=[t / 1e3 for t in row.get("wall_ms", [])], cpu=[t / 1e3 for t in row.get("cpu_ms", [])],
            peak_bytes=row.get("peak_bytes"), flops=row.get("flops"), compile_s=row.get("compile_s"),
            merge=row.get("merge", 0), loop=row.get("loop"),
        ))
    return run


def merge_closure(keys: set[str]) -> set[str]:
    """Comparison keys to re-measure for ``keys`` so that every ratio of the merged file pairs rows of one
    run: each selected comparison whole, and every comparison sharing a variant with one of them."""
    selected = set(keys)
    while True:
        members = {m for c in COMPARISONS if c.key in selected for m in (c.baseline, *c.variants)}
        more = {c.key for c in COMPARISONS if members & {c.baseline, *c.variants}} - selected
        if not more:
            return selected
        selected |= more


def _median_ms(row: dict[str, Any], timer: str) -> float | None:
    values = sorted(row.get(f"{timer}_ms", []))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


_SAME_MODELS = ("name", "hidden_size", "num_layers", "num_heads", "intermediate_size", "batch_size",
                "vocab_size",
                "gau_layers", "gau_key_size", "gau_chunk_size", "prune_heads", "prune_intermediate_size",
                "equal_parameter_width_multiple")


MACHINE_KEYS = ("cpu", "cpu_count", "gpu")
"""What must match for a merge (``check_compatible``): one results file describes one machine in its report's
Setup, and its rows' times and peaks are only comparable on that machine (the platform string is not
compared: a kernel update leaves the machine what it was)."""


def check_compatible(committed: dict[str, Any], *, preset: Preset, device: str, dtype: str, timer: str,
                     threads: int | None, machine_now: dict[str, Any] | None = None) -> None:
    """``MergeError`` unless a run with these settings, on ``machine_now`` (``runner.environment``'s or a
    results file's ``machine``; ``None``: not compared), measures what ``committed`` measured, the same way
    (lengths and repeats may differ)."""
    machine, settings = committed["machine"], committed["settings"]
    for key in MACHINE_KEYS if machine_now is not None else ():
        if machine.get(key) != machine_now.get(key):
            raise MergeError(f"the committed results were measured on a machine with {key} "
                             f"{machine.get(key)!r}, this one has {machine_now.get(key)!r}; only runs of "
                             "one machine can be merged (run a full bench here instead)")
    if threads is None and not is_cuda(device):
        threads = machine["threads"]
    defaults = {f.name: f.default for f in fields(Preset)}  # fields results files from before them lack
    for label, old, new in (
        ("device", machine["device"], str(device)),
        ("dtype", settings["dtype"], dtype),
        ("timer", settings["timer"], timer),
        ("threads", machine["threads"], threads if threads is not None else machine["threads"]),
        *((f"preset {name}", settings["preset"].get(name, defaults[name]), getattr(preset, name))
          for name in _SAME_MODELS),
    ):
        if old != new:
            raise MergeError(f"the committed results were measured with {label} {old!r}, this run would use "
                             f"{new!r}; only runs of the same models and settings can be merged")


def _merge_variants(committed: dict[str, Any], partial: dict[str, Any]) -> dict[str, Any]:
    """``committed``'s variants updated by ``partial``'s; the parameter counts of models built per length
    (``parameters_by_length``) are joined, and ``parameters`` stays the count at the shortest length."""
    merged = {**committed}
    for name, info in partial.items():
        old = committed.get(name, {})
        by_length = {**old.get("parameters_by_length", {}), **info.get("parameters_by_length", {})}
        merged[name] = {**old, **info}
        if by_length:
            merged[name]["parameters_by_length"] = by_length
            merged[name]["parameters"] = by_length[min(by_length, key=int)]
    return merged


def merge_results(committed: dict[str, Any], partial: dict[str, Any]) -> dict[str, Any]:
    """``committed`` with the rows of ``partial`` in place of the ones with the same (variant, mode, phase,
    n).

    The new rows carry ``"merge": k`` and ``replaced`` gains entry k: the partial run's command, date,
    duration, load, versions, repeats and lengths, and the rows it replaced (with their previous median on
    the primary timer) or added. ``MergeError`` when the runs are not comparable (preset, device, dtype,
    timer, thread count or machine differ).
    """
    preset = from_results(partial).preset
    check_compatible(committed, preset=preset, device=partial["machine"]["device"],
                     dtype=partial["settings"]["dtype"], timer=partial["settings"]["timer"],
                     threads=partial["machine"]["threads"], machine_now=partial["machine"])
    timer = committed["settings"]["timer"]
    merged = {**committed}
    index = len(committed.get("replaced", [])) + 1
    new_rows = {row_key(row): {**row, "merge": index} for row in partial["results"]}
    results, replaced = [], []
    for row in committed["results"]:
        key = row_key(row)
        if key in new_rows:
            results.append(new_rows.pop(key))
            replaced.append([*key, _median_ms(row, timer) if row["status"] == "ok" else row["status"]])
        else:
            results.append(row)
    added = [list(key) for key in new_rows]
    results += new_rows.values()
    merged["results"] = results
    merged["variants"] = _merge_variants(committed["variants"], partial["variants"])
    # Preset fields newer than the committed run (e.g. equal_parameter_lengths) come from the partial run.
    merged["settings"] = {**committed["settings"],
                          "preset": {**partial["settings"]["preset"], **committed["settings"]["preset"]}}
    known = {c["key"] for c in committed["comparisons"]}
    remeasured = {c["key"]: c for c in partial["comparisons"]}  # their notes say how the new rows were made
    merged["comparisons"] = [remeasured.get(c["key"], c) for c in committed["comparisons"]]
    merged["comparisons"] += [c for c in partial["comparisons"] if c["key"] not in known]
    checked = {c["variant"] for c in partial.get("graph_checks", [])}
    merged["graph_checks"] = [c for c in committed.get("graph_checks", []) if c["variant"] not in checked]
    merged["graph_checks"] += partial.get("graph_checks", [])
    machine = partial["machine"]
    merged["replaced"] = [*committed.get("replaced", []), {
        "merge": index,
        "command": partial["command"],
        "date": partial["date"],
        "duration_s": partial["duration_s"],
        "load_average_start": machine.get("load_average_start"),
        "load_average_end": machine.get("load_average_end"),
        "machine": {k: machine.get(k) for k in ("cpu", "cpu_count", "platform", "environment")
                    if k in machine},
        "versions": partial["versions"],
        "lengths": list(preset.lengths),
        "repeats": {str(n): preset.repeats_at(n) for n in preset.lengths},
        "rows_replaced": replaced,
        "rows_added": added,
    }]
    return merged


__all__ = [
    "KIND",
    "SCHEMA",
    "MergeError",
    "check_compatible",
    "from_results",
    "merge_closure",
    "merge_results",
    "plot_prefix",
    "report_path",
    "results_name",
    "row_key",
    "to_results",
]
