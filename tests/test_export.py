"""export writes a hub-ready folder (loads with trust_remote_code in a clean environment, card metadata with
the metrics); push fails offline with one clear sentence and leaves the folder untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForMaskedLM

from hf_attn_variants import FAMILIES
from hf_attn_variants.cli import main
from hf_attn_variants.hub import ExportArguments, PushArguments, PushError, check_export, export, push
from hf_attn_variants.models.compat import MIN_TRANSFORMERS_VERSION
from hf_attn_variants.training import build_config, embedded_tokenizer
from tests.remote_code import assert_standalone_code, clean_python
from tests.test_pretrain import tiny_overrides

CITATION = {"entropy_invariant": "2501.19399", "gau": "2202.10447", "synthesizer": "2005.00743"}
METRICS = {"eval_loss": 5.4321, "eval_accuracy": 0.1234, "eval_perplexity": 228.6, "train_loss": 5.6,
           "step": 10}

CLEAN_CHILD = r"""
import importlib.util, json, sys
import torch, transformers
assert importlib.util.find_spec("hf_attn_variants") is None
for case in json.load(open(sys.argv[1])):
    model = transformers.AutoModelForMaskedLM.from_pretrained(case["folder"], trust_remote_code=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(case["folder"])
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    batch = tokenizer(["the assert statement raises an exception."], return_tensors="pt")
    with torch.no_grad():
        torch.save(model(**batch).logits, case["output"])
print("ok")
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A tiny MLM folder per family with the files pretrain writes next to the model."""
    tokenizer = embedded_tokenizer()
    out = {}
    for family in FAMILIES:
        torch.manual_seed(0)
        config = build_config(family, config_overrides=tiny_overrides(family), tokenizer=tokenizer,
                              max_seq_length=16)
        folder = tmp_path_factory.mktemp(f"trained-{family}")
        AutoModelForMaskedLM.from_config(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / "all_results.json").write_text(json.dumps(METRICS))
        (folder / "pretrain_args.json").write_text(json.dumps(
            {"objective": "mlm", "max_seq_length": 16, "dataset": "pydoc_data.topics",
             "dataset_name": "pydoc_data.topics (Python Language Reference)", "train_blocks": 100}))
        (folder / "eval_by_length.json").write_text(json.dumps(
            {"train_length": 16, "results": [{"length": 16, "loss": 5.4, "accuracy": 0.12},
                                             {"length": 64, "loss": 5.9, "accuracy": 0.10}]}))
        (folder / "checkpoints").mkdir()  # training leftovers must not be exported
        out[family] = folder
    return out


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    return {family: export(ExportArguments(model_name_or_path=str(folder), output_dir=str(root / family),
                                           repo_id=f"someone/{family}-tiny"))
            for family, folder in trained.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_folder_is_exactly_the_upload(exported, family: str) -> None:
    folder = exported[family]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "README.md"} <= names
    assert_standalone_code(folder, family)
    assert not names & {"checkpoints", "all_results.json", "pretrain_args.json", "train_log.jsonl"}
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pkl"))]
    check_export(folder)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert (auto_map["AutoModelForMaskedLM"]
            == f"modeling_{family}.{FAMILIES[family][1]['ForMaskedLM'].__name__}")
    assert not list(folder.parent.glob(f".{family}.*")), "staging folder left behind"


def test_check_export_names_a_missing_folder(tmp_path) -> None:
    with pytest.raises(ValueError, match="There is no export folder '.*nowhere'.$"):
        check_export(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"There is no export folder '.*file' \(it is a file\)"):
        check_export(tmp_path / "file")


def _shard_missing(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                        "b": "model-00002-of-00002.safetensors"}}))


DAMAGES = {
    "a pickle in a subfolder": (lambda f: ((f / "checkpoints").mkdir(),
                                           (f / "checkpoints" / "optimizer.pt").write_bytes(b"x")),
                                r"pickle files \['checkpoints/optimizer.pt'\]"),
    "empty weights": (lambda f: (f / "model.safetensors").write_bytes(b""), "do not read as safetensors"),
    "weights that are not safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"not a header"),
                                         "do not read as safetensors"),
    "a shard the index names is missing": (_shard_missing,
                                           r"lacks the shards \['model-00002-of-00002.safetensors'\]"),
    "config.json is a list": (lambda f: (f / "config.json").write_text("[1, 2]"),
                              "must hold a JSON object, got a list"),
    "config.json is not JSON": (lambda f: (f / "config.json").write_text("{"), "cannot be read as JSON"),
    "the tokenizer's file is missing": (lambda f: (f / "tokenizer.json").unlink(),
                                        "has a tokenizer that does not load"),
    "README.md is a folder": (lambda f: ((f / "README.md").unlink(), (f / "README.md").mkdir()),
                              r"lacks \['README.md'\]"),
    "config.json names no model_type": (lambda f: (f / "config.json").write_text('{"auto_map": {}}'),
                                        "names no model_type"),
    "no config.json": (lambda f: (f / "config.json").unlink(),
                       r"lacks \['config.json'\]\.$"),  # no code file named after an unknown model_type
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_check_export_refuses_what_push_must_not_upload(exported, tmp_path, damage: str) -> None:
    """``push`` uploads the whole tree, so a pickle in a subfolder is refused as well as one at the top;
    weights, the shards an index names, the config and the tokenizer must read as a loader will read them.
    Each used to pass (the config's list: an ``AttributeError``)."""
    import shutil

    mutate, message = DAMAGES[damage]
    folder = tmp_path / "export"
    shutil.copytree(exported["gau"], folder)
    mutate(folder)
    with pytest.raises(ValueError, match=message):
        check_export(folder)


def test_export_refuses_a_tokenizer_larger_than_the_vocabulary(trained, tmp_path, capsys) -> None:
    """Its ids past the embeddings would fail every forward, the card's example included; nothing is
    written."""
    tokenizer = embedded_tokenizer()
    tokenizer.add_tokens(["<a-token-the-model-lacks>"])
    tokenizer.save_pretrained(tmp_path / "larger")
    argv = ["export", "--model_name_or_path", str(trained["gau"]), "--output_dir", str(tmp_path / "out"),
            "--tokenizer_name", str(tmp_path / "larger")]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "--tokenizer_name" in error and "tokens but the model's vocab_size is" in error, error
    assert not (tmp_path / "out").exists()


def test_the_export_folder_has_the_modes_of_any_folder_the_user_creates(trained, tmp_path) -> None:
    """Not mkdtemp's private 0o700, nor safetensors' 0o600: 0o777 and 0o666 less the umask, so that another
    user or a serving container can read the model."""
    import os
    import stat

    previous = os.umask(0o027)
    try:
        folder = export(ExportArguments(model_name_or_path=str(trained["gau"]),
                                        output_dir=str(tmp_path / "x")))
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (folder, *folder.iterdir())}
    assert modes.pop("x") == 0o750 and set(modes.values()) == {0o640}, modes


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_card_metadata_parses_and_holds_the_metrics(exported, family: str) -> None:
    card = ModelCard.load(exported[family] / "README.md")
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "fill-mask"
    assert {"custom_code", family, "fill-mask"} <= set(data.tags)
    values = {(r.metric_type, r.metric_name): r.metric_value for r in data.eval_results}
    assert values[("loss", "validation loss")] == pytest.approx(METRICS["eval_loss"])
    assert values[("accuracy", "validation accuracy")] == pytest.approx(METRICS["eval_accuracy"])
    assert values[("loss", "validation loss @ 64 tokens")] == pytest.approx(5.9)
    assert all(r.task_type == "fill-mask" and r.dataset_type == "pydoc_data.topics"
               for r in data.eval_results)
    text = card.text
    assert "trust_remote_code=True" in text and f'"someone/{family}-tiny"' in text
    assert f'"transformers>={MIN_TRANSFORMERS_VERSION}"' in text  # the minimum version the model code needs
    assert CITATION[family] in text and "hidden_size" in text
    assert "{{" not in text  # every template variable was filled
    shared = hashlib.sha256((exported[family] / "attn_variants_common.py").read_bytes()).hexdigest()
    # the same file in every family
    assert "`attn_variants_common.py`" in text and f"sha256 `{shared}`" in text


def test_export_loads_with_trust_remote_code_in_a_clean_environment(exported, tmp_path) -> None:
    tokenizer = embedded_tokenizer()
    batch = tokenizer(["the assert statement raises an exception."], return_tensors="pt")
    manifest, expected = [], {}
    for family, folder in exported.items():
        with torch.no_grad():
            expected[family] = AutoModelForMaskedLM.from_pretrained(folder).eval()(**batch).logits
        manifest.append({"folder": str(folder), "output": str(tmp_path / f"{family}.pt")})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([str(clean_python()), "-c", CLEAN_CHILD, str(tmp_path / "manifest.json")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    for family in exported:
        torch.testing.assert_close(torch.load(tmp_path / f"{family}.pt"), expected[family], atol=1e-5, rtol=0)


def test_export_refuses_to_overwrite_and_rejects_adapters(trained, tmp_path, capsys) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("user data")
    source = str(trained["entropy_invariant"])
    with pytest.raises(ValueError, match="pass --overwrite"):
        export(ExportArguments(model_name_or_path=source, output_dir=str(target)))
    assert (target / "keep.txt").read_text() == "user data"
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    code = main(["export", "--model_name_or_path", str(adapter), "--output_dir", str(tmp_path / "x")])
    assert code == 2 and "LoRA adapter" in capsys.readouterr().err


def folder_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_push_offline_fails_with_one_clear_sentence_and_keeps_the_export(
    exported, monkeypatch, capsys
) -> None:
    folder = exported["entropy_invariant"]
    before = folder_digest(folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["push", "--folder", str(folder), "--repo_id", "someone/tiny"])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in captured.err
    assert "HF_HUB_OFFLINE" in lines[0] and "Nothing was pushed" in lines[0]
    assert folder_digest(folder) == before


def test_push_without_network_fails_with_one_sentence(exported, monkeypatch) -> None:
    import huggingface_hub

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Failed to resolve 'huggingface.co'\nmore detail")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", unreachable)
    folder = exported["gau"]
    before = folder_digest(folder)
    with pytest.raises(PushError) as error:
        push(PushArguments(folder=str(folder), repo_id="someone/tiny", token="hf_dummy"))
    message = str(error.value)
    assert "\n" not in message and "ConnectionError" in message and "unchanged" in message
    assert folder_digest(folder) == before


def test_push_to_a_new_branch_creates_it_first(exported, monkeypatch) -> None:
    """``upload_folder`` commits to an existing branch only: ``--revision dev`` on a new repository created
    the repository, then failed the upload. The branch is created first; a refusal says which step failed."""
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    def record(name: str, fail: bool = False):
        def call(self, *args: object, **kwargs: object) -> object:
            calls.append((name, kwargs))
            if fail:
                raise PermissionError("403 Forbidden")
            return type("Info", (), {"commit_url": "https://hub/commit/1"})()
        return call

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, record(name))
    folder = exported["gau"]
    args = PushArguments(folder=str(folder), repo_id="someone/tiny", token="hf_dummy", revision="dev")
    assert push(args) == "https://hub/commit/1"
    assert [name for name, _ in calls] == ["create_repo", "create_branch", "upload_folder"]
    assert calls[1][1]["branch"] == "dev" and calls[1][1]["exist_ok"] and calls[2][1]["revision"] == "dev"
    for revision in (None, "refs/pr/5"):  # main, and an open pull request's ref (no branch to create)
        calls.clear()
        push(PushArguments(folder=str(folder), repo_id="someone/tiny", token="hf_dummy", revision=revision))
        assert [name for name, _ in calls] == ["create_repo", "upload_folder"], revision
        assert calls[-1][1]["revision"] == revision
    monkeypatch.setattr(huggingface_hub.HfApi, "create_branch", record("create_branch", fail=True))
    with pytest.raises(PushError, match=r"the Hub refused to create the branch \(PermissionError: 403"):
        push(args)


def test_exportable_switches_the_config_of_flash_code_saved_before_units_kept_settings() -> None:
    """A Hub folder's modeling file from before the units kept ``settings`` reads ``gau_kernel`` from the
    config in forward: ``exportable`` switches it there to the reference kernel too (the export took the
    chunked path and was refused), and back."""
    from types import SimpleNamespace

    from hf_attn_variants.hub import onnx_export

    class SavedBefore(torch.nn.Module):  # the old unit's fields: only a config
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(chunk_size=4, gau_kernel="auto")
            self.proj = torch.nn.Linear(2, 2)

    unit = SavedBefore().train()
    with onnx_export.exportable(unit) as target:
        assert target is unit and target.config.gau_kernel == "reference" and not target.training
    assert unit.config.gau_kernel == "auto" and unit.training


def test_the_onnx_program_takes_every_length_and_leaves_the_model_as_it_was(monkeypatch, tmp_path) -> None:
    """torch.export of FLASH's chunked path depends on the length modulo ``chunk_size``: torch.onnx then
    narrowed the "dynamic" axis to the traced length (or its multiples of 4) and exited 0. The program is
    traced with the reference kernel and runs at any length; a model whose shapes depend on the length is
    refused in one ``ValueError``; a question-answering head has two outputs; the caller's bf16 training model
    stays bf16 and training, and a float32 model's units keep their ``gau_kernel``. Without onnx (this
    environment) the graph is tested in tests/test_clients.py; torch.export is all this test needs."""
    from contextlib import contextmanager

    from hf_attn_variants import GAUConfig, GAUForCausalLM, GAUForQuestionAnswering
    from hf_attn_variants.hub import onnx_export

    fields = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "attention_key_size": 16,
              "max_position_embeddings": 64}
    torch.manual_seed(0)
    flash = GAUForCausalLM(GAUConfig(**fields, attention_normalization="relu2", chunk_size=4,
                                     is_decoder=True)).to(torch.bfloat16).train()
    program = onnx_export.exported_program(flash).module()
    assert flash.training and flash.dtype == torch.bfloat16
    reference = GAUForCausalLM(flash.config).eval()
    reference.load_state_dict({k: v.float() for k, v in flash.state_dict().items()})
    onnx_export.exported_program(reference)  # float32: exported in place, its units' kernel switched and back
    assert {m.settings.gau_kernel for m in reference.modules() if hasattr(m, "settings")} == {"auto"}
    for length in (2, 7, 9, 30):
        ids = torch.randint(0, 64, (3, length))
        mask = torch.ones_like(ids)
        mask[1, :1] = 0
        with torch.no_grad():
            want = reference(input_ids=ids, attention_mask=mask, use_cache=False).logits
            torch.testing.assert_close(program(ids, mask)[0][mask.bool()], want[mask.bool()], atol=1e-5,
                                       rtol=1e-4)

    @contextmanager
    def chunked(model):  # the chunked kernel, as before
        yield model.eval()

    monkeypatch.setattr(onnx_export, "exportable", chunked)
    with pytest.raises(ValueError, match=r"GAUForCausalLM cannot be exported with a dynamic sequence axis"):
        onnx_export.exported_program(flash)
    monkeypatch.undo()
    qa = GAUForQuestionAnswering(GAUConfig(**fields)).eval()
    assert onnx_export.output_names(qa) == ("start_logits", "end_logits")
    assert len(onnx_export.exported_program(qa).module()(ids, mask)) == 2
    for bad in (1, 2.5, True):
        with pytest.raises(ValueError, match=r"example_length must be an int >= 2"):
            onnx_export.exported_program(qa, example_length=bad)
    with pytest.raises(ValueError, match=r"path must be the ONNX file to write, got the folder"):
        onnx_export.export_onnx(qa, tmp_path)  # before the export (and before onnxscript is looked for)
    qa.config.max_position_embeddings = 2
    with pytest.raises(ValueError, match=r"max_position_embeddings=2: an ONNX graph"):
        onnx_export.exported_program(qa)
