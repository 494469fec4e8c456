"""Host memory for long sequences on a CPU: keep what a training step frees for the next step.

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
hands it back to the kernel at ``free``. A step at long n allocates many such blocks (activations of n × width
floats), so every step page-faults all of them in again: the time per token of an O(n) model then grows with n
— FLASH's fwd+bwd per token rose 1.6× from 8k to 32k tokens on one CPU thread, flat again with the blocks kept
(docs/gau.md, "Flat to 128k"). ``keep_freed_memory`` tells glibc to serve large blocks from its heap and keep
freed memory there (``mallopt(3)``: ``M_MMAP_MAX`` = 0, ``M_TRIM_THRESHOLD`` at its maximum), which is what
``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647`` in the environment does for any Python process.

The command line calls it for the commands that train or measure (``pretrain``, ``finetune``, ``lengthgen``,
``bench``): a process of its own, whose peak memory recurs every step anyway. A library import never changes
the allocator; call it in a script of your own, or set the variables. ``HF_ATTN_VARIANTS_KEEP_FREED_MEMORY=0``
leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_MAX = 2**31 - 1
"""``mallopt`` takes an ``int``: the largest trim threshold it accepts (2 GiB of free heap kept)."""
OPT_OUT = "HF_ATTN_VARIANTS_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Serve large blocks from glibc's heap and keep freed memory in the process (see the module docstring).
    Returns whether the allocator was changed: ``False`` off Linux/glibc, when ``mallopt`` refuses, or when
    ``HF_ATTN_VARIANTS_KEEP_FREED_MEMORY=0``."""
    if (os.environ.get(OPT_OUT, "1") == "0" or platform.system() != "Linux"
            or platform.libc_ver()[0] != "glibc"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_MAX))


__all__ = ["OPT_OUT", "keep_freed_memory"]
