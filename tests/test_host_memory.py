"""Host memory at long n (issue 38): the commands that train or measure keep freed blocks in their process.

``keep_freed_memory`` changes glibc's allocator (``mallopt``), so it runs in a subprocess here; the console
entry point calls it for the training and measuring subcommands only, and ``main`` called from Python never
does.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

import hf_attn_variants_cli
from hf_attn_variants.host_memory import OPT_OUT

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
CHANGE = "from hf_attn_variants.host_memory import keep_freed_memory; print(keep_freed_memory())"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's (Linux)")
def test_keep_freed_memory_changes_the_allocator_unless_turned_off() -> None:
    on = subprocess.run([sys.executable, "-c", CHANGE], capture_output=True, text=True, check=True)
    off = subprocess.run([sys.executable, "-c", CHANGE], capture_output=True, text=True, check=True,
                         env={**os.environ, OPT_OUT: "0"})
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


@pytest.mark.parametrize(("command", "kept"), [("pretrain", True), ("bench", True), ("lengthgen", True),
                                               ("export", False), ("prune", False)])
def test_the_console_keeps_freed_memory_for_the_commands_that_train_or_measure(command, kept,
                                                                               monkeypatch) -> None:
    import hf_attn_variants.host_memory as host_memory

    calls: list[str] = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append("kept") or True)
    monkeypatch.setattr(hf_attn_variants_cli, "main", lambda argv: 0)
    monkeypatch.setattr(sys, "argv", ["hf-attn-variants", command, "--help"])
    assert hf_attn_variants_cli.console() == 0
    assert calls == (["kept"] if kept else [])
