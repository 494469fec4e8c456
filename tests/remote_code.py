"""Load exported folders with ``trust_remote_code=True`` in an environment without this package.

``clean_python()`` creates (once, cached under ``$HF_ATTN_VARIANTS_CACHE`` or
``~/.cache/hf_attn_variants``) a virtual environment holding only torch, transformers and safetensors
at the versions installed here, and ``assert_remote_code_matches`` saves each model, loads it there
through the named Auto class and checks the outputs equal the originals.

Usage from a family's tests::

    cases = [RemoteCase("mlm", model, "AutoModelForMaskedLM", {"input_ids": ids})]
    assert_remote_code_matches(cases, tmp_path)
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from hf_attn_variants import AUTO_CLASSES

OUTPUT_KEYS = ("last_hidden_state", "logits", "start_logits", "end_logits")

CHILD_SCRIPT = r"""
import importlib.util, json, sys
import torch, transformers
assert importlib.util.find_spec("hf_attn_variants") is None, "hf_attn_variants must not be importable here"
manifest = json.load(open(sys.argv[1]))
for case in manifest:
    auto_class = getattr(transformers, case["auto_class"])
    model = auto_class.from_pretrained(case["folder"], trust_remote_code=True).eval()
    assert not type(model).__module__.startswith("hf_attn_variants"), type(model).__module__
    inputs = torch.load(case["inputs"])
    with torch.no_grad():
        out = model(**inputs)
    keys = [k for k in case["keys"]]
    torch.save({k: out[k] for k in keys}, case["outputs"])
    print("loaded", case["name"], type(model).__name__, type(model).__module__)
"""


def auto_class_name(suffix: str) -> str:
    """Name of the Auto class for a family class suffix (``"ForMaskedLM"`` → ``"AutoModelForMaskedLM"``)."""
    return AUTO_CLASSES[suffix].__name__


@dataclass
class RemoteCase:
    """One model to export and reload: ``auto_class`` is the name of a transformers Auto class."""

    name: str
    model: PreTrainedModel
    auto_class: str
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


def cache_root() -> Path:
    """Where cached environments live."""
    root = Path(os.environ.get("HF_ATTN_VARIANTS_CACHE", Path.home() / ".cache" / "hf_attn_variants"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock, so parallel pytest-xdist workers build the environment once."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pinned_requirements() -> list[str]:
    """torch, transformers and safetensors at the installed (public) versions."""
    versions = {name: importlib.metadata.version(name).split("+")[0] for name in ("torch", "transformers", "safetensors")}
    return [f"{name}=={version}" for name, version in versions.items()]


def clean_python() -> Path:
    """Path to the Python of the cached clean environment, created on first use."""
    requirements = pinned_requirements()
    tag = "-".join(r.replace("==", "") for r in requirements) + f"-py{sys.version_info[0]}{sys.version_info[1]}"
    env_dir = cache_root() / f"clean-env-{tag}"
    python = env_dir / "bin" / "python"
    ready = env_dir / ".ready"
    with file_lock(cache_root() / f"clean-env-{tag}.lock"):
        if not ready.exists():
            venv.create(env_dir, with_pip=True, clear=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", *requirements],
                check=True,
                env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            )
            ready.touch()
    return python


def assert_remote_code_matches(cases: list[RemoteCase], tmp_path: Path, atol: float = 1e-5) -> None:
    """Export every case, load it in the clean environment and compare outputs with the original."""
    manifest, expected = [], {}
    for case in cases:
        folder = tmp_path / case.name
        case.model.eval().save_pretrained(folder)
        with torch.no_grad():
            out = case.model(**case.inputs)
        keys = [k for k in OUTPUT_KEYS if out.get(k) is not None]
        expected[case.name] = {k: out[k] for k in keys}
        torch.save(case.inputs, tmp_path / f"{case.name}.inputs.pt")
        manifest.append(
            {
                "name": case.name,
                "folder": str(folder),
                "auto_class": case.auto_class,
                "inputs": str(tmp_path / f"{case.name}.inputs.pt"),
                "outputs": str(tmp_path / f"{case.name}.outputs.pt"),
                "keys": keys,
            }
        )
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "child.py").write_text(CHILD_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"), TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run(
        [str(clean_python()), str(tmp_path / "child.py"), str(tmp_path / "manifest.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"remote-code loading failed:\n{result.stdout}\n{result.stderr}"
    for case in cases:
        got = torch.load(tmp_path / f"{case.name}.outputs.pt")
        for key, value in expected[case.name].items():
            assert torch.allclose(got[key], value, atol=atol), f"{case.name}.{key} differs after remote-code load"
