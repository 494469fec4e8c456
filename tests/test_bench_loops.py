"""The training-loop comparison of ``make bench`` (``bench/loops.py``): at the tiniest size our ``pretrain``
loop and transformers' ``Trainer`` train the same tokens from the same weights to the same loss, CLM and MLM;
a partial run merges the comparison, its table and its target into committed results that lacked it. No timing
assertions (the machine is shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_attn_variants.bench.loops import LoopJob, StepClock, measure_loops
from hf_attn_variants.bench.runner import BenchRun, environment
from hf_attn_variants.bench.specs import COMPARISONS, PRESETS, LoopSize, loop_model
from hf_attn_variants.bench.store import from_results, to_results
from hf_attn_variants.cli import main
from tools.docs_results import load_results, render_docs

TINY = LoopSize(length=16, batch_size=2, steps=3, warmup_steps=1)
MODEL = tuple(loop_model(PRESETS["quick"]).items())


@pytest.fixture(scope="module")
def outcomes():
    """One round of both loops, CLM and MLM, at the tiniest size."""
    jobs = {f"{loop}_{objective}": LoopJob(loop, objective, MODEL, TINY)
            for loop in ("pretrain", "trainer") for objective in ("clm", "mlm")}
    return measure_loops(jobs, repeats=1, log=lambda line: None)


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_both_loops_train_the_same_tokens_to_the_same_loss(outcomes, objective) -> None:
    ours, trainer = outcomes[f"pretrain_{objective}"], outcomes[f"trainer_{objective}"]
    for outcome in (ours, trainer):
        assert outcome.error is None
        (run,) = outcome.runs
        assert run.steps == TINY.steps and run.cpu > 0 and run.wall > 0
    ours_run, trainer_run = ours.runs[0], trainer.runs[0]
    assert ours_run.parameters == trainer_run.parameters  # the same model …
    # … from the same weights on the same blocks: a mean loss over every step, equal to float rounding
    assert ours_run.train_loss == pytest.approx(trainer_run.train_loss, rel=1e-4, abs=1e-4)


def test_step_clock_times_the_steps_after_the_warm_up() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with StepClock() as clock:
        for _ in range(3):
            weight.sum().backward()
            optimizer.step()
    optimizer.step()  # after the block: not recorded
    assert len(clock.stamps) == 3
    wall, cpu = clock.mean_step(1)
    assert wall == pytest.approx((clock.stamps[2][0] - clock.stamps[0][0]) / 2) and cpu >= 0
    with pytest.raises(RuntimeError, match="too few"):
        clock.mean_step(3)
    with pytest.raises(ValueError, match="warmup_steps"):
        LoopSize(steps=2, warmup_steps=0)


def _committed_without_loops(root: Path) -> None:
    """A repository whose committed results (preset quick, no rows) predate the loop comparison."""
    comparisons = tuple(c for c in COMPARISONS if not c.key.startswith("loop"))
    run = BenchRun(PRESETS["quick"], "cpu", "float32", "cpu", 1, environment(torch.device("cpu")),
                   comparisons, {})
    run.environment["command"] = "hf-attn-variants bench --quick"
    (root / "docs" / "results").mkdir(parents=True)
    (root / "docs" / "results" / "benchmarks-cpu.json").write_text(json.dumps(to_results(run)))
    (root / "docs" / "benchmarks.md").write_text("# Benchmarks\n\n<!-- results: benchmarks-cpu report -->\n"
                                                 "<!-- /results -->\n")
    (root / "README.md").write_text("Intro.\n\n<!-- results: benchmarks-cpu speed_summary -->\n<!-- /results "
                                    "-->\n")


def test_a_merged_loop_run_adds_its_rows_table_and_target(tmp_path, monkeypatch) -> None:
    _committed_without_loops(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", "--only", "loop_clm", "--merge", "--no-plots"]) == 0
    render_docs(tmp_path)  # bench writes the results file; the repository's renderer shows it in docs/
    data = load_results(tmp_path, "benchmarks-cpu")
    (entry,) = data["replaced"]
    assert entry["rows_replaced"] == [] and sorted(entry["rows_added"]) == [
        ["pretrain_clm", "eager", "train", 32], ["trainer_clm", "eager", "train", 32]]
    assert [c["key"] for c in data["comparisons"]][-1] == "loop_clm"
    rows = {row["variant"]: row for row in data["results"]}
    for name in ("pretrain_clm", "trainer_clm"):
        loop = rows[name]["loop"]
        assert rows[name]["status"] == "ok" and rows[name]["merge"] == 1 and len(rows[name]["cpu_ms"]) == 1
        assert loop["tokens_per_step"] == 2 * 32 and loop["steps_done"] == [loop["steps"]]
    losses = {name: rows[name]["loop"]["train_loss"] for name in ("pretrain_clm", "trainer_clm")}
    assert losses["pretrain_clm"] == pytest.approx(losses["trainer_clm"], rel=1e-4)
    report = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "### Training loop: `pretrain` vs transformers' `Trainer`, CLM" in report
    assert "| `pretrain` loop ≥ 0.95× `Trainer`'s tokens/s, CLM, 2 × 32 tokens per step" in report
    assert "`pretrain_clm` [merge 1] | 2 × 32 | 1 × 3 |" in report
    assert render_docs(tmp_path, check=True) == []
    assert to_results(from_results(data)) == data
