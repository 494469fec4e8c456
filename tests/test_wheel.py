"""The wheel is the product: build it, install it (not editable) into clean virtual environments and use it
there.

``built_wheel`` builds the wheel from a copy of the sources (``pip wheel --no-deps --no-build-isolation``, so
the checkout is not touched). Two environments are cached under ``$HF_ATTN_VARIANTS_CACHE``
(tests/remote_code.py's ``cached_venv``), keyed by the hash of the lock and of the declared dependencies: one
gets the wheel with its core dependencies only, one the wheel with ``[train,plots]``, each resolved by pip
under the lock's versions (``-c locks/requirements.txt``, torch at the installed version), after the declared
packages were linked in from this environment (``wheel_python``). Later sessions
reinstall only the new wheel (``--no-deps --force-reinstall``), so a warm run costs seconds of installing.

- **The core** (``CORE_SCRIPT``): none of the extras' modules is there; ``import hf_attn_variants`` registers
  every family; a tiny causal LM of each family is built, saved, reloaded with ``trust_remote_code=True``
  (equal logits; the package is imported, so its registered class loads — tests/test_remote_code_*.py load
  without it) and generates; the pruning API prunes, saves and reloads; stock log-n runs on a tiny Llama;
  ``export`` writes the family's model card (package data); the bench notes are there (package data);
  ``hf-attn-variants --version`` is the wheel's version; a training tool stops with the one sentence naming
  ``pip install 'hf_attn_variants[train]'``.
- **With the tools** (``TOOLS_SCRIPT``): the README's Trainer block prints the output the README shows under
  it; a tiny ``pretrain`` → ``export`` → reload → ``prune``.

A file the code reads at run time that is left out of the wheel (pyproject's package-data) fails the core
check.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.remote_code import cached_venv

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "locks" / "requirements.txt"
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "src")
"""What building the wheel reads."""
EXTRA_MODULES = ("accelerate", "datasets", "peft", "torchdata", "matplotlib")
"""Modules of the extras, none of which the core environment may hold."""

pytestmark = pytest.mark.slow

CORE_SCRIPT = r"""
import importlib.util, json, subprocess, sys
from pathlib import Path
import torch
import hf_attn_variants
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

expected_version, extra_modules = sys.argv[1], sys.argv[2].split(",")
assert "site-packages" in hf_attn_variants.__file__, hf_attn_variants.__file__  # the wheel, not the sources
present = [name for name in extra_modules if importlib.util.find_spec(name) is not None]
assert not present, f"the core install holds modules of the extras: {present}"
assert hf_attn_variants.__version__ == expected_version

ids = torch.tensor([[5, 9, 14, 3, 22, 17, 8, 30]])
small = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, max_position_embeddings=64)
for family in ("entropy_invariant", "gau", "synthesizer"):
    heads = {} if family == "gau" else dict(num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **small, **heads)).eval()
    model.save_pretrained(f"core/{family}")
    reloaded = AutoModelForCausalLM.from_pretrained(f"core/{family}", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
    assert reloaded.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 11)

from hf_attn_variants.pruning import compute_head_importance, count_heads, load_pruned, prune_heads
torch.manual_seed(0)
config = AutoConfig.for_model("entropy_invariant", **small, num_attention_heads=4, intermediate_size=64)
model = AutoModelForCausalLM.from_config(config)
importance = compute_head_importance(model, [{"input_ids": ids, "labels": ids}])
assert tuple(importance.shape) == (2, 4)
prune_heads(model, {0: [0, 1], 1: [3]})
model.save_pretrained("core/pruned")
assert count_heads(load_pruned("core/pruned"))[0] == 5

torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8)
                 ).save_pretrained("core/llama")
plain = AutoModelForCausalLM.from_pretrained("core/llama")
scaled = AutoModelForCausalLM.from_pretrained("core/llama", attn_implementation="entropy_invariant")
long_ids = torch.arange(32).unsqueeze(0) % 40
with torch.no_grad():
    difference = (plain(long_ids).logits - scaled(long_ids).logits).abs().amax(-1)[0]
assert difference[:8].max() < 1e-5 < difference[8:].min()

from importlib import resources
assert "{{compile_times}}" in resources.files("hf_attn_variants.bench").joinpath("notes.md").read_text()
from hf_attn_variants.training.corpus import embedded_tokenizer  # the default tokenizer needs no extra
from hf_attn_variants_cli import main
tokenizer = embedded_tokenizer()
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.for_model("gau", vocab_size=len(tokenizer), hidden_size=32,
                                                      num_hidden_layers=1)).save_pretrained("core/gau-export")
tokenizer.save_pretrained("core/gau-export")
assert main(["export", "--model_name_or_path", "core/gau-export", "--output_dir", "core/gau-hub"]) == 0
card = Path("core/gau-hub/README.md").read_text()
assert "A **GAU** (Gated Attention Unit" in card, card[:500]  # the family's template, not the generic one

version = subprocess.run(["hf-attn-variants", "--version"], capture_output=True, text=True, check=True).stdout
assert version.strip() == f"hf-attn-variants {expected_version}", version
tool = subprocess.run(["hf-attn-variants", "pretrain", "--output_dir", "core/never"], capture_output=True,
                      text=True)
assert tool.returncode == 1 and tool.stderr.count("\n") == 1, tool.stderr
assert tool.stderr.rstrip().endswith("pip install 'hf_attn_variants[train]'"), tool.stderr
print("core ok")
"""

TOOLS_SCRIPT = r"""
import contextlib, io, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from hf_attn_variants_cli import main

block, shown = Path(sys.argv[1]).read_text(), Path(sys.argv[2]).read_text()
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
assert printed.getvalue() == shown, (printed.getvalue(), shown)

tiny = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=64"
assert main(["pretrain", "--model_type", "entropy_invariant", "--objective", "clm", "--config_overrides",
             tiny, "--output_dir", "tools/pretrained", "--max_seq_length", "32", "--max_train_steps", "2",
             "--per_device_train_batch_size", "4", "--max_train_samples", "16", "--max_eval_samples", "8",
             "--disable_tqdm"]) == 0
assert main(["export", "--model_name_or_path", "tools/pretrained", "--output_dir", "tools/hub"]) == 0
model = AutoModelForCausalLM.from_pretrained("tools/hub", trust_remote_code=True)
assert (Path("tools/hub") / "modeling_entropy_invariant.py").is_file()
assert model.config.model_type == "entropy_invariant"
Path("tools/text.txt").write_text("\n".join(f"the value of item {i} is {i * 7 % 13} in the table"
                                            for i in range(24)))
assert main(["prune", "--model_name_or_path", "tools/hub", "--train_file", "tools/text.txt", "--output_dir",
             "tools/pruned", "--threshold", "none", "--max_heads_pruned", "0.25", "--fraction", "0.25",
             "--batch_size", "8", "--num_importance_examples", "8"]) == 0
from hf_attn_variants.pruning import count_heads, load_pruned
assert count_heads(load_pruned("tools/pruned/model"))[0] == 6
print("tools ok")
"""


def project_table() -> dict:
    """pyproject.toml's ``[project]`` table."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def dependency_key(extras: str) -> str:
    """What decides an environment's contents: the lock, the declared dependencies, torch's version, the
    extras."""
    project = project_table()
    declared = json.dumps([project["dependencies"], project["optional-dependencies"]], sort_keys=True)
    text = "\n".join([LOCK.read_text(encoding="utf-8"), declared, importlib.metadata.version("torch"),
                      extras])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_wheel(folder: Path) -> Path:
    """The wheel of a copy of the sources in ``folder`` (the checkout itself gets no build/ or egg-info)."""
    tree = folder / "tree"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            tree.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w",
                    str(folder / "dist"), str(tree)], check=True, capture_output=True, text=True)
    (wheel,) = (folder / "dist").glob("hf_attn_variants-*.whl")
    return wheel


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def declared_names(extras: str) -> tuple[str, ...]:
    """The names of the packages pyproject.toml declares for the core and ``extras`` (comma-separated)."""
    project = project_table()
    optional = project["optional-dependencies"]
    chosen = [line for extra in filter(None, extras.split(",")) for line in optional[extra]]
    return tuple(Requirement(line).name for line in [*project["dependencies"], *chosen])


def wheel_python(wheel: Path, extras: str) -> Path:
    """The Python of the cached environment for ``extras`` ("" = the core), holding ``wheel`` (installed
    now). The declared packages are linked in from here with their dependencies (this environment holds the
    lock; ``seed_distributions``), then pip resolves the wheel's requirements under the lock and installs what
    is missing."""
    torch_version = importlib.metadata.version("torch").split("+")[0]
    requirement = f"{wheel}[{extras}]" if extras else str(wheel)
    python_tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    name = f"wheel-{extras.replace(',', '-') or 'core'}-{dependency_key(extras)}-{python_tag}"
    python = cached_venv(name,
                         lambda pip: pip("install", "--quiet", "-c", str(LOCK), f"torch=={torch_version}",
                                         requirement),
                         seed=declared_names(extras))
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    str(wheel)],
                   check=True, capture_output=True, text=True, env=clean_environment(python))
    return python


def clean_environment(python: Path) -> dict[str, str]:
    """This process's environment without its virtual environment and source paths; the Hub offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1",
               PYTHONNOUSERSITE="1",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    return env


def run_script(python: Path, script: str, folder: Path, *args: str) -> str:
    """Run ``script`` with ``python`` in ``folder`` (away from the checkout, so nothing imports the
    sources)."""
    result = subprocess.run([str(python), "-c", script, *args], check=False, cwd=folder, capture_output=True,
                            text=True,
                            env=clean_environment(python), timeout=600)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-5000:]}"
    return result.stdout


def readme_trainer_block() -> tuple[str, str]:
    """The README's first python block (train a family with Trainer) and the output shown under it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(?P<code>.*?)```\s*<!-- output -->\n```text\n(?P<out>.*?)```", text,
                      re.DOTALL)
    assert match and "Trainer" in match["code"], "README.md: no Trainer block with its output"
    return match["code"], match["out"]


def test_wheel_holds_the_runtime_files(built_wheel: Path) -> None:
    """The files the code reads at run time are in the wheel, next to the license and the console script."""
    import zipfile

    names = set(zipfile.ZipFile(built_wheel).namelist())
    for required in ("hf_attn_variants/bench/notes.md", "hf_attn_variants_cli.py",
                     *(f"hf_attn_variants/hub/model_cards/{family}.md" for family in
                       ("entropy_invariant", "gau", "synthesizer"))):
        assert required in names, required
    assert any(name.endswith("licenses/LICENSE") for name in names)
    # the maintainers' tools (the docs renderer, the publishing code) stay in the repository
    assert not [name for name in names if name.startswith(("hf_attn_variants/results/", "tools/"))]
    assert "hf_attn_variants/records.py" in names  # what bench and lengthgen record with their results


def test_core_install_runs_the_models_pruning_and_stock_log_n(built_wheel: Path, tmp_path: Path) -> None:
    from hf_attn_variants.models.version import __version__

    python = wheel_python(built_wheel, "")
    assert "core ok" in run_script(python, CORE_SCRIPT, tmp_path, __version__, ",".join(EXTRA_MODULES))


def test_tools_install_runs_the_readme_block_and_pretrain_export_prune(built_wheel: Path,
                                                                       tmp_path: Path) -> None:
    code, shown = readme_trainer_block()
    (tmp_path / "block.py").write_text(code)
    (tmp_path / "shown.txt").write_text(shown)
    python = wheel_python(built_wheel, "train,plots")
    assert "tools ok" in run_script(python, TOOLS_SCRIPT, tmp_path, str(tmp_path / "block.py"),
                                    str(tmp_path / "shown.txt"))
