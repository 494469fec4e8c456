"""``hf-attn-variants bench``: the --quick smoke run writes a results file, its report and plots; a partial
run never touches the committed report; ``--merge`` marks the rows it replaced; docs/benchmarks.md is the
rendering of docs/results/benchmarks-cpu.json; the pieces the run is built from measure what they claim.
No timing assertions (the CI machine is shared)."""

from __future__ import annotations

import datetime
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hf_attn_variants.bench.measure import make_step, peak_step_memory, time_step
from hf_attn_variants.bench.report import REPORT_MARK, paired_ratio
from hf_attn_variants.bench.runner import BenchRun, Result
from hf_attn_variants.bench.specs import COMPARISONS, PRESETS, build_variants, select
from hf_attn_variants.bench.store import from_results, merge_closure, to_results
from hf_attn_variants.cli import SUBCOMMANDS, main
from hf_attn_variants.cli_utils import plain_mode
from hf_attn_variants.records import numerics_environment
from tools.docs_results import REGION, load_results, markdown_files, render_docs

# What a run from Python records as its command (the environment it ran under is recorded beside it).
CALLED_FROM_PYTHON = "hf-attn-variants bench (called from Python)"

ROOT = Path(__file__).resolve().parents[1]


def test_bench_is_a_subcommand() -> None:
    assert SUBCOMMANDS["bench"][0] == "hf_attn_variants.bench.cli"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """One ``bench --quick`` in a folder of its own: its results file (runs/bench-quick/benchmarks.json)."""
    folder = tmp_path_factory.mktemp("quick")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        assert main(["bench", "--quick"]) == 0
    return folder / "runs" / "bench-quick" / "benchmarks.json"


def _repository(root: Path, results: Path) -> str:
    """A repository root whose committed results are ``results``, rendered into docs/benchmarks.md and a
    README paragraph the way the real ones are; returns the rendered docs/benchmarks.md."""
    (root / "docs" / "results").mkdir(parents=True)
    shutil.copy(results, root / "docs" / "results" / "benchmarks-cpu.json")
    (root / "docs" / "benchmarks.md").write_text("# Benchmarks\n\n<!-- results: benchmarks-cpu report -->\n"
                                                 "<!-- /results -->\n")
    (root / "README.md").write_text("Intro.\n\n<!-- results: benchmarks-cpu speed_summary -->\n<!-- /results "
                                    "-->\n")
    assert render_docs(root) == [f"{root / 'README.md'}: re-rendered",
                                 f"{root / 'docs' / 'benchmarks.md'}: re-rendered"]
    return (root / "docs" / "benchmarks.md").read_text()


def test_quick_run_writes_results_report_and_plots(quick_run) -> None:
    folder = quick_run.parent
    text = (folder / "benchmarks.md").read_text()
    for heading in ("## Setup", "## Targets", "## Results", "Encoder:", "Decoder:", "GAU:", "Synthesizer",
                    "head pruning",
                    "before/after", "Training loop: `pretrain` vs transformers' `Trainer`, CLM", "## GPU",
                    "A run of its own"):
        assert heading in text, heading
    assert "torch " + torch.__version__ in text and "{{" not in text
    assert (folder / "benchmarks_time.png").stat().st_size > 0
    assert (folder / "benchmarks_memory.png").stat().st_size > 0
    data = json.loads(quick_run.read_text())
    assert data["kind"] == "bench" and data["command"] == CALLED_FROM_PYTHON
    assert data["machine"]["load_average_start"] and data["versions"]["torch"] == torch.__version__
    # e.g. MKL_VENDOR and LD_PRELOAD, when set
    assert data["machine"]["environment"] == numerics_environment()
    ok = [r for r in data["results"] if r["status"] == "ok"]
    assert {r["phase"] for r in ok} == {"train", "infer"}
    assert {r["variant"] for r in ok} >= {"bert_sdpa", "ei_sdpa", "llama_sdpa", "ei_decoder_sdpa",
                                          "gau_quadratic",
                                          "gau_flash", "syn_random", "syn_vanilla", "ei_8h_pruned50",
                                          "gau_quadratic_reference"}
    for result in ok:
        assert len(result["cpu_ms"]) == len(result["wall_ms"]) >= 1
        # a training loop's row (tests/test_bench_loops.py): times per optimizer step, no peak
        if "loop" in result:
            loop = result["loop"]
            assert loop["steps_done"] == [loop["steps"]] and len(loop["train_loss"]) == 1
        else:
            assert result["peak_bytes"] > 0 and result["flops"] > 0
    assert {r["variant"] for r in ok if "loop" in r} == {"pretrain_clm", "trainer_clm", "pretrain_mlm",
                                                         "trainer_mlm"}
    # the file holds everything the report is computed from: a round trip changes nothing
    assert to_results(from_results(data)) == data


def test_report_only_re_renders_the_same_report(quick_run, tmp_path) -> None:
    again = tmp_path / "again" / "benchmarks.md"
    copy = tmp_path / "again" / "benchmarks.json"
    again.parent.mkdir()
    shutil.copy(quick_run, copy)
    original = (quick_run.parent / "benchmarks.md").read_text()
    assert main(["bench", "--report-only", str(copy)]) == 0
    assert again.read_text() == original.replace("`runs/bench-quick/benchmarks.json`", f"`{copy}`")
    assert (tmp_path / "again" / "benchmarks_time.png").is_file()


def test_a_partial_run_leaves_the_committed_report_alone(quick_run, tmp_path, monkeypatch) -> None:
    committed = _repository(tmp_path, quick_run)
    results = (tmp_path / "docs" / "results" / "benchmarks-cpu.json").read_text()
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "decoder", "--no-plots"]) == 0
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == committed
    assert (tmp_path / "docs" / "results" / "benchmarks-cpu.json").read_text() == results
    own = (tmp_path / "runs" / "bench-quick" / "benchmarks.md").read_text()
    assert "### Decoder:" in own and "### Encoder:" not in own and "A run of its own" in own


@pytest.mark.parametrize("flags", [["--only", "gau_optimisation"], ["--only", "encoder", "decoder"],
                                   ["--lengths", "512"], ["--repeats", "3"], ["--no-compile"]])
def test_partial_flags_write_under_runs_from_the_repository_root(flags, monkeypatch) -> None:
    import argparse

    from hf_attn_variants.bench.cli import add_arguments, plan

    monkeypatch.chdir(ROOT)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bench_plan = plan(parser.parse_args(flags))
    assert bench_plan.target == "own"
    assert bench_plan.output.parts[0] == "runs" and bench_plan.json_path.parts[0] == "runs"


def test_only_publish_writes_the_committed_results(monkeypatch) -> None:
    """A full run writes under runs/ too; only ``--publish`` (make bench) and ``--merge`` write docs/."""
    import argparse

    from hf_attn_variants.bench.cli import add_arguments, plan

    monkeypatch.chdir(ROOT)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    full = plan(parser.parse_args([]))
    assert full.target == "own" and full.output == Path("runs/bench/cpu/benchmarks.md")
    assert full.json_path == Path("runs/bench/cpu/benchmarks.json")
    assert plan(parser.parse_args(["--publish"])).target == "committed"
    committed = plan(parser.parse_args(["--report-only", "docs/results/benchmarks-cpu.json"]))
    assert committed.target == "own" and committed.output.parts[0] == "runs"
    published = plan(parser.parse_args(["--publish", "--report-only", "docs/results/benchmarks-cpu.json"]))
    assert published.target == "committed"
    monkeypatch.chdir(ROOT / "tests")  # not the repository root: no docs/ is created here
    with pytest.raises(ValueError, match="there is no docs/results/ here: run it from the repository root"):
        plan(parser.parse_args(["--publish"]))


def test_merge_replaces_rows_and_marks_them(quick_run, tmp_path, monkeypatch) -> None:
    _repository(tmp_path, quick_run)
    before = load_results(tmp_path, "benchmarks-cpu")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "ei_decoder_sdpa", "--merge", "--no-plots"]) == 0
    assert render_docs(tmp_path, check=True) != []  # bench writes the results file; the repository renders it
    render_docs(tmp_path)
    after = load_results(tmp_path, "benchmarks-cpu")
    (entry,) = after["replaced"]
    assert entry["merge"] == 1 and entry["command"] == CALLED_FROM_PYTHON
    assert entry["date"] and entry["load_average_start"] and entry["rows_added"] == []
    # --only ei_decoder_sdpa re-measured its whole comparison, baseline included, so ratios pair one run
    replaced = {(v, m, p, n) for v, m, p, n, _ in entry["rows_replaced"]}
    assert replaced == {(v, "eager", p, n) for v in ("llama_sdpa", "ei_decoder_sdpa")
                        for p in ("train", "infer")
                        for n in (32, 64)}
    merged = {(r["variant"], r["mode"], r["phase"], r["n"]) for r in after["results"] if r.get("merge") == 1}
    assert merged == replaced
    untouched = [r for r in after["results"] if r.get("merge") != 1]
    assert untouched == [r for r in before["results"]
                         if (r["variant"], r["mode"], r["phase"], r["n"]) not in replaced]
    report = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "`ei_decoder_sdpa` [merge 1]" in report and f"**merge 1**: `{CALLED_FROM_PYTHON}" in report
    assert "`bert_sdpa` [merge" not in report
    assert "| partial re-runs merged | 1 |" in (tmp_path / "README.md").read_text()
    assert render_docs(tmp_path, check=True) == []


def _ctrl_c_in(monkeypatch, phase: str) -> None:
    """Ctrl-C (``KeyboardInterrupt``) at the first timed step of ``phase``."""
    from hf_attn_variants.bench import runner as runner_module

    phases: list[str] = []
    measure, timer = runner_module.Runner._measure_phase, runner_module.time_step

    def measure_phase(self, entries, this_phase, input_ids):
        phases.append(this_phase)
        return measure(self, entries, this_phase, input_ids)

    def time_step(step, device):
        if phases[-1] == phase:
            raise KeyboardInterrupt
        return timer(step, device)

    monkeypatch.setattr(runner_module.Runner, "_measure_phase", measure_phase)
    monkeypatch.setattr(runner_module, "time_step", time_step)


def test_ctrl_c_keeps_the_rows_measured_before_it(tmp_path, monkeypatch, capsys) -> None:
    _ctrl_c_in(monkeypatch, "infer")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "decoder", "--no-plots"]) == 130
    data = json.loads((tmp_path / "runs" / "bench-quick" / "benchmarks.json").read_text())
    # the train phase at the first length finished; the infer phase it stopped in is dropped whole
    assert {(row["phase"], row["n"], row["status"]) for row in data["results"]} == {("train", 32, "ok")}
    assert all(row["cpu_ms"] for row in data["results"])
    assert data["interrupted"].startswith("stopped by Ctrl-C during the infer phase at n = 32: ")
    assert from_results(data).interrupted == data["interrupted"]
    report = (tmp_path / "runs" / "bench-quick" / "benchmarks.md").read_text()
    assert report.startswith("# Benchmarks (smoke test) — interrupted\n")
    assert f"> Interrupted: {data['interrupted']}." in report and "### Decoder:" in report
    out, err = capsys.readouterr()
    assert "wrote runs/bench-quick/benchmarks.md, runs/bench-quick/benchmarks.json" in out
    assert err.count("\n") == 1 and err.startswith("hf-attn-variants bench: interrupted: stopped by Ctrl-C")
    assert "rerun with --only or --lengths" in err
    # a rerun replaces the interrupted run's files (they are its own)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "decoder", "--no-plots"]) == 0
    rerun = json.loads((tmp_path / "runs" / "bench-quick" / "benchmarks.json").read_text())
    assert "interrupted" not in rerun


def test_a_runner_called_from_python_raises_ctrl_c_again(monkeypatch) -> None:
    """``Runner.run_all`` keeps what it measured in ``runner.run`` but does not swallow Ctrl-C: a caller's
    loop (the GPU check's bench stage) stops too."""
    from hf_attn_variants.bench.runner import Runner

    _ctrl_c_in(monkeypatch, "infer")
    variants, comparisons = select(PRESETS["quick"], ["decoder"])
    runner = Runner(PRESETS["quick"], variants, comparisons, compile=False, count_flops=False,
                    check_graph_breaks=False, log=lambda line: None)
    with pytest.raises(KeyboardInterrupt):
        runner.run_all()
    assert runner.run.interrupted.startswith("stopped by Ctrl-C during the infer phase at n = 32: ")
    assert {r.phase for r in runner.run.results} == {"train"} and runner.run.elapsed_s > 0


def test_ctrl_c_in_a_merge_keeps_the_committed_results(quick_run, tmp_path, monkeypatch, capsys) -> None:
    _repository(tmp_path, quick_run)
    committed = (tmp_path / "docs" / "results" / "benchmarks-cpu.json").read_text()
    _ctrl_c_in(monkeypatch, "infer")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "ei_decoder_sdpa", "--merge", "--no-plots"]) == 130
    assert (tmp_path / "docs" / "results" / "benchmarks-cpu.json").read_text() == committed
    (folder,) = (tmp_path / "runs" / "bench").iterdir()
    assert re.fullmatch(r"quick-interrupted-\d{8}T\d{6}Z", folder.name), folder.name
    kept = json.loads((folder / "benchmarks.json").read_text())
    assert {row["variant"] for row in kept["results"]} == {"llama_sdpa", "ei_decoder_sdpa"}
    err = capsys.readouterr().err
    assert f"runs/bench/{folder.name}/benchmarks.json" in err
    assert "the committed results are unchanged" in err


def test_each_interrupted_publish_keeps_its_rows_in_a_folder_of_its_own() -> None:
    """Two stopped ``--publish`` runs of one preset: the later replaces nothing of the earlier."""
    from hf_attn_variants.bench.cli import interrupted_files

    bench_plan = SimpleNamespace(target="committed", output=None, preset=PRESETS["quick"])
    first = datetime.datetime(2026, 11, 30, 3, 0, 5, tzinfo=datetime.timezone.utc)
    later = first + datetime.timedelta(seconds=1)
    assert interrupted_files(bench_plan, first) == (
        Path("runs/bench/quick-interrupted-20261130T030005Z/benchmarks.json"),
        Path("runs/bench/quick-interrupted-20261130T030005Z/benchmarks.md"))
    assert interrupted_files(bench_plan, later)[0].parent != interrupted_files(bench_plan, first)[0].parent
    own = SimpleNamespace(target="own", output=Path("mine/b.md"), json_path=Path("mine/b.json"),
                          preset=PRESETS["quick"])
    assert interrupted_files(own, first) == (Path("mine/b.json"), Path("mine/b.md"))


def test_ctrl_c_before_any_row_writes_nothing(tmp_path, monkeypatch, capsys) -> None:
    _ctrl_c_in(monkeypatch, "train")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "decoder", "--no-plots"]) == 130
    assert not (tmp_path / "runs").exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing was measured, nothing written." in err


@pytest.mark.parametrize(("flags", "message"), [
    (["--merge"], "--merge merges a partial run"),
    (["--only", "decoder", "--merge", "--no-compile"],
     "--merge: the committed results were measured with preset name"),
    (["--quick", "--only", "decoder", "--merge", "--output", "x.md"],
     "--output: --merge writes the committed"),
    (["--quick", "--output", "docs/benchmarks.md"], "--output 'docs/benchmarks.md' is the committed report"),
    (["--quick", "--publish"], "--publish rewrites the committed results from a full run, but --quick"),
    (["--publish", "--output", "x.md"], "--output: --publish writes the committed results"),
])
def test_bad_merges_exit_with_one_line(flags, message, quick_run, tmp_path, monkeypatch, capsys) -> None:
    _repository(tmp_path, quick_run)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(("flags", "files", "message"), [
    (["--quick", "--only", "decoder", "--output", "README.md"], {"README.md": "MY README"},
     "--output: 'README.md' exists and is not from an earlier run of `hf-attn-variants bench` (its results "
     "file 'README.json' is not there)"),
    (["--quick", "--only", "decoder", "--output", "notes.md"], {"notes.json": "{}", "notes_time.png": "x"},
     "--output: 'notes.json' exists and is not from an earlier run of `hf-attn-variants bench` (its results "
     "file 'notes.json' is not one)"),
    (["--quick", "--output", "n.md"], {"n_time.png": "x"}, "'n_time.png' exists and is not from an earlier"),
    (["--quick", "--no-plots", "--output", "res.json"], {},
     "--output: 'res.json' would be both the results file and the report"),
    (["--quick", "--output", "a.md", "--json", "a.md"], {}, "'a.md' would be both the results file and the"),
    (["--report-only", "keep.json", "--output", "keep.json"], {"keep.json": None},
     "--output: the report 'keep.json' would be written over --report-only 'keep.json'"),
    (["--quick", "--only", "decoder", "--output", "docs/benchmarks.txt"], {},
     "--output: the time plot 'docs/benchmarks_time.png' would be the committed plot"),
    (["--quick", "--only", "decoder", "--output", "docs/results/benchmarks-cpu.md"], {},
     "--output: the results file 'docs/results/benchmarks-cpu.json' would be the committed results"),
])
def test_no_file_the_bench_did_not_write_is_replaced(flags, files, message, quick_run, tmp_path, monkeypatch,
                                                     capsys) -> None:
    """A report of its own names its results file and plots after ``--output``: none may replace a file of
    the user's, the results it reads, another of its own files, or a committed file; nothing is measured."""
    _repository(tmp_path, quick_run)
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(quick_run.read_text() if text is None else text)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_report_of_its_own_is_replaced_by_its_rerun(quick_run, tmp_path) -> None:
    copy = tmp_path / "results.json"
    shutil.copy(quick_run, copy)
    report = tmp_path / "report.md"
    for _ in range(2):
        assert main(["bench", "--report-only", str(copy), "--output", str(report)]) == 0
    assert report.read_text().rstrip().endswith(REPORT_MARK) and (tmp_path / "report_time.png").is_file()
    assert oct(report.stat().st_mode & 0o777) == oct(plain_mode())
    # a report written before the mark is still the command's own
    report.write_text(report.read_text().replace(REPORT_MARK, ""))
    assert main(["bench", "--report-only", str(copy), "--output", str(report)]) == 0
    report.chmod(0o640)  # a mode you chose stays
    assert main(["bench", "--report-only", str(copy), "--output", str(report)]) == 0
    assert oct(report.stat().st_mode & 0o777) == oct(0o640)


def test_a_results_file_named_alone_gets_its_report_beside_it(tmp_path, monkeypatch) -> None:
    import argparse

    from hf_attn_variants.bench.cli import add_arguments, plan

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    own = plan(parser.parse_args(["--quick", "--json", "out/other.json"]))
    assert own.json_path == Path("out/other.json") and own.output == Path("out/other.md")


def test_merge_without_committed_results_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "decoder", "--merge"]) == 2
    err = capsys.readouterr().err
    assert "--merge: no committed results file 'docs/results/benchmarks-cpu.json' here" in err


def test_merge_closure_covers_comparisons_sharing_a_variant() -> None:
    assert merge_closure({"decoder"}) == {"decoder"}
    assert merge_closure({"gau"}) == {"gau", "gau_optimisation", "peers", "peers_quadratic"}
    assert merge_closure({"loop_clm"}) == {"loop_clm"}


def test_committed_report_is_the_rendering_of_the_committed_results() -> None:
    """docs/benchmarks.md (the report and its speed summary) and the gau/synthesizer tables are views of one
    file."""
    from tools.docs_results import bench as views

    data = load_results(ROOT, "benchmarks-cpu")
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    (region,) = [m for m in REGION.finditer(text) if m["name"] == "benchmarks-cpu" and m["view"] == "report"]
    assert region["body"] == views.report(data).rstrip("\n") + "\n"
    assert text.startswith("# Benchmarks\n\n<!-- results: benchmarks-cpu report -->")
    shown = {(path.name, m["view"]) for path in markdown_files(ROOT)
             for m in REGION.finditer(path.read_text(encoding="utf-8")) if m["name"] == "benchmarks-cpu"}
    assert shown == {("benchmarks.md", "report"), ("benchmarks.md", "speed_summary"), ("gau.md", "gau_table"),
                     ("synthesizer.md", "synthesizer_table")}
    run = from_results(data)
    assert run.preset.name == "cpu" and not [r for r in run.results if r.status == "failed"]
    assert to_results(run) == data


def test_ratios_pair_only_rows_of_one_run() -> None:
    run = BenchRun(PRESETS["quick"], "cpu", "float32", "cpu", 1, {}, COMPARISONS, {})
    run.results = [
        Result("a", "x", "eager", "train", 8, 1, cpu=[2.0], wall=[1]),
        Result("b", "x", "eager", "train", 8, 1, cpu=[1.0], wall=[1], merge=1),
    ]
    assert paired_ratio(run, "a", "b", "eager", "train", 8) is None


def test_peak_memory_sees_transients_freed_elsewhere() -> None:
    """A 16 MB buffer allocated and freed inside an autograd.Function still counts (exact event replay)."""

    class Transient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            buffer = torch.ones(4_000_000)
            return x * buffer[:1]

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = torch.randn(8, requires_grad=True)
    assert peak_step_memory(lambda: Transient.apply(x), torch.device("cpu")) >= 16_000_000


def test_step_timer_and_flop_counter_on_a_tiny_model() -> None:
    from hf_attn_variants.bench.measure import warmup_with_memory_and_flops

    variants = build_variants(PRESETS["quick"])
    model = variants["ei_sdpa"].build(32).train()
    ids = torch.randint(1, 100, (1, 32))
    step = make_step(model, ids, True, None)
    memory, flops = warmup_with_memory_and_flops(step, torch.device("cpu"), count=True)
    # 2 layers of q/k/v/o (4·32²) + FFN (2·32·64) MACs per token, ×2 FLOPs, ×3 for fwd+bwd, at least
    assert flops >= 3 * 2 * 32 * 2 * (4 * 32 * 32 + 2 * 32 * 64)
    assert memory > 0
    elapsed = time_step(step, torch.device("cpu"))
    assert elapsed.wall > 0 and elapsed.cpu >= 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    run = BenchRun(PRESETS["quick"], "cpu", "float32", "cpu", 1, {}, COMPARISONS, {})
    run.results = [
        Result("a", "x", "eager", "train", 8, 1, cpu=[2.0, 2.0, 9.0], wall=[1, 1, 1]),
        Result("b", "x", "eager", "train", 8, 1, cpu=[1.0, 2.0, 3.0], wall=[1, 1, 1]),
    ]
    ratio = paired_ratio(run, "a", "b", "eager", "train", 8)
    assert (ratio.median, ratio.low, ratio.high) == (2.0, 1.0, 3.0)


def test_select_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="--only"):
        select(PRESETS["quick"], ["no_such_variant"])
    variants, comparisons = select(PRESETS["quick"], ["gau_flash"])
    assert set(variants) == {"gau_quadratic", "gau_flash", "flash_pytorch"}
    assert [c.key for c in comparisons] == ["gau", "peers"]


def test_bad_flags_exit_with_a_message(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--repeats", "0", "--output", "/nonexistent/x.md"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --repeats: repeats must be a positive integer" in err


@pytest.mark.parametrize("name",
                         ["ei_sdpa", "ei_decoder_sdpa", "gau_quadratic", "gau_flash", "gau_softmax_plus",
                                  "syn_random_vanilla", "ei_8h_pruned50"])
def test_torch_compile_sees_one_graph_without_breaks(name: str, monkeypatch) -> None:
    """``torch._dynamo.explain`` on a tiny model of every family (GAU through its blocked kernels too)."""
    from hf_attn_variants.bench.measure import graph_breaks
    from hf_attn_variants.models import gau_kernels

    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 256)  # 32×32 scores → 4 blocks
    model = build_variants(PRESETS["quick"])[name].build(32).train()
    graphs, breaks, reasons = graph_breaks(model, torch.randint(1, 100, (1, 32)))
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_llama_at_equal_parameters_has_flash_gau_parameter_count(preset: str) -> None:
    """One Llama layer per two GAU layers, the MLP width solved for FLASH's parameters outside the embeddings:
    equal to 0.1 % where the width is any integer (CPU), to 1 % where it is a multiple of 64 for the tensor
    cores (GPU: 2112, not the exact 2135); built on the meta device (the GPU preset is ~100M parameters)."""
    from hf_attn_variants.bench.specs import PRESETS, gau_model, llama_equal_model

    p = PRESETS[preset]
    with torch.device("meta"):
        llama, gau = llama_equal_model(p, 0), gau_model(p, 0, normalization="relu2", chunk=p.gau_chunk_size,
                                                        causal=True)
    inside = [sum(w.numel() for w in m.parameters()) - m.get_input_embeddings().weight.numel()
              for m in (llama, gau)]
    assert llama.config.num_hidden_layers == (p.gau_layers or p.num_layers) // 2
    assert llama.config.intermediate_size % p.equal_parameter_width_multiple == 0
    tolerance = 1e-3 if p.equal_parameter_width_multiple == 1 else 1e-2
    assert abs(inside[0] - inside[1]) / inside[1] < tolerance, inside


def test_equal_parameter_lengths_run_flash_and_llama_only_and_follow_lengths() -> None:
    """The CPU preset's 4096 and 32768 hold FLASH and Llama at equal parameters only (and, at 32768, FLASH on
    packed documents beside one sequence: issue 38); ``--lengths`` picks them like any other length."""
    import argparse

    from hf_attn_variants.bench.cli import _preset, add_arguments
    from hf_attn_variants.bench.specs import PRESETS, build_variants

    extra = {v.name for v in build_variants(PRESETS["cpu"]).values() if 32768 in v.extra_lengths}
    assert extra == {"gau_flash_causal", "gau_flash_causal_packed", "llama_equal_sdpa"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    preset = _preset(parser.parse_args(["--lengths", "512", "32768"]), cuda=False)
    assert preset.lengths == (512,) and preset.equal_parameter_lengths == (32768,)


def _compiled_runner(monkeypatch, variant_names: list[str], lengths: tuple[int, ...]):
    """A ``Runner`` of the quick preset at ``lengths`` (all compiled) whose ``torch.compile`` uses a backend
    that records each graph it is given and runs it eagerly (seconds, no inductor); returns it and the
    record."""
    from dataclasses import replace

    from hf_attn_variants.bench.runner import Runner

    graphs: list[object] = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real_compile(model, backend=backend))
    preset = replace(PRESETS["quick"], lengths=lengths, compile_lengths=lengths)
    variants = {name: replace(variant, compile=True) for name, variant in build_variants(preset).items()
                if name in variant_names}
    runner = Runner(preset, variants, (), compile=True, count_flops=False, check_graph_breaks=False,
                    log=lambda line: None)
    return runner, graphs


def test_every_compiled_row_is_compiled_past_the_recompile_limit(monkeypatch) -> None:
    """GAU variants share one ``forward`` frame: with dynamo's caches kept across phases and lengths, the
    recompile limit made later "compiled" rows run eagerly, silently. Each phase now starts from fresh
    caches: every compiled row's warm-up hands dynamo's backend a graph of its own."""
    names = ["gau_quadratic", "gau_flash"]
    runner, graphs = _compiled_runner(monkeypatch, names, (16, 32))
    with torch.compiler.config.patch(recompile_limit=2):  # 2 variants a phase, 8 compiled rows in all
        run = runner.run_all()
    compiled = [r for r in run.results if r.mode == "compiled"]
    assert len(compiled) == 8 and all(r.status == "ok" and r.compile_s > 0 for r in compiled)
    assert len(graphs) == len(compiled)


def test_a_compiled_row_past_the_recompile_limit_fails_instead_of_running_eagerly(monkeypatch) -> None:
    """Where even one phase needs more recompiles than dynamo allows, the row fails naming the limit; it is
    never reported as compiled after running eagerly."""
    runner, graphs = _compiled_runner(monkeypatch, ["gau_quadratic", "gau_flash"], (16,))
    with torch.compiler.config.patch(recompile_limit=1):
        run = runner.run_all()
    compiled = [r for r in run.results if r.mode == "compiled"]
    assert {r.status for r in compiled} == {"ok", "failed"}
    assert all("recompile" in r.reason.lower() for r in compiled if r.status == "failed"), compiled
    assert len(graphs) == sum(r.status == "ok" for r in compiled)


def _parse_preset(*flags: str):
    """``cli._preset`` of ``bench flags`` on a CPU machine."""
    import argparse

    from hf_attn_variants.bench.cli import _preset, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return _preset(parser.parse_args(list(flags)), cuda=False)


def test_lengths_pick_the_long_flash_lengths_too() -> None:
    """``--lengths`` filters ``flash_long_lengths`` like ``equal_parameter_lengths``: no 65,536 or 131,072
    tokens unless asked for (nor rows of them replaced by ``--merge --lengths``)."""
    assert _parse_preset("--lengths", "512").flash_long_lengths == ()
    preset = _parse_preset("--lengths", "512", "65536")
    assert preset.lengths == (512,) and preset.flash_long_lengths == (65536,)
    assert _parse_preset().flash_long_lengths == (65536, 131072)


@pytest.mark.parametrize(("flags", "message"), [
    (["--lengths", "32", "10000000000"], "--lengths 10000000000: longer than the 1,048,576 tokens"),
    (["--quick", "--compile-lengths", "48"], "--compile-lengths names lengths to compile, but --quick "
                                             "compiles none"),
    (["--preset", "quick", "--compile-lengths", "48"], "--compile-lengths 48: not among the lengths this run "
                                                       "measures (32 64)"),
    (["--lengths", "512", "--compile-lengths", "2048"], "--compile-lengths 2048: not among the lengths"),
])
def test_lengths_nothing_can_measure_are_refused_up_front(flags, message, tmp_path, monkeypatch,
                                                          capsys) -> None:
    """One error line naming the flag, before anything is built (nothing is written)."""
    from hf_attn_variants.bench.runner import Runner

    def measure(self) -> None:
        raise AssertionError("measured")  # never 80 GB of input ids, nor minutes of a CPU preset, on a slip

    monkeypatch.setattr(Runner, "run_all", measure)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *flags, "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_a_stopped_rerun_keeps_the_whole_run_it_would_replace(quick_run, tmp_path) -> None:
    """Ctrl-C in a rerun into the ``--output`` of a whole run: the stopped run goes beside it, stamped."""
    from hf_attn_variants.bench.cli import interrupted_files

    stopped = datetime.datetime(2026, 11, 30, 3, 0, 5, tzinfo=datetime.timezone.utc)
    shutil.copy(quick_run, tmp_path / "b.json")
    own = SimpleNamespace(target="own", output=tmp_path / "b.md", json_path=tmp_path / "b.json",
                          preset=PRESETS["quick"])
    assert interrupted_files(own, stopped) == (tmp_path / "b-interrupted-20261130T030005Z.json",
                                               tmp_path / "b-interrupted-20261130T030005Z.md")
    data = json.loads(quick_run.read_text())
    (tmp_path / "b.json").write_text(json.dumps({**data, "interrupted": "stopped by Ctrl-C during x"}))
    assert interrupted_files(own, stopped) == (tmp_path / "b.json", tmp_path / "b.md")


@pytest.mark.parametrize("key", ["cpu", "cpu_count", "gpu"])
def test_a_merge_from_another_machine_is_refused(key, quick_run) -> None:
    """Rows timed on another machine are not comparable with the committed ones, whose report's Setup names
    one machine: ``--merge`` refuses them. A kernel update (the platform string) is the same machine."""
    from hf_attn_variants.bench.store import MergeError, merge_results

    committed = json.loads(quick_run.read_text())
    partial = {**committed, "machine": {**committed["machine"], key: "elsewhere"}}
    with pytest.raises(MergeError, match=f"measured on a machine with {key} "):
        merge_results(committed, partial)
    assert merge_results(committed, committed)["results"]
    updated = {**committed, "machine": {**committed["machine"], "platform": "Linux-6.19-other-kernel"}}
    assert merge_results(committed, updated)["results"]


def test_lengths_change_no_learned_position_table() -> None:
    """A partial run (``--lengths``) builds the models, and parameter counts, of the full preset, so that
    ``--merge --lengths`` does not rewrite the table's counts."""
    full = build_variants(PRESETS["cpu"])
    narrowed = build_variants(_parse_preset("--lengths", "512"))
    with torch.device("meta"):
        for name in ("ei_sdpa", "gau_flash_causal", "llama_equal_sdpa", "gau_quadratic"):
            counts = [sum(w.numel() for w in variants[name].build(512).parameters())
                      for variants in (full, narrowed)]
            assert counts[0] == counts[1], name


def test_per_length_models_keep_the_shortest_lengths_parameter_count() -> None:
    """Synthesizer models are built per length (l = n): their counts are kept per length, and ``parameters``
    is the one at the shortest length, not the last built; ``--merge`` joins the per-length counts."""
    from dataclasses import replace

    from hf_attn_variants.bench.runner import Runner
    from hf_attn_variants.bench.store import _merge_variants

    preset = replace(PRESETS["quick"], lengths=(16, 32))
    variants = {"syn_random_vanilla": build_variants(preset)["syn_random_vanilla"]}
    runner = Runner(preset, variants, (), compile=False, log=lambda line: None)
    for n in (16, 32):
        runner._model(variants["syn_random_vanilla"], n)
    info = runner.run.variants["syn_random_vanilla"]
    assert info["parameters_by_length"]["16"] < info["parameters_by_length"]["32"]
    assert info["parameters"] == info["parameters_by_length"]["16"]
    later = {"syn_random_vanilla": {**info, "parameters_by_length": {"64": 1}, "parameters": 1}}
    merged = _merge_variants(runner.run.variants, later)["syn_random_vanilla"]
    assert merged["parameters_by_length"] == {**info["parameters_by_length"], "64": 1}
    assert merged["parameters"] == info["parameters"]


def test_the_report_says_how_many_rounds_and_where_autocast_applies(quick_run) -> None:
    """``--preset quick --repeats 4`` is not "one round"; ``--dtype bfloat16`` autocasts the models' steps
    only, not the training loops."""
    from dataclasses import replace

    from hf_attn_variants.bench.report import _precision, render_report

    run = from_results(json.loads(quick_run.read_text()))
    run.preset = replace(run.preset, repeats=4)
    assert "tiny models, 4 rounds." in render_report(run, source="x.json", committed=False)
    run.dtype = "bfloat16"
    run.results.append(Result("loop_x", "loop", "eager", "train", 32, 1, loop={"loop": "x"}))
    assert _precision(run) == "bfloat16 (autocast) for the models; the training-loop rows run in float32"
