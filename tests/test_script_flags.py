"""Bad arguments to the maintainer scripts (``scripts/*.py``) stop them before any work: one error line naming
the flag, status 2, nothing written. Each script runs in this process (its ``main`` or ``parse_args``) on
arguments it refuses while parsing them, so no benchmark or study runs here; every output path is under
``tmp_path`` (or a place no one can write, such as /proc), and the scripts that write into this checkout's
docs are pointed at ``tmp_path`` instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNWRITABLE = "/proc/x/y.json"
"""A file no user can create (os.access says yes to root, so the scripts probe)."""


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module of its own (not the one other tests load)."""
    if f"script_flags_{name}" in sys.modules:
        return sys.modules[f"script_flags_{name}"]
    spec = importlib.util.spec_from_file_location(f"script_flags_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def files_under(folder: Path) -> list[tuple[str, int]]:
    """Every file under ``folder`` with its size: what a refused run must leave as it was."""
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def status_of(call: Callable[[], Any]) -> int | str | None:
    """The exit status of ``call``: its ``SystemExit`` code, else what it returned."""
    try:
        return call()
    except SystemExit as stop:
        return stop.code


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, call: Callable[[], Any], flag: str) -> str:
    """Run ``call``, assert status 2 with ``flag`` on stderr's last line and nothing new under ``tmp_path``;
    return that line."""
    capsys.readouterr()
    before = files_under(tmp_path)
    status = status_of(call)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, (status, err[-3:])
    assert err and flag in err[-1], err[-3:]
    assert "Traceback" not in "\n".join(err)
    assert files_under(tmp_path) == before
    return err[-1]


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """A folder holding a user's file (which a script must not write beside)."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("mine\n")
    return folder


# --------------------------------------------------------------------------------------------- record_suite
@pytest.mark.parametrize(("arguments", "flag"), [
    (["--label", "x", "--command", "y", "--minutes", "nan"], "--minutes"),
    (["--label", "x", "--command", "y", "--minutes", "-3"], "--minutes"),
    (["--label", "x", "--command", "y", "--minutes", "inf"], "--minutes"),
    (["--label", "", "--command", "y", "--minutes", "1"], "--label"),
    (["--label", "x", "--command", " ", "--minutes", "1"], "--command"),
    (["--label", "x", "--command", "y", "--minutes", "1", "--log", "/nonexistent.log"], "--log"),
    (["--label", "x", "--command", "y", "--minutes", "1", "--log", "{tmp}/no-summary.log"], "--log"),
])
def test_record_suite_refuses(arguments, flag, tmp_path, capsys, monkeypatch):
    (tmp_path / "no-summary.log").write_text("collected 3 items\n")
    script = load_script("record_suite")
    monkeypatch.setattr(script, "ROOT", tmp_path)  # never this checkout's docs/results/suite.json
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: script.main(argv), flag)


def test_record_suite_takes_a_log_with_pytests_summary(tmp_path):
    log = tmp_path / "pytest.log"
    log.write_text("...\n===== 12 passed, 3 skipped in 4.5s =====\n")
    args = load_script("record_suite").parse_args(["--label", "x", "--command", "y", "--minutes", "1.5",
                                                   "--log", str(log)])
    assert args.counts and args.minutes == 1.5


# --------------------------------------------------------------------------------------------- publish_demo
@pytest.mark.parametrize(("arguments", "flag"), [
    (["--wall-seconds", "nan", "--results", "{tmp}/ok.json"], "--wall-seconds"),
    (["--wall-seconds", "-5", "--results", "{tmp}/ok.json"], "--wall-seconds"),
    (["--wall-seconds", "10", "--cpu-seconds", "-4", "--results", "{tmp}/ok.json"], "--cpu-seconds"),
    (["--wall-seconds", "10", "--results", "/nonexistent.json"], "--results"),
    (["--wall-seconds", "10", "--results", "{tmp}/other.json"], "--results"),
    (["--wall-seconds", "10", "--results", "{tmp}/bad.jsonl"], "--results"),
    (["--wall-seconds", "10", "--results", "{tmp}"], "--results"),
])
def test_publish_demo_refuses(arguments, flag, tmp_path, capsys, monkeypatch):
    (tmp_path / "ok.json").write_text('{"sentence": "s", "seconds": 1, "rows": []}')
    (tmp_path / "other.json").write_text('{"model_type": "gau"}')
    (tmp_path / "bad.jsonl").write_text('{"text": "a"\n')
    script = load_script("publish_demo")
    monkeypatch.setattr(script, "ROOT", tmp_path)  # never this checkout's docs/results/demo-cpu.json
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: script.main(argv), flag)


# ------------------------------------------------------------------------------------------- the benchmarks
@pytest.mark.parametrize(("arguments", "flag"), [
    (["--batches", "0"], "--batches"),
    (["--contexts", "512", "-8"], "--contexts"),
    (["--contexts", "100000000"], "--contexts"),
    (["--new_tokens", "2"], "--new_tokens"),
    (["--threads", "0"], "--threads"),
    (["--out", UNWRITABLE], "--out"),
    (["--out", "{tmp}"], "--out"),
])
def test_decoding_bench_refuses(arguments, flag, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "decoding.json")]
    line = refused(capsys, tmp_path, lambda: load_script("decoding_bench").main(argv), flag)
    assert line.count("--") == 1 or "--contexts must be <=" in line  # the one flag that is wrong


@pytest.mark.parametrize(("arguments", "flag"), [
    (["--lengths", "0"], "--lengths"),
    (["--steps", "0"], "--steps"),
    (["--out", UNWRITABLE], "--out"),
    (["--out", "{tmp}"], "--out"),
])
def test_peer_profile_refuses(arguments, flag, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "peer.json")]
    refused(capsys, tmp_path, lambda: load_script("peer_profile").main(argv), flag)


@pytest.mark.parametrize("output", [UNWRITABLE, "{tmp}"])
def test_pretrain_throughput_refuses_an_output_it_cannot_write(output, tmp_path, capsys):
    argv = ["--steps", "4", "--output", output.replace("{tmp}", str(tmp_path))]
    refused(capsys, tmp_path, lambda: load_script("pretrain_throughput").main(argv), "--output")


@pytest.mark.parametrize("out", [UNWRITABLE, "{tmp}"])
def test_triton_resources_refuses_an_out_it_cannot_write(out, tmp_path, capsys):
    argv = ["--out", out.replace("{tmp}", str(tmp_path))]
    refused(capsys, tmp_path, lambda: load_script("triton_resources").main(argv), "--out")


@pytest.mark.parametrize(("arguments", "flag"), [
    (["--repeats", "0"], "--repeats"),
    (["--length", "0"], "--length"),
    (["--batch", "0"], "--batch"),
    (["--hidden", "32"], "--hidden"),
    (["--hidden", "0"], "--hidden"),
    (["--threads", "-1"], "--threads"),
    (["--results", "../../x"], "--results"),
    (["--root", "/nonexistent", "--results", "x"], "--root"),
    (["--folder", "{notes}"], "--folder"),
    (["--folder", "/proc/x"], "--folder"),
])
def test_tp_bench_refuses(arguments, flag, tmp_path, notes, capsys):
    argv = [a.replace("{notes}", str(notes)) for a in arguments]
    if "--folder" not in argv:
        argv += ["--folder", str(tmp_path / "models")]
    if "--root" not in argv:
        argv += ["--root", str(tmp_path)]
    refused(capsys, tmp_path, lambda: load_script("tp_bench").parse_args(argv), flag)


def test_tp_bench_takes_a_new_folder_and_no_results(tmp_path):
    args = load_script("tp_bench").parse_args(["--folder", str(tmp_path / "models"), "--results", "",
                                               "--hidden", "128", "--root", str(tmp_path)])
    assert args.hidden == 128 and not (tmp_path / "models").exists()


# ---------------------------------------------------------------------------------------------- the studies
@pytest.mark.parametrize(("arguments", "flag"), [
    (["--seeds", "-1"], "--seeds"),
    (["--seeds", "1", "1"], "--seeds"),
    (["--variants", "nosuch"], "--variants"),
    (["--out", UNWRITABLE], "--out"),
    (["--out", "{tmp}"], "--out"),
    (["--results", "../../../x"], "--results"),
    (["--results", ""], "--results"),
])
def test_gau_init_study_refuses(arguments, flag, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("gau_init_study").parse_args(argv), flag)


def test_gau_init_study_takes_its_variants_by_name():
    script = load_script("gau_init_study")
    name = next(n for n, (family, _) in script.OVERFIT_VARIANTS.items() if family == "gau")
    assert script.parse_args(["--variants", name.removeprefix("GAU_")]).seeds == [42]


@pytest.mark.parametrize(("arguments", "flag"), [
    (["--root", "/nonexistent", "--results", "x"], "--root"),
    (["--root", "{tmp}", "--results", ""], "--results"),
    (["--root", "{tmp}", "--results", "../x"], "--results"),
])
def test_minilm_log_n_refuses(arguments, flag, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("minilm_log_n").main(argv), flag)
    assert not Path("/nonexistent").exists()


@pytest.mark.parametrize(("arguments", "flag"), [
    (["absorb", "{tmp}/bad.jsonl"], "absorb"),
    (["absorb", "{tmp}/lease"], "absorb"),
    (["publish", "--runs", "{tmp}/bad.jsonl", "--out", "{tmp}/out"], "--runs"),
    (["publish", "--runs", "{tmp}/lease", "--out", "{tmp}/out"], "--runs"),
])
def test_gpu_study_refuses_a_file_that_is_not_a_runs_file(arguments, flag, tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\nnot json\n')
    (tmp_path / "lease").mkdir()
    (tmp_path / "lease" / "gpu-study-runs.jsonl").write_text('{"fingerprint": "f"}\n[1, 2]\n')
    committed = ROOT / "docs" / "results" / "gpu-study"
    before = files_under(committed)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("gpu_study").main(argv), flag)
    assert files_under(committed) == before


def test_gpu_study_skips_only_a_torn_last_line(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text('{"fingerprint": "f"}\n\n{"fingerprint": "g", "lo')
    load_script("gpu_study").check_runs_files([runs, tmp_path], "--runs")


# ------------------------------------------------------------------------------------ GPU check and serving
@pytest.mark.parametrize(("arguments", "flag"), [
    (["environment", "--out", "/proc/x"], "--out"),
    (["environment", "--out", "{tmp}/file.txt"], "--out"),
    (["environment", "--out", "{tmp}/out", "--budget", "nan"], "--budget"),
    (["environment", "--out", "{tmp}/out", "--budget", "-1"], "--budget"),
    (["bench", "--out", "{tmp}/out", "--budget", "inf"], "--budget"),
    (["publish", "{tmp}/out", "--title", " ", "--root", "{tmp}"], "--title"),
])
def test_gpu_check_refuses(arguments, flag, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("notes\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("gpu_check").main(argv), flag)


@pytest.mark.parametrize(("arguments", "flag"), [
    (["publish", "--json", "{tmp}/missing.json", "--root", "{tmp}"], "--json"),
    (["publish", "--json", "{tmp}/bad.jsonl", "--root", "{tmp}"], "--json"),
    (["publish", "--json", "{tmp}/list.json", "--root", "{tmp}"], "--json"),
    (["publish", "--json", "{tmp}/rows.json", "--root", "{tmp}"], "--json"),
    (["save", "{notes}"], "folder"),
    (["save", "/proc/x"], "folder"),
    (["vllm", "{tmp}", "--batches", "0"], "--batches"),
])
def test_serving_bench_refuses(arguments, flag, tmp_path, notes, capsys):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"\n')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "rows.json").write_text('{"rows": [{"engine": "vllm"}], "environment": {"vllm": {}, '
                                        '"transformers": {}}}')
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{notes}", str(notes)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("serving_bench").main(argv), flag)


@pytest.mark.parametrize(("arguments", "flag"), [
    (["publish", "{tmp}/missing", "--root", "{tmp}"], "folder"),
    (["publish", "{notes}", "--root", "{tmp}"], "folder"),
    (["publish", "{tmp}/bad", "--root", "{tmp}"], "folder"),
    (["publish", "{tmp}/wrong", "--root", "{tmp}"], "folder"),
    (["save", "{notes}"], "folder"),
])
def test_gau_serving_bench_refuses(arguments, flag, tmp_path, notes, capsys):
    for name, raw in (("bad", '{"throughput": ['), ("wrong", '{"throughput": []}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "raw.json").write_text(raw)
        (tmp_path / name / "parameters.json").write_text("{}")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{notes}", str(notes)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("gau_serving_bench").main(argv), flag)


def test_serving_bench_saves_files_others_can_read(tmp_path):
    """``save``'s files get the umask's mode, not the 0600 of a writer's temporary file."""
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "model.safetensors").chmod(0o600)
    load_script("serving_bench").readable(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("arguments", [["run", "--dry-run", "--out", "{notes}"]])
def test_gpu_study_runs_into_no_users_folder(arguments, tmp_path, notes, capsys):
    argv = [a.replace("{notes}", str(notes)) for a in arguments]
    refused(capsys, tmp_path, lambda: load_script("gpu_study").main(argv), "--out")
