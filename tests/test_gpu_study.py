"""``scripts/gpu_study.sh``, the length-generalisation study at L = 512 in GPU leases (issue 49): its dry run
goes through every step on CPU in well under a minute and writes its files, for part 1 (the language model)
and part 2 (passkey and MQAR); a second dry run skips the finished runs; runs of another corpus are never
reused; bad arguments give one line naming the flag; the publishing says "no runs yet" without runs and
applies the issue-29 rule."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_study.sh"


def load_driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_study", ROOT / "scripts" / "gpu_study.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_study"] = module
    spec.loader.exec_module(module)
    return module


driver = load_driver()


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def dry_run(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The dry run's result and the CPU seconds it used (its own work, whatever else loads the cores: the
    suite's other worker; with one thread its CPU time is its wall time on an idle core)."""
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    started = children_cpu_seconds()
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out), *extra], capture_output=True,
                          text=True, env=env, timeout=600, check=False)
    return done, children_cpu_seconds() - started


def test_dry_run_end_to_end_then_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    done, seconds = dry_run(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(path.name for path in out.iterdir())
    assert files == sorted([driver.RUNS_FILE, driver.PLAN_FILE, "gpu-study.log", driver.RESULTS_FILE,
                            driver.PLOT_FILE]), files
    runs = driver.read_runs([out / driver.RUNS_FILE])
    assert sorted(run["variant"] for run in runs) == sorted(name for name, _ in driver.VARIANTS)
    plan = json.loads((out / driver.PLAN_FILE).read_text())
    assert plan["dry_run"] and plan["corpus"]["sha256"] and plan["corpus"]["tokenizer_sha256"]
    assert set(plan["timing"]) == {name for name, _ in driver.VARIANTS} and plan["steps"] >= 1
    assert "floor" not in plan["steps_from"] and plan["predicted_seconds_per_seed"] > 0
    assert all({"first_setup_seconds", "setup_seconds", "eval_forward_seconds"} <= set(timing)
               for timing in plan["timing"].values())
    lengths = driver.DRY_SETTINGS.eval_lengths
    for run in runs:
        assert run["dry_run"]
        entropy = run["entropy"]
        if run["variant"] == "gau_flash":
            assert entropy["status"] == driver.FLASH_ENTROPY
        else:  # one layer's maps at a time: the lengths up to the memory limit, the longer ones skipped
            assert entropy["status"] == "ok", entropy
            measured = [point["length"] for point in entropy["points"]]
            assert len(measured) >= 3 and measured + entropy["skipped_lengths"] == list(lengths)
        assert {row["length"] for row in run["rows"]} == set(lengths)
    results = (out / driver.RESULTS_FILE).read_text()
    assert "Verdicts" in results and "not resolved (1 of 3 seeds)" in results
    assert seconds < 60, f"the dry run took {seconds:.0f} CPU seconds"

    # the rerun in this process (the shell's steps ran above, and part 2's test reruns the same way): it skips
    # every run, with the step count the earlier runs pinned
    assert driver.main(["run", "--dry-run", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert f"{len(runs)} run(s) done earlier, skipped; 0 to do" in again
    assert "pinned by earlier runs" in again
    assert len(driver.read_runs([out / driver.RUNS_FILE])) == len(runs)


def test_part_2_dry_run_end_to_end_then_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    done, seconds = dry_run(out, "--part", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = driver.FILES[2]
    assert sorted(path.name for path in out.iterdir()) == sorted(
        [files.runs, files.plan, files.log, files.results, files.plot])
    runs = driver.read_runs([out / files.runs], 2)
    names = sorted(name for name, _ in driver.VARIANTS)
    assert sorted((run["task"], run["variant"]) for run in runs) == sorted(
        (task, name) for task in driver.TASKS for name in names)
    assert not driver.read_runs([out], 1)  # the parts are never mixed
    plan = json.loads((out / files.plan).read_text())
    assert plan["part"] == 2 and plan["corpus"]["sha256"] and plan["corpus"]["tokenizer_sha256"]
    # the timing's step count is raised to MQAR's calibrated floor, then capped by the dry run's 4 steps
    assert plan["fitted_steps"] >= 1500 or "raised to the floor of 1500" in plan["steps_from"]
    assert plan["steps"] == 4
    assert plan["predicted_seconds_per_seed"] > 0
    warmup = plan["task_steps"]["mqar"]["copy_warmup_steps"]
    assert warmup >= 1 and plan["task_steps"]["passkey"]["copy_warmup_steps"] == 0
    for run in runs:
        assert run["part"] == 2 and run["dry_run"] and run["copy_warmup_steps"] == (
            warmup if run["task"] == "mqar" else 0)
        assert {row["length"] for row in run["rows"]} == set(driver.DRY_TASK_SETTINGS.eval_lengths)
        assert all(0 <= row["accuracy"] <= 1 for row in run["rows"])
    results = (out / files.results).read_text()
    assert "part 2: retrieval" in results and "not resolved (1 of 3 seeds)" in results
    assert "| passkey |" in results and "| mqar |" in results
    assert seconds < 60, f"the dry run took {seconds:.0f} CPU seconds"

    # the rerun in this process (the shell's steps ran above): it skips every run
    assert driver.main(["run", "--dry-run", "--part", "2", "--out", str(out)]) == 0
    assert f"{len(runs)} run(s) done earlier, skipped; 0 to do" in capsys.readouterr().out
    assert len(driver.read_runs([out / files.runs], 2)) == len(runs)


def fake_planned() -> list:
    return [driver.Planned(name, None, {"hidden_size": 8}, {"non_embedding": 1})
            for name, _ in driver.VARIANTS]


def test_a_budget_that_set_up_and_evaluation_fill_trains_the_floor() -> None:
    """``choose_steps`` gives 0 steps, not an error, when the set-up and evaluation of every variant fill the
    budget: the run then trains the settings' floor and its plan says so (a lease always writes its plan)."""
    planned = [driver.Planned(name=name, variant=SimpleNamespace(eval_modes=("default",)), fields={},
                              parameters={}) for name in ("a", "b")]
    timing = {"seconds_per_step": 0.1, "setup_seconds": 200.0, "eval_forward_seconds": 0.01}
    timings = {p.name: timing for p in planned}
    assert driver.choose_steps(timings, planned, driver.Settings(), 360.0) == 0
    assert driver.choose_steps(timings, planned, driver.Settings(), 1000.0) > 0


def test_a_changed_corpus_skips_nothing() -> None:
    settings = driver.DRY_SETTINGS
    corpus = {"sha256": "a" * 64, "tokenizer_sha256": "t" * 64, "python": "3.12.3"}
    planned = fake_planned()
    done = [{"fingerprint": driver.run_fingerprint(p, 0, settings, 4, corpus), "corpus": corpus,
             "settings": json.loads(json.dumps(driver.asdict(settings)))} for p in planned]
    todo, skipped, note = driver.pending(planned, [0], settings, 4, corpus, done)
    assert (len(todo), skipped, note) == (0, len(planned), "")
    other = {**corpus, "sha256": "b" * 64, "python": "3.11.7"}
    todo, skipped, note = driver.pending(planned, [0], settings, 4, other, done)
    assert (len(todo), skipped) == (len(planned), 0)
    assert "a different corpus" in note and "3.12.3" in note
    todo, skipped, _ = driver.pending(planned, [0], settings, 5, corpus, done)  # another step count
    assert (len(todo), skipped) == (len(planned), 0)


def test_data_tables_are_never_held_out() -> None:
    """Perplexity at 16k tokens is read on code: the standard library's generated tables (``html/entities.py``
    on every Python, ``_sysconfigdata_*.py`` on the device's 3.12) would train, but not be held out."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert driver.table_share((stdlib / "html" / "entities.py").read_text()) >= driver.DATA_TABLE_SHARE
    for code in ("argparse.py", "inspect.py", "tarfile.py"):
        assert driver.table_share((stdlib / code).read_text()) < 0.3, code
    entries = "".join(f"    'KEY{i}': '/usr/lib/{i}',\n" for i in range(50))
    generated = "# generated\nbuild_time_vars = {\n" + entries
    assert driver.table_share(generated + "}\n") > 0.9
    constants = "".join(f"NAME_{i} = {i}  # the {i}th\n" for i in range(9)) + "def f(x):\n    return x + 1\n"
    assert driver.table_share(constants) == 9 / 11
    assert driver.table_share("") == 0.0


@pytest.mark.parametrize(("argv", "flag"), [
    (["--out", "FILE"], "--out"), (["--budget", "0"], "--budget"), (["--budget", "-5"], "--budget"),
    (["--deadline", "700"], "--deadline"), (["--seeds", "1", "1"], "--seeds"),
    (["--variants", "nope"], "--variants"), (["--steps", "0"], "--steps"), (["--part", "3"], "--part"),
])
def test_bad_arguments_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                     flag: str) -> None:
    (tmp_path / "FILE").write_text("x")
    argv = [str(tmp_path / "FILE") if a == "FILE" else a for a in argv]
    flags = argv if "--out" in argv else ["--out", str(tmp_path), *argv]
    status = driver.main(["run", "--dry-run", *flags])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and f": {flag}: " in err, err


@pytest.mark.parametrize("part", [1, 2])
def test_publish_without_runs(tmp_path: Path, part: int) -> None:
    text = driver.publish([tmp_path / "empty"], tmp_path / "published", part)
    assert "No runs yet" in text and f"part {part}" in text
    assert (tmp_path / "published" / driver.FILES[part].results).read_text() == text


def test_the_issue_29_rule() -> None:
    def runs(losses_a: list[float], losses_b: list[float]) -> list[dict]:
        return [{"seed": seed, "rows": [{"series": "a", "length": 512, "loss": la},
                                        {"series": "b", "length": 512, "loss": lb}]}
                for seed, (la, lb) in enumerate(zip(losses_a, losses_b))]

    assert driver.verdict(runs([1.0, 1.0, 1.0], [1.1, 1.2, 1.05]), "a", "b", 512)[0] == "**holds**"
    assert driver.verdict(runs([1.2, 1.2, 1.2], [1.1, 1.0, 1.05]), "a", "b", 512)[0] == "**fails**"
    assert driver.verdict(runs([1.0, 1.0], [1.1, 1.2]), "a", "b", 512)[0] == "not resolved (2 of 3 seeds)"
    assert driver.verdict(runs([1.0, 1.0, 1.0], [1.1, 0.95, 1.2]), "a", "b", 512)[0].startswith(
        "not resolved (sign")
    assert driver.verdict(runs([1.0, 1.0, 1.0], [1.01, 1.0, 1.0]), "a", "b", 512)[0].startswith(
        "not resolved (mean")


def test_the_issue_29_rule_on_accuracy() -> None:
    def runs(accuracy_a: list[float], accuracy_b: list[float]) -> list[dict]:
        return [{"seed": seed, "rows": [{"series": "a", "length": 512, "accuracy": xa},
                                        {"series": "b", "length": 512, "accuracy": xb}]}
                for seed, (xa, xb) in enumerate(zip(accuracy_a, accuracy_b))]

    assert driver.verdict(runs([0.9, 0.8, 1.0], [0.5, 0.7, 0.9]), "a", "b", 512, "accuracy")[0] == "**holds**"
    assert driver.verdict(runs([0.5, 0.7, 0.9], [0.9, 0.8, 1.0]), "a", "b", 512, "accuracy")[0] == "**fails**"
    assert driver.verdict(runs([0.9, 0.9, 0.9], [0.88, 0.86, 0.9]), "a", "b", 512, "accuracy")[0] == (
        f"not resolved (mean difference below {driver.TASK_MARGIN})")


def test_absorb_refuses_dry_runs_and_adds_new_runs_once(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    lease.mkdir()
    record = {"fingerprint": "f1", "base_fingerprint": "b", "dry_run": False}
    driver.append_run(lease / driver.RUNS_FILE, record)
    committed = tmp_path / "committed"
    assert driver.absorb(lease, committed) == 1
    assert driver.absorb(lease, committed) == 0
    driver.append_run(lease / driver.FILES[2].runs, {**record, "fingerprint": "r1", "part": 2})
    assert driver.absorb(lease, committed) == 1
    part_2 = driver.read_runs([committed / driver.FILES[2].committed], 2)
    assert [run["fingerprint"] for run in part_2] == ["r1"]
    assert [run["fingerprint"] for run in driver.read_runs([committed])] == ["f1"]
    driver.append_run(lease / driver.RUNS_FILE, {**record, "fingerprint": "f2", "dry_run": True})
    with pytest.raises(driver.UsageError, match="dry-run"):
        driver.absorb(lease, committed)


def test_a_loss_that_is_not_finite_resolves_nothing() -> None:
    runs = [{"seed": seed, "rows": [{"series": "a", "length": 512, "loss": la},
                                    {"series": "b", "length": 512, "loss": 1.5}]}
            for seed, la in enumerate([float("nan"), 1.0, 1.0])]
    assert driver.verdict(runs, "a", "b", 512)[0] == "not resolved (a loss is not finite)"


def test_runs_of_another_step_count_are_not_published_with_the_newest() -> None:
    """A seed's run of one step count would replace another's in the tables (``series_losses``)."""
    runs = [{"base_fingerprint": "b", "steps": 500, "seed": 0}, {"base_fingerprint": "b", "steps": 600,
                                                                  "seed": 0},
            {"base_fingerprint": "b", "steps": 600, "seed": 1}]
    kept, note = driver.publishable(runs)
    assert kept == runs[1:] and note.startswith("1 run(s) of other settings, another corpus or another step")


def test_later_leases_train_the_step_count_that_is_published() -> None:
    """The newest run's count, which ``publishable`` keeps; the largest (as before) would train runs after a
    ``--steps`` lease that are never published."""
    runs = [{"base_fingerprint": "b", "steps": 600}, {"base_fingerprint": "other", "steps": 700},
            {"base_fingerprint": "b", "steps": 500}]
    assert driver.pinned_steps(runs, "b") == 500 == driver.publishable(runs[::2])[0][-1]["steps"]
    assert driver.pinned_steps(runs, "none") is None


def test_publish_names_runs_that_do_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to print "No runs yet" and exit 0 for a mistyped path."""
    assert driver.main(["publish", "--runs", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ": --runs: no such runs file or folder" in err, err


def test_timings_travel_to_the_next_lease_on_the_same_gpu(tmp_path: Path) -> None:
    """A lease that only timed the variants trained nothing; its timings are committed (``absorb``) so that
    the next lease on that GPU does not time them again, and predicts its runs with them."""
    lease, committed = tmp_path / "lease", tmp_path / "committed"
    lease.mkdir()
    timing = {"seconds_per_step": 0.05, "first_setup_seconds": 30.0, "setup_seconds": 2.0,
              "eval_forward_seconds": 0.1, "compiled": True, "compile_error": None}
    plan = {"dry_run": False, "base_fingerprint": "b1", "machine": {"gpu": "NVIDIA H200"},
            "timing": {"llama": timing}}
    (lease / driver.PLAN_FILE).write_text(json.dumps(plan))
    assert driver.absorb(lease, committed) == 0  # no runs: not an error
    assert driver.absorb_timings(lease, committed) == 1
    assert driver.absorb_timings(lease, committed) == 0
    assert driver.committed_timings(committed, 1, "b1", "NVIDIA H200") == {"llama": timing}
    assert driver.committed_timings(committed, 1, "b1", "NVIDIA H100 80GB HBM3") == {}  # another GPU
    assert driver.committed_timings(committed, 1, "b2", "NVIDIA H200") == {}  # another corpus or settings
    assert driver.committed_timings(committed, 1, "b1", None) == {}  # the CPU: time again
    assert driver.committed_timings(committed, 2, "b1", "NVIDIA H200") == {}
    plan["timing"] = {"gau_flash": {**timing, "compiled": False}}
    (lease / driver.PLAN_FILE).write_text(json.dumps(plan))
    assert driver.absorb_timings(lease, committed) == 1
    assert set(driver.committed_timings(committed, 1, "b1", "NVIDIA H200")) == {"llama", "gau_flash"}
    (lease / driver.PLAN_FILE).write_text(json.dumps({**plan, "dry_run": True}))
    assert driver.absorb_timings(lease, committed) == 0


def test_the_deadline_counts_from_the_commands_start(monkeypatch) -> None:
    monkeypatch.setenv("GPU_STUDY_T0", str(int(driver.time.time()) - 20))
    assert 19 <= driver.since_command_start() <= 22
    monkeypatch.setenv("GPU_STUDY_T0", "soon")
    assert driver.since_command_start() == 0.0


def test_a_diverged_run_is_recorded_as_diverged(tmp_path: Path, monkeypatch) -> None:
    """A run whose training loss is not finite is recorded, marked: seeded, it would diverge again in every
    lease. Its verdicts are not resolved, and the published results name it."""
    real = driver.train_and_evaluate

    def diverged(*args, **kwargs):
        return {**real(*args, **kwargs), "final_train_loss": float("nan")}

    monkeypatch.setattr(driver, "train_and_evaluate", diverged)
    out = tmp_path / "out"
    assert driver.main(["run", "--dry-run", "--out", str(out), "--variants", "llama", "--steps", "2"]) == 0
    (run,) = driver.read_runs([out / driver.RUNS_FILE])
    assert run["diverged"] is True
    assert json.loads((out / driver.PLAN_FILE).read_text())["diverged_runs"] == ["llama seed 0"]
    _, kept, note = driver.results_start([run], 1)
    assert kept == [run] and "Diverged (training loss not finite; recorded, so not retrained" in note
    assert note.endswith("`llama` seed 0.")


def test_a_later_lease_times_only_what_it_has_no_timing_of(tmp_path: Path, monkeypatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """On the same GPU, corpus and settings, the committed timings are reused: a variant is timed again only
    when its timing is of another config, compile mode, torch or package version (``timed_as``)."""
    monkeypatch.setattr(driver, "machine", lambda: {"gpu": "NVIDIA H200 (test)"})
    committed, first = tmp_path / "committed", tmp_path / "first"
    argv = ["run", "--dry-run", "--variants", "llama", "gau_flash", "--committed", str(committed)]
    assert driver.main([*argv, "--out", str(first)]) == 0
    timed = [line for line in capsys.readouterr().out.splitlines() if "gpu-study: timing " in line]
    assert len(timed) == 2, timed
    plan = json.loads((first / driver.PLAN_FILE).read_text())
    (first / driver.PLAN_FILE).write_text(json.dumps({**plan, "dry_run": False}))  # as a lease's would be
    assert driver.absorb_timings(first, committed) == 2
    stored = json.loads((committed / "timing.json").read_text())
    stored["timing"]["gau_flash"]["timed_as"]["torch"] = "0.0"  # timed with another torch
    (committed / "timing.json").write_text(json.dumps(stored))
    assert driver.main([*argv, "--out", str(tmp_path / "second")]) == 0
    timed = [line for line in capsys.readouterr().out.splitlines() if "gpu-study: timing " in line]
    assert [line.split(":")[1].split()[1] for line in timed] == ["gau_flash"], timed
    plan = json.loads((tmp_path / "second" / driver.PLAN_FILE).read_text())
    assert plan["timing_committed"] == ["llama"] and set(plan["timing"]) == {"llama", "gau_flash"}


@pytest.mark.parametrize(("below", "compile_model", "resets"), [
    ((99, 0), True, 1),  # an older torch: every compiled variant starts from cleared compiled code
    ((2, 0), True, 0),  # the device's torch and later: the compiled code is kept across variants
    ((99, 0), False, 0),  # nothing compiled, nothing to clear
])
def test_variants_compiled_on_an_old_torch_start_from_cleared_compiled_code(
        monkeypatch: pytest.MonkeyPatch, below: tuple[int, int], compile_model: bool, resets: int) -> None:
    """Below ``STALE_CONFIG_BELOW`` dynamo guards no Transformers config attribute, and a variant compiled
    after another could keep the config fields Transformers reads in ``forward`` (ours are read when built:
    tests/test_packed_documents.py): ``new_trainer`` calls ``torch.compiler.reset()`` before compiling there,
    and only there."""
    calls: list[int] = []
    monkeypatch.setattr(driver, "STALE_CONFIG_BELOW", below)
    monkeypatch.setattr(torch.compiler, "reset", lambda: calls.append(1))
    monkeypatch.setattr(torch, "compile", lambda model: model)
    monkeypatch.setattr(driver, "build_model", lambda *args: torch.nn.Linear(2, 2))
    device = driver.Device(torch.device("cpu"), "fp32")
    trainer = driver.new_trainer(fake_planned()[0], driver.DRY_SETTINGS, None, device, 4, 0, compile_model)
    assert len(calls) == resets and (trainer.compiled is not None) == compile_model
