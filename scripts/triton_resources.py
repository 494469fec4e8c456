"""What each Triton kernel of GAU costs an NVIDIA GPU, found without one: registers, spilled bytes, shared
memory and tensor-core instructions per kernel, written to ``docs/results/triton-resources-<triton>.json``
(Triton's major.minor version: ``3.9`` is the lock's, ``3.6`` the GPU image's).

Triton's own compiler builds each kernel for a ``GPUTarget`` (``triton.compile`` on an ``ASTSource``, as
Triton's ahead-of-time tool ``triton/tools/compile.py`` does), with the compile-time switches and launch
options its launch passes (``gau_triton.flash_launch_options`` and ``relu2_launch_options``), so no GPU and no
CUDA driver is needed. ``cuobjdump -res-usage`` (bundled with Triton) reads registers and stack bytes (the
spills) from the cubin; the PTX gives the tensor-core instructions (``wgmma.mma_async`` on sm_90,
``mma.sync``); Triton's metadata gives the shared memory, checked against the target's limit per block.

Targets: sm_90 (H100, H200) and sm_80 (A100). Shapes: key size 128, value width 1,024 and chunk 256 (the GPU
side-by-side's); every integer argument is then a multiple of 16, which Triton's launcher specialises on, and
so does this compile. Variants: causal without a key mask (causal-LM training) and bidirectional with one (a
padded masked-LM batch); quadratic relu²: causal, and bidirectional with a dense mask. Every kernel in bf16;
FLASH's causal kernels also in float32 (IEEE products: what ``gau_kernel="triton"`` runs for a float32
model, and the CUDA tests' exact comparisons); FLASH's causal kernels that read the states or their gradients
also in float16 (``SCALED``: a state tile past 2¹⁵ divided by a power of two, ``gau_triton.state_scales``).

Exit status 1 when a bf16 or fp16 kernel spills, uses no tensor core, or any kernel exceeds its target's
shared memory; 2 when nothing can be compiled here (no triton, or ``TRITON_INTERPRET`` set).

Usage (from the repository root; about 30 s on 2 cores), with the lock's Triton and then with the GPU
image's::

    .venv/bin/python scripts/triton_resources.py
    .venv/bin/python -m pip install --target /tmp/triton-3.6 --no-deps triton==3.6.0
    PYTHONPATH=/tmp/triton-3.6 .venv/bin/python scripts/triton_resources.py
    .venv/bin/python tools/render_docs.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hf_attn_variants.models import gau_triton


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import format_results  # noqa: E402
from tools.docs_results._common import run_metadata  # noqa: E402
from scripts.script_paths import output_file_problem  # noqa: E402


RESULTS = REPO / "docs" / "results"
SOURCE = Path(gau_triton.__file__)
TARGETS: dict[str, dict[str, Any]] = {
    "sm_90": {"arch": 90, "gpus": "H100, H200", "shared_limit": 232_448},
    "sm_80": {"arch": 80, "gpus": "A100", "shared_limit": 166_912},
}
"""Each target's compute capability, its GPUs and its most shared memory per block (227 KiB, 163 KiB)."""
SHAPE = {"key_size": 128, "width": 1024, "chunk_size": 256}
"""The shape every kernel is compiled for: the GPU side-by-side's."""
DTYPES = ("bfloat16", "float32", "float16")
"""Every kernel is compiled in bf16; FLASH's causal kernels also in float32, and those that read the states
(``SCALED``) in float16."""
SCALED_KERNELS = ("_flash_forward_kernel", "_flash_backward_query_kernel", "_flash_backward_key_kernel")
"""The kernels whose float16 launch differs from bf16's: they scale the states or their gradients
(``SCALED``)."""
POINTERS: dict[str, dict[str, str]] = {
    "_chunk_outer_kernel": {"A": "model", "X": "model", "OUT": "fp32"},
    "_flash_forward_kernel": {"Q": "model", "K": "model", "QL": "model", "V": "model", "H": "fp32",
                              "KM": "i8", "OUT": "model"},
    "_flash_backward_query_kernel": {"Q": "model", "K": "model", "V": "model", "H": "fp32", "KM": "i8",
                                     "DO": "model", "DQ": "fp32", "DQL": "fp32"},
    "_flash_backward_key_kernel": {"Q": "model", "K": "model", "KL": "model", "V": "model", "DSUM": "fp32",
                                   "DSCALE": "fp32", "KM": "i8", "DO": "model", "DK": "fp32", "DKL": "fp32",
                                   "DV": "model"},
    "_forward_kernel": {"Q": "model", "K": "model", "V": "model", "M": "i8", "KM": "i8", "OUT": "model"},
    "_grad_query_kernel": {"Q": "model", "K": "model", "V": "model", "M": "i8", "KM": "i8", "DO": "model",
                           "DQ": "model"},
    "_grad_key_kernel": {"Q": "model", "K": "model", "V": "model", "M": "i8", "KM": "i8", "DO": "model",
                         "DK": "model"},
    "_grad_value_kernel": {"Q": "model", "K": "model", "M": "i8", "KM": "i8", "DO": "model", "DV": "model"},
}
"""The element type of every pointer argument of each kernel: the model's dtype, float32 or int8."""
FLASH_KERNELS = {"_chunk_outer_kernel": "chunk_outer", "_flash_forward_kernel": "forward",
                 "_flash_backward_query_kernel": "backward_query",
                 "_flash_backward_key_kernel": "backward_key"}
VARIANTS = {
    "flash": {"causal": {"CAUSAL": True, "HAS_KEY_MASK": False},
              "bidirectional, key mask": {"CAUSAL": False, "HAS_KEY_MASK": True}},
    "relu2": {"causal": {"CAUSAL": True, "HAS_MASK": False},
              "bidirectional, dense mask": {"CAUSAL": False, "HAS_MASK": True}},
}
TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp32": "fp32", "i8": "i8"}


def kernel_options(kernel: str, variant: str, dtype_name: str) -> dict[str, Any]:
    """The ``tl.constexpr`` arguments and launch options ``kernel`` is launched with at ``SHAPE``."""
    dtype = getattr(torch, dtype_name)
    if kernel in FLASH_KERNELS:
        options = gau_triton.flash_launch_options(FLASH_KERNELS[kernel], dtype, SHAPE["key_size"],
                                                  SHAPE["width"], SHAPE["chunk_size"])
        switches = {} if kernel == "_chunk_outer_kernel" else VARIANTS["flash"][variant]
        return {**options, **switches}
    relu2 = VARIANTS["relu2"][variant]
    return gau_triton.relu2_launch_options(dtype, SHAPE["key_size"], has_mask=relu2["HAS_MASK"],
                                           has_key_mask=False, causal=relu2["CAUSAL"])


def kernel_source(kernel: str, variant: str, dtype_name: str) -> Any:
    """The ``triton.compiler.ASTSource`` of ``kernel`` with its launch's constants and argument types."""
    import triton.compiler

    function = getattr(gau_triton, kernel)
    options = kernel_options(kernel, variant, dtype_name)
    signature, attrs, constants = {}, {}, {}
    for index, name in enumerate(function.arg_names):
        if name in options:
            signature[name], constants[name] = "constexpr", options[name]
            continue
        pointer = POINTERS[kernel].get(name)
        element = dtype_name if pointer == "model" else pointer
        signature[name] = f"*{TRITON_TYPES[element]}" if pointer else "i32"
        attrs[(index,)] = [["tt.divisibility", 16]]  # 16-byte aligned pointers, integers multiples of 16
    return triton.compiler.ASTSource(function, signature, constants, attrs)


def cuobjdump() -> Path:
    """Triton's bundled ``cuobjdump``."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_kernel(kernel: str, variant: str, target: str, dtype_name: str, scratch: Path) -> dict[str, Any]:
    """Compile ``kernel`` for ``target`` and read what it costs.

    Args:
        kernel (str): a kernel's name in ``gau_triton`` (a key of ``POINTERS``).
        variant (str): a key of ``VARIANTS["flash"]`` or ``VARIANTS["relu2"]``.
        target (str): a key of ``TARGETS``.
        dtype_name (str): the model dtype, one of ``DTYPES``.
        scratch (Path): a folder for the cubin that ``cuobjdump`` reads.

    Returns:
        dict[str, Any]: the row: kernel, variant, target, warps, stages, block sizes, registers, spilled
        (stack) bytes, shared bytes and limit, tensor-core instructions, and the seconds the compile took
        (with an empty cache: ``main`` points Triton's cache at a new folder).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    options = kernel_options(kernel, variant, dtype_name)
    start = time.perf_counter()
    compiled = triton.compile(kernel_source(kernel, variant, dtype_name),
                              target=GPUTarget("cuda", TARGETS[target]["arch"], 32),
                              options={key: options[key] for key in ("num_warps", "num_stages")})
    seconds = time.perf_counter() - start
    cubin = scratch / f"{kernel}-{target}-{dtype_name}-{re.sub(r'[^a-z]+', '_', variant)}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([str(cuobjdump()), "-res-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no REG/STACK line for {kernel}: {usage!r}")
    ptx = compiled.asm["ptx"]
    return {"kernel": kernel, "variant": variant, "target": target, "dtype": dtype_name,
            "num_warps": options["num_warps"],
            "num_stages": options["num_stages"],
            "blocks": {k: v for k, v in options.items() if k.startswith("BLOCK")},
            "registers": int(found[1]), "spill_bytes": int(found[2]),
            "shared_bytes": compiled.metadata.shared, "shared_limit": TARGETS[target]["shared_limit"],
            "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
            "mma_sync": len(re.findall(r"\bmma\.sync", ptx)), "compile_s": round(seconds, 1)}


def problems(row: dict[str, Any]) -> list[str]:
    """What is wrong with a compiled kernel: too much shared memory (it would not launch); in bf16 and fp16
    also spills and no tensor core (float32's IEEE products have neither tensor cores nor the registers)."""
    found = []
    if row["shared_bytes"] > row["shared_limit"]:
        found.append(f"needs {row['shared_bytes']} bytes of shared memory, more than {row['shared_limit']}")
    if row["dtype"] == "float32":
        return found
    if row["spill_bytes"]:
        found.append(f"spills {row['spill_bytes']} bytes per thread")
    if not row["wgmma"] + row["mma_sync"]:
        found.append("uses no tensor-core instruction")
    return found


def ptxas_version() -> str:
    """The version line of Triton's bundled ``ptxas``."""
    output = subprocess.run([str(cuobjdump().with_name("ptxas")), "--version"], capture_output=True,
                            text=True, check=True).stdout
    found = re.search(r"release ([\d.]+)", output)
    return found[1] if found else output.strip().splitlines()[-1]


def results_path(triton_version: str) -> Path:
    """``docs/results/triton-resources-<major.minor>.json`` for that Triton version."""
    return RESULTS / f"triton-resources-{'.'.join(triton_version.split('.')[:2])}.json"


def jobs(kernels: list[str] | None = None, targets: list[str] | None = None,
         dtypes: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """Every (kernel, variant, target, dtype) to compile: all of them, or those of ``kernels`` on ``targets``
    in ``dtypes``."""
    found = []
    for dtype_name in dtypes or DTYPES:
        for target in targets or TARGETS:
            for kernel in kernels or POINTERS:
                family = "flash" if kernel in FLASH_KERNELS else "relu2"
                variants = ["causal"] if kernel == "_chunk_outer_kernel" else list(VARIANTS[family])
                if dtype_name == "float32":
                    variants = ["causal"] if family == "flash" else []
                if dtype_name == "float16":
                    variants = ["causal"] if kernel in SCALED_KERNELS else []
                found.extend((kernel, variant, target, dtype_name) for variant in variants)
    return found


def _compile_job(job: tuple[str, str, str, str, str]) -> dict[str, Any]:
    kernel, variant, target, dtype_name, scratch = job
    return compile_kernel(kernel, variant, target, dtype_name, Path(scratch))


def compile_all(todo: list[tuple[str, str, str, str]], scratch: Path, workers: int) -> list[dict[str, Any]]:
    """Compile every job (``jobs``), ``workers`` at a time, printing a line per kernel; the rows in order."""
    rows = []
    with ProcessPoolExecutor(workers) as pool:
        for row in pool.map(_compile_job, [(*job, str(scratch)) for job in todo]):
            rows.append(row)
            print(f"{row['target']} {row['dtype']} {row['kernel']} ({row['variant']}): "
                  f"{row['registers']} registers, {row['spill_bytes']} B spilled, "
                  f"{row['shared_bytes']} B shared, {row['wgmma'] + row['mma_sync']} tensor-core "
                  f"instructions, {row['compile_s']} s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the results file (default: docs/results/"
                        "triton-resources-<Triton's major.minor>.json)")
    parser.add_argument("--workers", type=int, default=2, help="compiles at a time (default 2)")
    parser.add_argument("--kernel", action="append", choices=list(POINTERS),
                        help="compile this kernel only (repeatable; default: every kernel)")
    parser.add_argument("--target", action="append", choices=list(TARGETS),
                        help="for this target only (repeatable; default: every target)")
    parser.add_argument("--dtype", action="append", choices=list(DTYPES),
                        help="in this dtype only (repeatable; default: both)")
    args = parser.parse_args(argv)
    problem = None if args.out is None else output_file_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("triton_resources: TRITON_INTERPRET is set, so Triton interprets the kernels instead of "
              "compiling them; run without it", file=sys.stderr)
        return 2
    if not gau_triton.TRITON_AVAILABLE:
        print("triton_resources: triton is not installed (pip install 'hf_attn_variants[gpu]')",
              file=sys.stderr)
        return 2
    import tempfile

    import triton

    metadata = run_metadata("triton_resources", ["scripts/triton_resources.py", *(argv or [])],
                            triton=triton.__version__, ptxas=ptxas_version())
    cache = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["TRITON_CACHE_DIR"] = scratch  # every compile from scratch: compile_s is the cold cost
        try:
            rows = compile_all(jobs(args.kernel, args.target, args.dtype), Path(scratch), args.workers)
        finally:
            os.environ.pop("TRITON_CACHE_DIR")
            if cache is not None:
                os.environ["TRITON_CACHE_DIR"] = cache
    data = {**metadata,
            "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
            "settings": {"shape": SHAPE, "dtypes": list(DTYPES), "targets": TARGETS, "variants": VARIANTS},
            "rows": rows}
    out = args.out or results_path(triton.__version__)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(format_results(data, inline_depth=2), encoding="utf-8")
    print(f"wrote {out}")
    failed = [f"{r['target']} {r['dtype']} {r['kernel']} ({r['variant']}): {', '.join(problems(r))}"
              for r in rows if problems(r)]
    for line in failed:
        print(f"triton_resources: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
