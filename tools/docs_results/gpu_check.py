"""Views of the GPU check's own results files (kind ``gpu_check``), written by ``scripts/gpu_check.sh`` on a
machine with a CUDA GPU and published into ``docs/results/`` by ``python scripts/gpu_check.py publish DIR``;
docs/benchmarks-gpu.md shows them next to the GPU benchmark (``benchmarks-gpu.json``, kind ``bench``) and
decoding table (``decoding-gpu.json``, kind ``decoding``) of the same run.

Data (besides the provenance fields): ``dry_run`` (a CPU rehearsal, never published), and

- ``environment-gpu.json``: ``environment`` = ``{gpu: {available, name, count, capability, memory_gib,
  multiprocessors, cuda, cudnn, bf16}, nvidia_smi: {query | error}, matmul_tflops, packages: {name: version |
  None}, wheels: [file names], python, triton_interpret}``;
- ``tests-gpu.json``: ``tests`` = ``{status, exit_code, duration_s, command, selection, notes, counts:
  {passed, failed, skipped, errors}, files: {file: counts}, failures: [{test, message, traceback}],
  skipped: [{reason, tests}]}`` (``status`` "running" while pytest runs: the file is rewritten at every
  outcome);
- ``wheel-gpu.json``: ``wheel`` = ``{status, file, origin, requires, torch, torch_admitted, resolution:
  {status, would_install | message}, imported_from, quickstarts: [{quickstart, first_line, status, reason?,
  seconds?, output?}], remote_code: {status, reason?, output?}}``.

Published runs carry ``published`` (``{name, run, title}``) and are named ``<file>-<run>.json``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

OUTCOMES = ("passed", "failed", "errors", "skipped")


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]``; ``KeyError`` naming the file's other sections when it is a results file of the other
    stage."""
    if key not in data:
        raise KeyError(f"a gpu_check results file without {key!r} (it holds "
                       f"{sorted(k for k in data if k != 'kind')})")
    return data[key]


def _dry_run_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """A row saying the file comes from a dry run on CPU, when it does (never published)."""
    return ([("dry run", "yes: on CPU (`scripts/gpu_check.sh --dry-run`); the steps ran, no GPU measured")]
            if data.get("dry_run") else [])


def environment(data: dict[str, Any]) -> str:
    """A table (setting | value) of the GPU, its driver, the measured bf16 matrix-product speed and the
    versions of the packages the check used."""
    env = _section(data, "environment")
    gpu = env["gpu"]
    rows = _dry_run_rows(data)
    if gpu.get("available"):
        rows += [("device", f"{gpu['count']} × {gpu['name']}"),
                 ("compute capability", str(gpu["capability"])),
                 ("memory", f"{gpu['memory_gib']} GiB"), ("multiprocessors", str(gpu["multiprocessors"])),
                 ("CUDA", str(gpu["cuda"])), ("cuDNN", str(gpu["cudnn"]))]
    else:
        rows.append(("device", "no CUDA device"))
    if env.get("matmul_tflops"):
        rows.append(("bf16 8192 × 8192 × 8192 matrix product", f"{env['matmul_tflops']:.0f} TFLOP/s"))
    smi = env.get("nvidia_smi") or {}
    rows.append(("`nvidia-smi`", smi["query"] if smi.get("query") else smi.get("error", "not run")))
    rows.append(("Python", f"`{env['python']}`"))
    rows += [(f"package {name}", version or "not installed") for name, version in env["packages"].items()]
    rows.append(("wheels installed before the run",
                 ", ".join(env.get("wheels") or []) or "none (the machine's own packages)"))
    return settings_table(rows) + f"\n\n{source_line(data)}"


def _counts(counts: dict[str, int]) -> list[str]:
    return [str(counts.get(outcome, 0)) for outcome in OUTCOMES]


def tests(data: dict[str, Any]) -> str:
    """Tables of the CUDA test selection: its outcome (status, exit, duration, counts, command), counts per
    file, the run's notes, every failure with its message, and the skips grouped by reason."""
    run = _section(data, "tests")
    exit = "stopped at its time budget" if run["exit_code"] is None else ("pytest exit status "
                                                                          f"{run['exit_code']}")
    summary = [*_dry_run_rows(data), ("status", f"**{run['status']}**"), ("exit", exit),
               ("duration", f"{run['duration_s']:.0f} s"),
               *[(outcome, str(run["counts"].get(outcome, 0))) for outcome in OUTCOMES],
               ("command", f"`{run['command']}`")]
    parts = [settings_table(summary)]
    rows = [[f"`{name}`", *_counts(counts)] for name, counts in run["files"].items()]
    if rows:
        parts.append(markdown_table(["file", *OUTCOMES], rows, ["---", *["---:"] * len(OUTCOMES)]))
    if run.get("notes"):
        parts.append(markdown_table(["note"], [[note] for note in run["notes"]]))
    if run.get("failures"):
        parts.append(markdown_table(["failed test", "message"],
                                    [[f"`{f['test']}`", f["message"]] for f in run["failures"]]))
    if run.get("skipped"):
        parts.append(markdown_table(["skipped for", "tests"],
                                    [[s["reason"], str(len(s["tests"]))] for s in run["skipped"]],
                                    ["---", "---:"]))
    parts.append(source_line(data))
    return "\n\n".join(parts)


def wheel(data: dict[str, Any]) -> str:
    """A table of the package as a user installs it on the machine's torch: the wheel, its requirements,
    pip's verdict, each README quickstart and the reload through remote code."""
    run = _section(data, "wheel")
    resolution = run["resolution"]
    verdict = ("accepted" + (f"; would install {', '.join(resolution['would_install'])}"
                             if resolution.get("would_install") else "")
               if resolution["status"] == "ok" else f"refused: {resolution.get('message', '')}")
    admitted = "admitted" if run["torch_admitted"] else "excluded"
    rows = [*_dry_run_rows(data), ("status", f"**{run['status']}**"),
            ("wheel", f"`{run['file']}` ({run['origin']})"),
            ("requires", ", ".join(f"`{r}`" for r in run["requires"])),
            ("this machine's torch", f"{run['torch']} ({admitted} by the requirements)"),
            ("`pip install --dry-run --no-index`", verdict),
            ("imported from", f"`{run.get('imported_from', '')}`")]
    for quickstart in run.get("quickstarts") or []:
        outcome = quickstart["status"] + (f": {quickstart['reason']}" if quickstart.get("reason") else "")
        took = f" ({quickstart['seconds']:.0f} s)" if quickstart.get("seconds") is not None else ""
        rows.append((f"README quickstart {quickstart['quickstart']}", outcome + took))
    remote = run.get("remote_code") or {}
    if remote:
        rows.append(("quickstart 1's model reloaded through its remote code alone",
                     remote["status"] + (f": {remote['reason']}" if remote.get("reason") else "")))
    return settings_table(rows) + f"\n\n{source_line(data)}"


__all__ = ["environment", "tests", "wheel"]
