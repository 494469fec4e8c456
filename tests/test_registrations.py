"""What ``import hf_attn_variants`` (and an exported folder's code) registers with Transformers: exactly the
tables of docs/architecture.md.

Each side runs in a fresh interpreter that snapshots Transformers' registries, imports, and snapshots again.
The Auto classes are read from their mappings' registered entries (``_extra_content``, the dictionary
``register`` writes; the public ``keys()`` would import every config module of Transformers).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import transformers
from packaging.version import Version

from hf_attn_variants import AUTO_CLASSES, EntropyInvariantConfig, EntropyInvariantForCausalLM
from hf_attn_variants.registration import REGISTRATIONS

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
PARALLEL_STYLES = Version(transformers.__version__.split("+")[0]) >= Version("5.17.0")

SNAPSHOT = r"""
import importlib, json, sys
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
try:
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES
except ImportError:
    ALL_PARALLEL_STYLES = None
AUTO = {"AutoModel": "MODEL_MAPPING", "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING",
        "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING",
        "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
        "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING",
        "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING"}

def snapshot():
    found = {"AutoConfig": set(CONFIG_MAPPING.keys()),
             "AttentionInterface": set(ALL_ATTENTION_FUNCTIONS.valid_keys()),
             "AttentionMaskInterface": set(ALL_MASK_ATTENTION_FUNCTIONS.valid_keys()),
             "ALL_PARALLEL_STYLES": set(ALL_PARALLEL_STYLES.valid_keys()) if ALL_PARALLEL_STYLES else set()}
    for auto, mapping in AUTO.items():
        found[auto] = {config.model_type for config in getattr(modeling_auto, mapping)._extra_content}
    return found

before = snapshot()
sys.path.insert(0, sys.argv[2]) if len(sys.argv) > 2 else None
importlib.import_module(sys.argv[1])
after = snapshot()
assert sys.argv[1] == "hf_attn_variants" or "hf_attn_variants" not in sys.modules, "the package was imported"
print(json.dumps({name: sorted(after[name] - before[name]) for name in after if after[name] - before[name]}))
"""


def added_by_import(module: str, path: Path | None = None) -> dict[str, list[str]]:
    """Registry → keys added when a fresh interpreter imports ``module`` (from ``path`` when given)."""
    argv = [sys.executable, "-c", SNAPSHOT, module, *([str(path)] if path else [])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def documented(kind: str) -> dict[str, list[str]]:
    """The table ``<!-- registrations: kind -->`` of docs/architecture.md: registry → keys."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split(f"<!-- registrations: {kind} -->", 1)[1].split("<!-- /registrations -->", 1)[0]
    table = {}
    for line in block.splitlines()[3:]:
        registry, keys = (cell.strip() for cell in line.strip("|").split("|"))
        table[registry.strip("`")] = sorted(re.findall(r"`([^`]+)`", keys))
    return table


def without_missing_parallel_styles(table: dict[str, list[str]]) -> dict[str, list[str]]:
    """``table`` less the parallel styles where the installed Transformers has no such registry."""
    return {name: keys for name, keys in table.items() if PARALLEL_STYLES or name != "ALL_PARALLEL_STYLES"}


def test_the_package_import_registers_what_the_architecture_page_lists() -> None:
    expected = without_missing_parallel_styles(documented("package"))
    assert {name: sorted(keys) for name, keys in REGISTRATIONS.items()} == documented("package")
    assert added_by_import("hf_attn_variants") == expected


def test_the_registrations_name_every_auto_class() -> None:
    assert {auto.__name__ for auto in AUTO_CLASSES.values()} | {"AutoConfig"} <= set(REGISTRATIONS)


def test_exported_code_registers_only_the_parallel_styles(tmp_path) -> None:
    """Import an exported folder's modeling file as a package, without hf_attn_variants."""
    model = EntropyInvariantForCausalLM(EntropyInvariantConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    model.save_pretrained(tmp_path / "exported_folder")
    (tmp_path / "exported_folder" / "__init__.py").write_text("")
    added = added_by_import("exported_folder.modeling_entropy_invariant", tmp_path)
    assert added == without_missing_parallel_styles(documented("exported"))


def test_the_exported_shared_file_ends_with_its_registration() -> None:
    from hf_attn_variants.models.standalone import REMOTE_DIR, SHARED_FILE

    code = (REMOTE_DIR / f"{SHARED_FILE}.py").read_text(encoding="utf-8")
    assert code.rstrip().splitlines()[-4] == "register_parallel_styles()"
