"""The bundler behind the standalone remote code (``hf_attn_variants.models.standalone``)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForSequenceClassification
from hf_attn_variants.models.standalone import bundle_module
from tests.remote_code import assert_standalone_code

PRELUDE = '''"""Prelude."""
from __future__ import annotations

import math

SCALE = math.sqrt(2.0)
__all__ = ["SCALE"]
'''


def fake_package(tmp_path: Path, modules: dict[str, str]) -> Path:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "compat.py").write_text(PRELUDE)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(source)
    return folder


def test_a_bundle_holds_what_the_entry_needs_in_dependency_order(tmp_path) -> None:
    folder = fake_package(tmp_path, {
        "shared": '"""Shared."""\nimport os\n\n\ndef used():\n    return helper() + 1\n\n\n# the helper\n'
                  'def helper():\n    return 1\n\n\ndef unused():\n    return os.sep\n',
        "entry": '"""Entry."""\nfrom __future__ import annotations\n\nfrom .compat import SCALE\n'
                 'from .shared import used\n\n\ndef value():\n    return used() * SCALE\n\n\n'
                 '__all__ = ["value"]\n',
    })
    bundle = bundle_module("entry", package_dir=folder)
    assert bundle.sources == ["compat", "shared", "entry"]
    text = bundle.text
    assert "def unused" not in text and "import os" not in text  # only what the entry reaches
    assert "# the helper" in text and text.index("def helper") < text.index("def value")
    assert "from ." not in text
    (tmp_path / "bundled_entry.py").write_text(text)
    spec = importlib.util.spec_from_file_location("bundled_entry", tmp_path / "bundled_entry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The inlined prelude's names are the entry's to use, not to export (the shared file exports them).
    assert module.value() == pytest.approx(2 * 2**0.5) and module.__all__ == ["value"]


def test_external_modules_stay_relative_imports_of_their_file(tmp_path) -> None:
    """Names from ``external`` modules become one ``from .<file> import …`` line per file, listed before the
    absolute imports (the shared file checks the Transformers version first); nothing of them is inlined."""
    folder = fake_package(tmp_path, {
        "shared": '"""Shared."""\n\n\ndef used():\n    return 1\n',
        "config": '"""Config."""\n\n\nclass Config:\n    pass\n',
        "entry": '"""Entry."""\nimport math\n\nfrom .compat import SCALE\nfrom .config import Config\n'
                 'from .shared import used\n\n\n'
                 'def value():\n    return math.floor(used() * SCALE), Config\n',
    })
    bundle = bundle_module("entry",
                           external={"compat": "common", "shared": "common", "config": "config_file"},
                           package_dir=folder)
    assert bundle.sources == ["entry"]
    text = bundle.text
    assert "from .common import SCALE, used\nfrom .config_file import Config\n\nimport math" in text
    assert "def used" not in text and "class Config" not in text


def test_the_shared_file_is_one_text_for_every_family_and_its_hash_is_the_cards(tmp_path) -> None:
    from hf_attn_variants import GAUConfig, SynthesizerConfig
    from hf_attn_variants.models.standalone import SHARED_FILE, shared_code_sha256

    texts = set()
    for name, config in (("ei", EntropyInvariantConfig(hidden_size=32, num_attention_heads=4)),
                         ("gau", GAUConfig(hidden_size=32, attention_key_size=8)),
                         ("synthesizer", SynthesizerConfig(hidden_size=32, num_attention_heads=4))):
        config.save_pretrained(tmp_path / name)
        texts.add((tmp_path / name / f"{SHARED_FILE}.py").read_bytes())
    assert len(texts) == 1
    assert hashlib.sha256(texts.pop()).hexdigest() == shared_code_sha256()


def test_a_name_defined_twice_or_a_renamed_relative_import_is_refused(tmp_path) -> None:
    folder = fake_package(tmp_path, {
        "a": "def clash():\n    return 1\n",
        "b": "def clash():\n    return 2\n\n\ndef other():\n    return clash()\n",
        "entry": "from .a import clash\nfrom .b import other\n\n\ndef f():\n    return clash() + other()\n",
        "renamed": "from .a import clash as c\n\n\ndef g():\n    return c()\n",
    })
    with pytest.raises(ValueError, match="'clash' is defined in both a.py and b.py"):
        bundle_module("entry", package_dir=folder)
    with pytest.raises(ValueError, match="must not rename"):
        bundle_module("renamed", package_dir=folder)


def test_config_alone_writes_only_its_standalone_file(tmp_path) -> None:
    EntropyInvariantConfig(hidden_size=32, num_attention_heads=4).save_pretrained(tmp_path)
    assert_standalone_code(tmp_path, "entropy_invariant", model=False)


def test_push_to_hub_from_save_pretrained_uploads_the_rewritten_folder(tmp_path, monkeypatch) -> None:
    config = EntropyInvariantConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                    intermediate_size=37)
    model = EntropyInvariantForSequenceClassification(config)
    calls = []

    def push_to_hub(repo_id, **kwargs):  # what Transformers would upload: save again into a folder
        model.save_pretrained(tmp_path / "upload")
        calls.append((repo_id, kwargs, sorted(p.name for p in (tmp_path / "upload").glob("*.py"))))

    monkeypatch.setattr(model, "push_to_hub", push_to_hub)
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="someone/tiny", private=True)
    assert_standalone_code(tmp_path / "local", "entropy_invariant")
    assert calls == [("someone/tiny", {"private": True},
                      ["attn_variants_common.py", "configuration_entropy_invariant.py",
                       "modeling_entropy_invariant.py"])]


def test_saving_the_config_again_keeps_the_models_other_files(tmp_path) -> None:
    """``config.save_pretrained`` into a model's folder rewrites the config's files and removes only the
    package modules Transformers copied: the model's kernel files stay, so the folder still loads."""
    from hf_attn_variants import GAUConfig, GAUForCausalLM
    from tests.remote_code import assert_standalone_code

    config = GAUConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, attention_key_size=8, chunk_size=4,
                       attention_normalization="relu2")
    GAUForCausalLM(config).save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    assert_standalone_code(tmp_path, "gau")
