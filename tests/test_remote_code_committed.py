"""The committed remote code (``src/hf_attn_variants/models/remote/``) is what the sources export, bytewise.

Transformers checks its generated modeling files the same way (``utils/check_modular_conversion.py``). Here:
the committed folder equals ``remote_code_files()``; saving refuses a stale folder (a source changed, or an
exported file was edited) with one sentence naming the refresh command and writes nothing; and no exported
file names a path of the repository, which a Hub folder does not have.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForMaskedLM
from hf_attn_variants.models.standalone import (
    MANIFEST,
    PACKAGE_DIR,
    REFRESH_COMMAND,
    REMOTE_DIR,
    check_remote_code,
    remote_code_files,
    write_standalone_code,
)

REPOSITORY_PATH = re.compile(r"(?<![\w.])(tests|docs|scripts|tools|src|locks|\.ci)/[\w.*<>-]"
                             r"|\b(CONTRIBUTING|README|DESIGN|CHANGELOG)\.md\b")
"""A path of this repository (``tests/test_gau.py``, ``docs/gau.md``, ``README.md`` …)."""


def committed_files() -> dict[str, str]:
    return {path.relative_to(REMOTE_DIR).as_posix(): path.read_text(encoding="utf-8")
            for path in sorted(REMOTE_DIR.rglob("*")) if path.is_file()}


def test_the_committed_remote_code_is_what_the_sources_export() -> None:
    expected, committed = remote_code_files(), committed_files()
    stale = sorted(name for name in expected.keys() | committed.keys()
                   if expected.get(name) != committed.get(name))
    assert not stale, (f"the committed remote code differs from its sources' export in {stale}: run "
                       f"`{REFRESH_COMMAND}` and commit src/hf_attn_variants/models/remote/")


def test_the_check_refuses_an_edited_exported_file_and_an_edited_source(tmp_path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(REMOTE_DIR, remote)
    assert check_remote_code(remote)["files"]
    edited = remote / "gau" / "modeling_gau.py"
    edited.write_text(edited.read_text().replace("class GAUModel(", "class GAUModel (", 1))
    refresh = re.escape(REFRESH_COMMAND)
    with pytest.raises(RuntimeError, match=r"exported file gau/modeling_gau\.py .*" + refresh):
        check_remote_code(remote)
    sources = tmp_path / "models"
    shutil.copytree(PACKAGE_DIR, sources, ignore=shutil.ignore_patterns("remote", "__pycache__"))
    layers = sources / "layers.py"
    layers.write_text(layers.read_text() + "\n# one more line\n")
    with pytest.raises(RuntimeError, match=r"source module layers\.py .*" + refresh):
        check_remote_code(REMOTE_DIR, sources)


def test_saving_with_a_stale_folder_writes_no_code(tmp_path) -> None:
    remote = tmp_path / "remote"
    shutil.copytree(REMOTE_DIR, remote)
    (remote / "attn_variants_common.py").write_text("# edited\n")
    model = EntropyInvariantForMaskedLM(EntropyInvariantConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    with pytest.raises(RuntimeError, match="stale"):
        write_standalone_code(tmp_path / "out", model, remote_dir=remote)
    assert not (tmp_path / "out").exists()


def test_save_pretrained_with_stale_code_writes_nothing(tmp_path, monkeypatch) -> None:
    """The model's ``save_pretrained`` checks the committed code before Transformers writes anything."""
    import hf_attn_variants.models.standalone as standalone

    remote = tmp_path / "remote"
    shutil.copytree(REMOTE_DIR, remote)
    (remote / "attn_variants_common.py").write_text("# edited\n")
    monkeypatch.setattr(standalone, "REMOTE_DIR", remote)
    monkeypatch.setattr(standalone.check_remote_code, "__defaults__", (remote, PACKAGE_DIR))
    model = EntropyInvariantForMaskedLM(EntropyInvariantConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    with pytest.raises(RuntimeError, match=r"stale: the exported file attn_variants_common\.py"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_manifest_names_every_file_and_source() -> None:
    manifest = check_remote_code()
    assert set(manifest["files"]) == set(committed_files()) - {MANIFEST}
    assert {"standalone.py", "version.py", "modeling_gau.py", "gau_triton.py"} <= set(manifest["sources"])


@pytest.mark.parametrize("name", sorted(set(committed_files()) - {MANIFEST}))
def test_no_exported_file_names_a_repository_path(name: str) -> None:
    text = (REMOTE_DIR / name).read_text(encoding="utf-8")
    found = [f"{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
             if REPOSITORY_PATH.search(line)]
    assert not found, f"{name} names repository paths a Hub folder does not have:\n" + "\n".join(found)


def test_the_repository_path_pattern_finds_paths_and_spares_modules() -> None:
    assert REPOSITORY_PATH.search("see docs/gau.md") and REPOSITORY_PATH.search("(tests/test_gau.py)")
    assert REPOSITORY_PATH.search("CONTRIBUTING.md")
    assert not REPOSITORY_PATH.search("hf_attn_variants.models.standalone, torch.distributed/tensor")
    assert not REPOSITORY_PATH.search("arXiv 2202.10447, tokens/s, GAU-α (Su 2022)")


def test_exported_files_live_in_the_package_data_folder() -> None:
    assert REMOTE_DIR == Path(PACKAGE_DIR) / "remote" and not (REMOTE_DIR / "__init__.py").exists()
