"""The console entry point: ``--help`` and ``--version`` without torch, the package import still registering
the families, and a tool run without its extra stopping with one sentence naming the pip command.

The extras are made "missing" in-process with ``sys.modules[name] = None`` (then ``import name`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` returns None, as for a module that is not
installed); tests/test_wheel.py checks the same sentence in a virtual environment that really lacks them.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import hf_attn_variants_cli
from hf_attn_variants_cli import EXTRAS, SUBCOMMANDS, Subcommand, extra_of, main, missing_extras

NO_TORCH = """
import sys
import hf_attn_variants_cli
for argv in (["--help"], ["--version"]):
    try:
        hf_attn_variants_cli.main(argv)
    except SystemExit as stop:
        assert stop.code == 0, stop.code
heavy = sorted(name for name in ("torch", "transformers", "hf_attn_variants") if name in sys.modules)
print("imported:", heavy)
"""


def test_help_and_version_import_neither_torch_nor_the_package() -> None:
    result = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=60,
                            check=True)
    assert "usage: hf-attn-variants" in result.stdout and "imported: []" in result.stdout, result.stdout


def test_version_is_the_package_version(capsys) -> None:
    from hf_attn_variants.models.version import __version__

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"hf-attn-variants {__version__}"


def test_help_lists_the_user_commands_and_no_maintainer_command(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in SUBCOMMANDS) and "render-docs" not in text and "--version" in text


def test_importing_the_package_registers_every_family() -> None:
    """``import hf_attn_variants`` (and only that) makes every family an Auto class, in a fresh
    interpreter."""
    # the default configs' models (67M-146M parameters) on the meta device: the classes without 12 s of init
    code = ("import torch\nimport hf_attn_variants\n"
            "from transformers import AutoConfig, AutoModelForCausalLM\n"
            "for t in ('entropy_invariant', 'gau', 'synthesizer'):\n"
            "    config = AutoConfig.for_model(t)\n"
            "    with torch.device('meta'):\n"
            "        model = AutoModelForCausalLM.from_config(config)\n"
            "    print(t, type(config).__name__, model.__class__.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=True)
    assert result.stdout.split("\n")[:3] == [
        "entropy_invariant EntropyInvariantConfig EntropyInvariantForCausalLM",
        "gau GAUConfig GAUForCausalLM",
        "synthesizer SynthesizerConfig SynthesizerForCausalLM",
    ]


def test_python_m_package_runs_the_same_main() -> None:
    from hf_attn_variants import __main__ as package_main
    from hf_attn_variants.cli import main as package_cli_main

    assert package_main.main is main and package_cli_main is main


def block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` look not installed for the rest of the test."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("command", [name for name, sub in SUBCOMMANDS.items() if "train" in sub.extras])
def test_a_tool_without_the_train_extra_stops_with_one_sentence(command, monkeypatch, capsys) -> None:
    block(monkeypatch, "datasets", "peft")
    assert main([command, "--output_dir", "never-written"]) == 1
    err = capsys.readouterr().err
    assert (err.count("\n") == 1
            and err.startswith(f"hf-attn-variants {command}: error: datasets, peft are not installed"))
    assert err.rstrip().endswith("pip install 'hf_attn_variants[train]'"), err


def test_plots_need_the_plots_extra_unless_switched_off(monkeypatch, capsys) -> None:
    block(monkeypatch, "matplotlib")
    assert main(["prune", "--output_dir", "never-written"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.rstrip().endswith(
        "matplotlib is not installed; install what this command needs with: pip install "
        "'hf_attn_variants[plots]'"), err
    assert missing_extras("lengthgen", ["--no_plot"]) == {} and missing_extras("bench", ["--no-plots"]) == {}
    assert missing_extras("lengthgen", []) == {"plots": ["matplotlib"]}


def test_both_extras_in_one_command(monkeypatch, capsys) -> None:
    block(monkeypatch, "accelerate", "matplotlib")
    assert main(["lengthgen", "--output_dir", "never-written"]) == 1
    assert "pip install 'hf_attn_variants[train,plots]'" in capsys.readouterr().err


def test_an_extra_module_missing_inside_a_run_gets_the_same_sentence(monkeypatch, capsys) -> None:
    """A module of an extra imported deep inside a run (not in the subcommand's table) still ends in the
    sentence; any other missing module keeps its traceback."""
    tool = types.ModuleType("fake_tool")
    tool.add_arguments = lambda parser: None

    def run(args):
        raise ModuleNotFoundError("No module named 'torchdata'", name="torchdata.stateful_dataloader")

    tool.run = run
    monkeypatch.setitem(sys.modules, "fake_tool", tool)
    monkeypatch.setitem(hf_attn_variants_cli.SUBCOMMANDS, "fake", Subcommand("fake_tool", "A fake tool."))
    assert main(["fake"]) == 1
    assert capsys.readouterr().err.strip() == ("hf-attn-variants fake: error: torchdata is not installed; "
                                               "install what this command needs with: pip install "
                                               "'hf_attn_variants[train]'")

    def other(args):
        raise ModuleNotFoundError("No module named 'nonexistent'", name="nonexistent")

    tool.run = other
    with pytest.raises(ModuleNotFoundError):
        main(["fake"])


def test_extras_match_pyproject() -> None:
    """``EXTRAS`` names the modules of the extras that pyproject.toml declares."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {requirement.split(">")[0].split("=")[0].split(";")[0].strip()
                 for requirement in declared[extra]}
        assert names == set(modules), extra
    assert extra_of("datasets.utils") == "train" and extra_of("json") is None
    assert sorted(r.split(">")[0] for r in project["dependencies"]) == ["huggingface_hub", "safetensors",
                                                                          "torch", "transformers"]


HELP_WITHOUT_EXTRAS = """
import contextlib, io, json, sys
from hf_attn_variants_cli import EXTRAS, SUBCOMMANDS, main
for modules in EXTRAS.values():  # the core install: no module of any extra
    for name in modules:
        sys.modules[name] = None
answers = {}
for name in SUBCOMMANDS:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([name, "--help"])
        except SystemExit as stop:
            code = stop.code
    answers[name] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(answers))
"""


def test_every_subcommand_help_answers_with_the_core_install_alone() -> None:
    """Issue 51: ``prune --help`` used to end in the missing-extras error. Without any extra, every
    subcommand prints its flags (exit 0) and, for a command that needs extras, says which after them; running
    it still stops with the one install sentence."""
    import json

    result = subprocess.run([sys.executable, "-c", HELP_WITHOUT_EXTRAS], capture_output=True, text=True,
                            timeout=300, check=True)
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(answers) == set(SUBCOMMANDS)
    for name, answer in answers.items():
        assert answer["code"] == 0 and f"usage: hf-attn-variants {name}" in answer["out"], (name, answer)
        assert "--" in answer["out"] and "Traceback" not in answer["err"], (name, answer)
        if SUBCOMMANDS[name].extras:
            text = " ".join(answer["out"].split())
            assert "not installed here: pip install 'hf_attn_variants[" in text, name


def test_ctrl_c_while_the_console_imports_torch_is_one_line_and_status_130(monkeypatch, capsys) -> None:
    """A Ctrl-C during the start of a training command (setting the host allocator imports torch) used to
    print a 45-line traceback: it is the interrupted line, exit status 130."""
    from hf_attn_variants import host_memory

    def stopped() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(host_memory, "keep_freed_memory", stopped)
    monkeypatch.setattr(sys, "argv", ["hf-attn-variants", "bench", "--quick"])
    assert hf_attn_variants_cli.console() == hf_attn_variants_cli.INTERRUPTED_EXIT_CODE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf-attn-variants bench: interrupted: "), err
