"""Folders saved before model code moved into ``models/`` (issue 25) still load and compute what they
computed.

``tests/fixtures/pre_models_layout/<family>/`` holds one tiny causal LM per family saved by the package at
commit 4c8c12e (flat layout; ``tests/fixtures/make_pre_models_layout.py`` made them), with the logits and
greedy tokens it gave then. Each folder loads two ways: through this package's registered classes (today's
code reads the old config and weights), and with ``trust_remote_code=True`` in the clean environment of the
installed Transformers release, without this package (the two standalone files saved in the folder run).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_attn_variants  # noqa: F401  (registers the families for the package-class load)
from tests.remote_code import clean_python
from tests.utils import rounding_tolerance

FIXTURES = Path(__file__).parent / "fixtures" / "pre_models_layout"
FAMILIES = ("entropy_invariant", "gau", "synthesizer")

CHILD = r"""
import importlib.util, json, sys
import torch
from transformers import AutoModelForCausalLM
assert importlib.util.find_spec("hf_attn_variants") is None, "hf_attn_variants must not be importable here"
folder, out = sys.argv[1], sys.argv[2]
expected = json.load(open(folder + "/expected.json"))
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
ids, mask = torch.tensor(expected["input_ids"]), torch.tensor(expected["attention_mask"])
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask).logits
    generated = model.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=0)
    forced = model(input_ids=torch.tensor(expected["greedy"])).logits
torch.save({"logits": logits, "generated": generated, "forced": forced}, out)
"""


def _outputs_here(family: str, expected: dict) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / family).eval()
    assert type(model).__module__.startswith("hf_attn_variants.models."), type(model).__module__
    assert type(model).__name__ == expected["class"]
    ids, mask = torch.tensor(expected["input_ids"]), torch.tensor(expected["attention_mask"])
    with torch.no_grad():
        return {"logits": model(input_ids=ids, attention_mask=mask).logits,
                "generated": model.generate(ids[:1], max_new_tokens=6, do_sample=False, pad_token_id=0),
                "forced": model(input_ids=torch.tensor(expected["greedy"])).logits}


def _outputs_remote(family: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    (tmp_path / "child.py").write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
               TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([str(clean_python()), str(tmp_path / "child.py"), str(FIXTURES / family),
                             str(tmp_path / "out.pt")], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(tmp_path / "out.pt")


@pytest.mark.parametrize("remote", [False, True], ids=["package_classes", "remote_code"])
@pytest.mark.parametrize("family", FAMILIES)
def test_folder_saved_before_the_move_loads_and_computes_the_same(family: str, remote: bool,
                                                                  tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / family / "expected.json").read_text())
    got = _outputs_remote(family, tmp_path) if remote else _outputs_here(family, expected)
    config = json.loads((FIXTURES / family / "config.json").read_text())
    width = config.get("intermediate_size") or config["expansion_factor"] * config["hidden_size"]
    length = len(expected["input_ids"][0])
    tolerance = rounding_tolerance(torch.float32, *[config["hidden_size"], width, length] * 2, safety=16.0)
    reference = torch.tensor(expected["logits"])
    scale = reference.abs().max().item()
    valid = torch.tensor(expected["attention_mask"]).bool()
    assert (got["logits"][valid] - reference[valid]).abs().max().item() <= tolerance * scale

    greedy = torch.tensor(expected["greedy"])[0, length:]
    forced = got["forced"][0, length - 1: -1]
    top2 = forced.topk(2, dim=-1).values
    # such a tie may break either way on another CPU
    near_tie = (top2[:, 0] - top2[:, 1]) <= tolerance * scale
    assert bool(((got["generated"][0, length:] == greedy) | near_tie).all()), (got["generated"], greedy)
    assert not bool(near_tie.all()), "a near tie at every step: the greedy check would test nothing"
