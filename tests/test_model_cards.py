"""Every exported model card's usage block runs as written, unattended (stdin closed), in a clean virtual
environment holding torch and transformers but not this package, reading the exported folder itself.

Issue 51: the block used to call ``AutoTokenizer.from_pretrained(repo)`` without ``trust_remote_code=True``;
in a terminal Transformers then asks "Do you wish to run the custom code? [y/N]" and waits 15 s, and with
stdin closed it fails. One tiny model per family and per kind of card (fill-mask, text-generation,
text-classification) is exported; the ```python block under "## Usage" of each ``README.md`` is run with the
card's repository id replaced by the folder's path, all of them in one child process of the cached clean
environment (``tests/remote_code.py``: ``clean_python``, built once and reused). About 15-25 s when the
environment is cached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from hf_attn_variants.hub.export import ExportArguments, export
from hf_attn_variants.training import embedded_tokenizer
from hf_attn_variants.training.modeling import build_config
from tests.remote_code import clean_python
from tests.test_pretrain import tiny_overrides

REPO_ID = "me/tiny"
CASES = {
    "entropy_invariant-fill-mask": ("entropy_invariant", AutoModelForMaskedLM, {}),
    "gau-text-generation": ("gau", AutoModelForCausalLM, {}),
    "synthesizer-fill-mask": ("synthesizer", AutoModelForMaskedLM, {}),
    "entropy_invariant-text-classification": ("entropy_invariant", AutoModelForSequenceClassification,
                                              {"num_labels": 2}),
    "synthesizer-text-generation": ("synthesizer", AutoModelForCausalLM, {"max_position_embeddings": 16}),
    "gau-question-answering": ("gau", AutoModelForQuestionAnswering, {}),
    "synthesizer-token-classification": ("synthesizer", AutoModelForTokenClassification, {"num_labels": 3}),
    "entropy_invariant-feature-extraction": ("entropy_invariant", AutoModel, {}),
}
"""Card name → (family, Auto class, config fields): every family and every head's card. The Synthesizer's
causal LM holds 16 positions, so its card must ask for no more tokens than fit (the pipeline's default is
256); question answering has no pipeline from Transformers 5.10 on."""

RUNNER = r"""
import json, runpy, sys
for name, script in json.loads(sys.argv[1]).items():
    print(f"=== {name}", flush=True)
    runpy.run_path(script, run_name="__main__")
assert "hf_attn_variants" not in sys.modules, "the clean environment must not import hf_attn_variants"
print("=== all blocks ran", flush=True)
"""


def usage_block(card: str) -> str:
    """The ```python block under the card's "## Usage" heading."""
    match = re.search(r"## Usage\n```python\n(?P<code>.*?)```", card, re.DOTALL)
    assert match, card[-2000:]
    return match["code"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One exported folder per case of ``CASES``."""
    root = tmp_path_factory.mktemp("cards")
    tokenizer = embedded_tokenizer()
    folders = {}
    for name, (family, auto_class, fields) in CASES.items():
        torch.manual_seed(0)
        config = build_config(family, config_overrides=tiny_overrides(family), tokenizer=tokenizer,
                              max_seq_length=16)
        for key, value in fields.items():
            setattr(config, key, value)
        trained = root / f"{name}-trained"
        auto_class.from_config(config).save_pretrained(trained)
        tokenizer.save_pretrained(trained)
        folders[name] = export(ExportArguments(model_name_or_path=str(trained), output_dir=str(root / name),
                                               repo_id=REPO_ID))
    return folders


def test_every_card_passes_trust_remote_code_to_every_from_pretrained(exported) -> None:
    for name, folder in exported.items():
        code = usage_block((folder / "README.md").read_text())
        calls = re.findall(r"(?:from_pretrained|pipeline)\(([^)]*)\)", code)
        assert len(calls) == (2 if "question-answering" in name else 3), (name, code)
        assert all("trust_remote_code=True" in call for call in calls), (name, code)


def pipeline_last(code: str) -> str:
    """``code`` with its ``pipeline`` lines moved to the end: the tokenizer and the model load first, in a
    process where no remote code was trusted yet (a pipeline loaded first would have trusted it for them)."""
    lines = code.splitlines()
    piped = [line for line in lines if "pipeline(" in line or "pipe(" in line]
    return "\n".join([line for line in lines if line not in piped] + piped) + "\n"


def run_clean(scripts: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``RUNNER`` over ``scripts`` in the cached clean environment, stdin closed, the Hub offline."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment.update(HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([str(clean_python()), "-c", RUNNER, json.dumps(scripts)], cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                          env=environment, check=False)


def test_every_card_usage_block_runs_unattended_in_a_clean_environment(exported, tmp_path) -> None:
    """All blocks as written in one process; then, one process per family, the block with the tokenizer and
    the model loaded before the pipeline: each ``from_pretrained`` must pass ``trust_remote_code=True`` itself
    (without it, Transformers prompts; with stdin closed it goes on after printing the question)."""
    scripts, firsts = {}, {}
    for name, folder in exported.items():
        code = usage_block((folder / "README.md").read_text())
        assert f'"{REPO_ID}"' in code, code
        code = code.replace(f'"{REPO_ID}"', json.dumps(str(folder)))
        (tmp_path / f"{name}.py").write_text(code)
        scripts[name] = str(tmp_path / f"{name}.py")
        (tmp_path / f"{name}-pipeline-last.py").write_text(pipeline_last(code))
        firsts.setdefault(CASES[name][0], {name: str(tmp_path / f"{name}-pipeline-last.py")})
    printed = ""
    for batch in (scripts, *firsts.values()):
        result = run_clean(batch, tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-5000:]
        assert "Do you wish to run the custom code" not in output, (list(batch), output[-3000:])
        assert "=== all blocks ran" in result.stdout
        printed = printed or result.stdout
    printed = printed.split("=== ")
    for name, (family, auto_class, _) in CASES.items():
        block = next(part for part in printed if part.startswith(name + "\n"))
        prefix = {"entropy_invariant": "EntropyInvariant", "gau": "GAU", "synthesizer": "Synthesizer"}[family]
        class_name = auto_class.__name__.replace("AutoModel", prefix)
        assert class_name in block, (name, block)  # the block's last line: the class and its size
