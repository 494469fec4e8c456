"""Views of the GPU check's own results files (kind ``gpu_check``), written by ``scripts/gpu_check.sh`` on a
machine with a CUDA GPU and published into ``docs/results/`` by ``python scripts/gpu_check.py publish DIR``;
docs/benchmarks-gpu.md shows them next to the GPU benchmark (``benchmarks-gpu.json``, kind ``bench``) and
decoding table (``decoding-gpu.json``, kind ``decoding``) of the same run.

Data (besides the provenance fields): ``dry_run`` (a CPU rehearsal, never published), and

- ``environment-gpu.json``: ``environment`` = ``{gpu: {available, name, count, capability, memory_gib,
  multiprocessors, cuda, cudnn, bf16}, nvidia_smi: {query | error}, matmul_tflops, packages: {name: version |
  None}, wheels: [file names], python, triton_interpret}``;
- ``tests-gpu.json``: ``tests`` = ``{status, exit_code, duration_s, command, selection, notes, counts:
  {passed, failed, skipped, errors}, files: {file: counts}, failures: [{test, message}], skipped: [{reason,
  tests}]}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line

OUTCOMES = ("passed", "failed", "errors", "skipped")


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]``; ``KeyError`` naming the file's other sections when it is a results file of the other
    stage."""
    if key not in data:
        raise KeyError(f"a gpu_check results file without {key!r} (it holds "
                       f"{sorted(k for k in data if k != 'kind')})")
    return data[key]


def _dry_run_note(data: dict[str, Any]) -> str:
    return ("> A dry run on CPU (`scripts/gpu_check.sh --dry-run`): it shows that the steps run, not what a "
            "GPU measures.\n\n" if data.get("dry_run") else "")


def environment(data: dict[str, Any]) -> str:
    """The GPU, its driver, the measured bf16 matrix-product speed and the versions of the packages the check
    used."""
    env = _section(data, "environment")
    gpu = env["gpu"]
    if gpu.get("available"):
        device = (f"{gpu['count']} × {gpu['name']} (compute capability {gpu['capability']}, "
                  f"{gpu['memory_gib']} GiB, {gpu['multiprocessors']} multiprocessors), CUDA {gpu['cuda']}, "
                  f"cuDNN {gpu['cudnn']}")
    else:
        device = "no CUDA device"
    smi = env.get("nvidia_smi") or {}
    driver = f"`nvidia-smi`: {smi['query']}" if smi.get("query") else ("`nvidia-smi`: "
                                                                       f"{smi.get('error', 'not run')}")
    matmul = (f"; a bf16 8192 × 8192 × 8192 matrix product ran at {env['matmul_tflops']:.0f} TFLOP/s"
              if env.get("matmul_tflops") else "")
    packages = ", ".join(f"{name} {version}" if version else f"{name} (not installed)"
                         for name, version in env["packages"].items())
    wheels = ", ".join(env.get("wheels") or []) or "none (the machine's own packages)"
    lines = [
        f"- Device: {device}{matmul}.",
        f"- {driver}.",
        f"- Python `{env['python']}`; packages: {packages}.",
        f"- Wheels brought along and installed before the run: {wheels}.",
    ]
    return _dry_run_note(data) + "\n".join(lines) + f"\n\n{source_line(data)}"


def _counts(counts: dict[str, int]) -> list[str]:
    return [str(counts.get(outcome, 0)) for outcome in OUTCOMES]


def tests(data: dict[str, Any]) -> str:
    """The CUDA test selection: status, counts per file, every failure with its message, skips grouped by
    reason."""
    run = _section(data, "tests")
    exit = "stopped at its time budget" if run["exit_code"] is None else ("pytest exit status "
                                                                          f"{run['exit_code']}")
    summary = (f"**{run['status']}** ({exit}) in {run['duration_s']:.0f} s: "
               + ", ".join(f"{run['counts'].get(outcome, 0)} {outcome}" for outcome in OUTCOMES) + ".")
    rows = [[f"`{name}`", *_counts(counts)] for name, counts in run["files"].items()]
    parts = [_dry_run_note(data) + summary, f"Command: `{run['command']}`."]
    if rows:
        parts.append(markdown_table(["file", *OUTCOMES], rows, ["---", *["---:"] * len(OUTCOMES)]))
    if run.get("notes"):
        parts.append("\n".join(f"- {note}" for note in run["notes"]))
    if run.get("failures"):
        parts.append("Failures:\n\n" + "\n".join(f"- `{f['test']}`: {f['message']}" for f in run["failures"]))
    if run.get("skipped"):
        parts.append("Skipped:\n\n" + "\n".join(f"- {len(s['tests'])} × {s['reason']}"
                                                for s in run["skipped"]))
    parts.append(source_line(data))
    return "\n\n".join(parts)


__all__ = ["environment", "tests"]
