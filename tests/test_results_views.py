"""The results files of the studies (docs/results/*.json) carry their provenance and render, and the writers
of the measuring scripts produce data their views render (the repository's ``tools.docs_results.<kind>``)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tools.docs_results import (
    REGION,
    RESULTS_DIR,
    load_results,
    markdown_files,
    render_markdown,
    view_function,
    write_results,
)
from tools.docs_results._common import PROVENANCE_FIELDS, signed, source_line

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / RESULTS_DIR).glob("*.json"))


def load_script(name: str):
    """``scripts/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", RESULTS, ids=[p.stem for p in RESULTS])
def test_every_results_file_names_its_provenance(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [field for field in PROVENANCE_FIELDS if not data.get(field)]
    assert not missing, f"{path.name} lacks {missing}"
    assert isinstance(data["versions"], dict) and data["versions"], path.name
    assert re.match(r"\d{4}-\d{2}-\d{2}\b", data["date"]), data["date"]  # ISO day first (bench adds the time)
    if "provenance" in data:  # transcribed from the docs: it says from where and how to re-measure
        assert "Transcribed" in data["provenance"] and "commit" in data["provenance"], path.name


def _regions():
    found = []
    for path in markdown_files(ROOT):
        for match in REGION.finditer(path.read_text(encoding="utf-8")):
            found.append((path.name, match["name"], match["view"]))
    return found


@pytest.mark.parametrize("doc,name,view", _regions(), ids=lambda x: str(x))
def test_every_embedded_view_renders_text(doc, name, view):
    if not (ROOT / RESULTS_DIR / f"{name}.json").is_file():
        pytest.skip(f"{name}.json is not there yet")
    data = load_results(ROOT, name)
    text = view_function(data["kind"], view)(data)
    assert isinstance(text, str) and text.strip(), f"{doc}: {name} {view} rendered nothing"


def test_transcribed_files_show_their_provenance_in_the_docs():
    docs = "\n".join(p.read_text(encoding="utf-8") for p in markdown_files(ROOT))
    for path in RESULTS:
        data = json.loads(path.read_text(encoding="utf-8"))
        if "provenance" in data:
            assert source_line(data) in docs, f"{path.name}: its provenance line is shown by no document"


def test_signed_tells_an_exact_zero_from_a_rounded_one():
    assert signed(0) == "0"
    assert signed(0.0) == "+0.000"
    assert signed(-0.0) == "−0.000"
    assert signed(-0.0784) == "−0.078"
    assert signed(0.018) == "+0.018"


def _lengthgen_report():
    """A tiny fake ``results.json`` of a lengthgen study (two MLM series on the same weights, a Llama)."""
    from hf_attn_variants.lengthgen.results import add_deltas, summarize

    rows = []
    for seed in (0, 1):
        for length in (16, 32, 64, 128):
            base = 5.0 + abs(length - 32) / 100 + seed / 10
            for series, variant, shift in (("gau_relu2_dynamic", "gau_relu2_dynamic", 0.0),
                                           ("gau_relu2_fixed", "gau_relu2_fixed", 0.01 * (length - 32) / 32)):
                rows.append({"series": series, "variant": variant, "model_type": "gau", "mode": "default",
                             "objective": "mlm", "seed": seed, "length": length, "status": "ok",
                             "loss": base + shift, "accuracy": 0.2, "blocks": 256 // length,
                             "tokens": 300 + length})
            for mode, shift in (("sdpa", 0.0),
                                ("entropy_invariant_beyond_L", 0.0 if length <= 32 else 0.002)):
                loss = 4 + seed / 10 + shift
                rows.append({"series": f"llama/{mode}", "variant": "llama", "model_type": "llama",
                             "mode": mode,
                             "objective": "clm", "seed": seed, "length": length, "status": "ok", "loss": loss,
                             "perplexity": 2.718281828 ** loss,
                             "perplexity_beyond_train": 60.0 if length > 32 else None,
                             "blocks": 256 // length, "tokens": 1000 + length})
    rows = add_deltas(rows, 32)
    runs = [{"variant": v, "seed": s, "train": {"seconds": 30.0 + s},
             "rows": [r for r in rows if r["variant"] == v and
                                                                               r["seed"] == s]}
            for v in ("gau_relu2_dynamic", "gau_relu2_fixed", "llama") for s in (0, 1)]
    finetune = {level: {"task": {"train_samples": 100, "validation_samples": 40, "mean_tokens": 20.5,
                                 "majority_baseline_accuracy": 0.3, "chance_accuracy": 0.125},
                        "max_seq_length": 32,
                        "rows": [{"condition": "relu2/dynamic", "seed": s, "train_seconds": 5.0}
                                 for s in (0, 1)],
                        "summary": [{"condition": "relu2/dynamic", "accuracy_mean": 0.5, "accuracy_std": 0.01,
                                     "accuracy_per_seed": [0.49, 0.51]}]} for level in ("sequence", "token")}
    return {"args": {"train_length": 32, "max_train_steps": 10, "seeds": [0, 1],
                     "eval_lengths": [16, 32, 64, 128]},
            "machine": {"torch": "2.x", "transformers": "5.x", "load_average_at_start": [1.0, 1.0, 1.0]},
            "summary": summarize(rows), "runs": runs, "finetune": finetune,
            "variants": [{"variant": "gau_relu2_dynamic", "final_train_loss": [5.0, 5.2]}]}


def test_lengthgen_writes_what_its_views_render(tmp_path):
    from tools.docs_results.publish import publish
    from tools.docs_results import lengthgen

    (tmp_path / "results.json").write_text(json.dumps(_lengthgen_report()))
    path = publish(tmp_path / "results.json", "length-study", root=tmp_path, command="run it",
                   wall_seconds=75)
    data = load_results(tmp_path, "length-study")
    assert path.is_file() and data["kind"] == "lengthgen" and not data.get("provenance")
    views = [name for name in dir(lengthgen) if not name.startswith("_")
             and callable(getattr(lengthgen, name))
             and getattr(lengthgen, name).__module__ == lengthgen.__name__]
    for view in views:
        assert view_function("lengthgen", view)(data).strip(), view
    paired = lengthgen.paired(data)
    assert "| `gau_relu2_fixed` − `gau_relu2_dynamic` (same weights) | −0.005 (−0.005, −0.005) | 0 |" \
        in paired
    differences = lengthgen.llama_differences(data)
    assert "| `entropy_invariant_beyond_L` | 0, 0 | 0, 0 | +0.002, +0.002 |" in differences
    assert "| the whole study | – | 1 min 15 s wall |" in lengthgen.run(data)
    assert "| blocks | 16 | 8 | 4 | 2 |" in lengthgen.counts(data)
    regions = "".join(f"<!-- results: length-study {view} -->\n<!-- /results -->\n" for view in views)
    assert render_markdown(tmp_path, regions).count("\n| ") > 2 * len(views)  # every view is a table
    delta = lengthgen.mlm_loss_delta(data)
    assert "| `gau_relu2_dynamic` |" in delta and " 0 |" in delta


def test_memory_estimates_results_render_without_traces(tmp_path):
    script = load_script("memory_estimates")
    report = script.build_report(script.model_specs(), list(script.LAYOUTS), [2048], 1, 76.0, "cmd",
                                 trace=False)
    data = script.results_data(report)
    write_results(tmp_path, "memory-estimates", data)
    data = load_results(tmp_path, "memory-estimates")
    from tools.docs_results import memory_estimates as views

    assert "**96,522,240**" in views.models(data)
    assert "| 1 GPU | 3.28 / 1.66 | 23.09 / 20.46 |" in views.scaling_summary(data)
    for view in ("generated_by", "layer_activations", "estimate_tables", "untied_head_cost",
                 "tp_activation_ratio"):
        assert getattr(views, view)(data).strip(), view


@pytest.mark.parametrize(("flags", "message"), [
    (["--budget-gib", "nan"], "--budget-gib must be a positive number"),
    (["--root", "{tmp}/missing"], "--root: "),
    (["--output", "/proc/x/y.json"], "--output: '/proc/x/y.json' cannot be written"),
    (["--output", "{tmp}"], "is a folder"),
])
def test_memory_estimates_refuses_bad_flags_before_writing(tmp_path, capsys, flags, message):
    """A NaN budget (a traceback from int(nan)), a --root that does not exist (its whole tree was created),
    an --output that cannot be written (a traceback after the work) or is a folder: one error, nothing
    written."""
    script = load_script("memory_estimates")
    with pytest.raises(SystemExit) as exit_info:
        script.main([flag.format(tmp=tmp_path) for flag in flags] + ["--no-trace"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
    assert not list(tmp_path.iterdir())


def test_memory_estimates_traces_run_and_match_the_committed_results(tmp_path):
    """The traced run (the layers' real forwards on the meta device) works with today's model code and gives
    the committed numbers: a change to what a layer saves shows here, not in a stale docs table."""
    script = load_script("memory_estimates")
    assert script.main(["--root", str(tmp_path)]) == 0
    provenance = {"kind", "command", "machine", "versions", "date", "environment"}
    fresh = {k: v for k, v in load_results(tmp_path, "memory-estimates").items() if k not in provenance}
    kept = {k: v for k, v in load_results(ROOT, "memory-estimates").items() if k not in provenance}
    assert fresh == kept, "rerun `python scripts/memory_estimates.py` and `python tools/render_docs.py`"


def test_tp_bench_keeps_other_runs_and_replaces_its_own(tmp_path):
    script = load_script("tp_bench")
    settings = {"hidden": 8, "layers": 1, "batch": 1, "length": 4, "repeats": 1}
    script.record(tmp_path, "tp", "a", "", settings,
                  [{"family": "gau", "tp": 1, "threads": 2, "step_s": 1.0}], False)
    script.record(tmp_path, "tp", "a", "", settings,
                  [{"family": "gau", "tp": 2, "threads": 1, "step_s": 1.5}], False)
    script.record(tmp_path, "tp", "b", "busy", settings,
                  [{"family": "gau", "tp": 1, "threads": 2, "step_s": 2.0},
                                                          {"family": "gau", "tp": 2, "threads": 1,
                                                           "step_s": 2.5}], False)
    script.record(tmp_path, "tp", "a", "", settings,
                  [{"family": "gau", "tp": 2, "threads": 1, "step_s": 1.2}], False)
    data = load_results(tmp_path, "tp")
    assert [run["label"] for run in data["runs"]] == ["a", "b"]
    text = view_function("tp_bench", "table")(data)
    assert "| 1.00 s / 2.00 s | 1.20 s / 2.50 s | 1.20× / 1.25× slower |" in text and "(busy)" in text


def test_serving_publish_turns_the_raw_file_into_the_results_file(tmp_path):
    script = load_script("serving_bench")
    env = {"torch": "2.x", "python": "3.11", "cores": 2, "load_average": [1.0, 1.2, 1.4], "prompt_tokens": 64,
           "new_tokens": 128, "repeats": 3}
    raw = {"rows": [{"engine": "vllm", "batch": 1, "seconds": 2.0, "tokens_per_s": 64.0},
                    {"engine": "transformers", "batch": 1, "seconds": 4.0, "tokens_per_s": 32.0}],
           "environment": {"vllm": env, "transformers": env}, "engine_start_s": 8.0, "torch_threads": 2,
           "vllm": "0.32.0", "transformers": "5.19.0"}
    (tmp_path / "cpu.json").write_text(json.dumps(raw))
    write_results(tmp_path, "serving-cpu",
                  {"kind": "serving", "vllm_environment": {"size_gb": 3.5, "build_seconds": 100,
                                                                                    "source": "x"}})
    script.publish(tmp_path / "cpu.json", tmp_path)
    data = load_results(tmp_path, "serving-cpu")
    assert data["vllm_environment"]["build_seconds"] == 100 and data["versions"]["vllm"] == "0.32.0"
    assert "| batch 1: 128 new tokens | 2.00 s = **64 tokens/s** | 4.00 s = **32 tokens/s** | 2.00× |" in (
        view_function("serving", "table")(data))
    assert view_function("serving", "earlier_runs")(data) == ""


def test_gau_serving_publish_and_views(tmp_path):
    """``scripts/gau_serving_bench.py publish`` turns the raw rows into the results file; the views give one
    row per batch and context with a column per engine, and the bytes vLLM reserves per sequence."""
    script = load_script("gau_serving_bench")
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "parameters.json").write_text(json.dumps({"flash": 2_760_000, "llama": 2_790_000}))
    raw = {"throughput": [{"engine": "flash_vllm", "context": 4096, "batch": 16, "seconds": 5.0,
                           "tokens_per_s": 102.4},
                          {"engine": "llama_vllm", "context": 4096, "batch": 16, "seconds": 6.4,
                           "tokens_per_s": 80.0}],
           "memory": [{"model": "FLASH (prefix caching off)", "context": 512, "kv_cache_tokens": 34816.0,
                       "request_tokens": 544.0, "concurrency": 64.0, "bytes_per_sequence": 4194304.0}],
           "load_average": [1.0, 1.5], "threads": 2,
           "versions": {"vllm": "0.32.0", "transformers": "5.19.0", "torch": "2.13.0+cpu",
                        "python": "3.11.7"}}
    (folder / "raw.json").write_text(json.dumps(raw))
    script.publish(folder, tmp_path)
    data = load_results(tmp_path, "gau-serving-cpu")
    assert data["kind"] == "gau_serving" and data["versions"]["vllm"] == "0.32.0"
    throughput = view_function("gau_serving", "throughput")(data)
    assert "| 16 | 4,096 | 102 | – | 80 |" in throughput and "FLASH 2.76 M parameters" in throughput
    memory = view_function("gau_serving", "memory")(data)
    assert "| FLASH (prefix caching off) | 512 | 34,816 | 64× | 4.00 MiB |" in memory and "256 MiB" in memory


def test_demo_and_gau_init_views_render_fresh_data():
    from tools.docs_results import demo, gau_init

    report = {"sentence": "the [MASK] statement.", "seconds": 100.4, "args": {"max_seq_length": 64,
                                                                            "length_multipliers": [1, 2]},
              "rows": [{"family": "gau", "params": 320_000, "train_seconds": 30.2,
                        "fill_mask": ["of", "in", "a"],
                        "reload": "ok",
                        "lengths": [{"length": 64, "multiplier": 1, "loss": 4.5, "accuracy": 0.2},
                                                    {"length": 128, "multiplier": 2, "loss": 4.6,
                                                     "accuracy": 0.19}]}]}
    data = demo.from_report(report, kind="demo", command="make demo", machine="m", versions={"torch": "2"},
                            date="2026-01-01",
                            make_demo={"wall_seconds": 130, "cpu_seconds": 90, "conditions": "c"})
    assert "| gau | 0.32M | 30 | 4.500 | 4.600 | 0.200 | 0.190 | of, in, a | ok |" in demo.table(data)
    assert demo.wall_time(data) == "2 min 10 s" and demo.total_time(data) == "100 s"
    assert demo.stability(data) == ""
    assert demo.sentence(data) == "`the [MASK] statement.`"
    rows = [{"variant": "softmax", "gau_init": "gau_alpha", "seed": s, "loss_reduction": 98.7,
             "grad_norm_reduction": 94.5, "generation_matches": True, "passed": True} for s in (42, 1)]
    text = gau_init.table({"kind": "gau_init", "command": "c", "machine": "m", "versions": {}, "date": "d",
                           "rows": rows})
    assert "| softmax | gau_alpha | 2 | 98.7 / 98.7 % | 94.5 / 94.5 % | 2/2 | 2/2 |" in text


def test_pruning_study_writes_what_its_views_render(tmp_path):
    import argparse

    script = load_script("pruning_study")
    curve = [{"heads_pruned": h, "fraction": h / 32, "accuracy": a}
             for h, a in ((0, 0.9), (3, 0.88), (6, 0.7))]
    uniform_curve = [{"heads_pruned": h, "fraction": h / 32, "accuracy": a}
                     for h, a in ((0, 0.9), (4, 0.89), (8, 0.8))]
    results = {
        "machine": {"cpu_threads": 2, "load_average_at_start": [1.0, 1.1, 1.2],
                    "load_average_at_end": [2.0, 2.1, 2.2]},
        "total_seconds": 600.0, "task": {"majority_class_accuracy": 0.18}, "baseline_accuracy": 0.9,
        "importance_seconds": 5.0,
        "curves": {"importance, scored once": curve, "importance, re-scored each step": curve,
                   "random order (mean of 3)": curve, "uniform per layer, scored once": uniform_curve},
        "stop_rule_90": {"heads_pruned": 3, "accuracy": 0.88, "pruned_heads": {"0": [1, 2], "3": [7]}},
        "stop_rule_90_uniform": {"heads_pruned": 4, "accuracy": 0.89,
                                 "rejected_step": {"heads_pruned": 8, "accuracy": 0.8},
                                 "pruned_heads": {str(layer): [0] for layer in range(4)}, "restated": True,
                                 "num_attention_heads": 7, "head_dim": 8, "reloaded_accuracy": 0.89},
        "half": {"accuracy": 0.6, "pruned_heads": {str(layer): [0, 1, 2, 3] for layer in range(4)},
                 "parameters": {"unpruned": 1000, "pruned_50": 800},
                 "timing": {"batch": 4, "length": 512, "repeats": 15, "speedup": 1.5,
                            "median_seconds": {"unpruned": 0.09, "pruned_50": 0.06}}},
        "random_order_accuracies": [[0.9, 0.88, 0.68], [0.9, 0.88, 0.70], [0.9, 0.88, 0.72]],
    }
    args = argparse.Namespace(steps=1200, quick=False, random_orders=3)
    train_log = [{"step": 1200, "seconds": 360.0}]
    write_results(tmp_path, "pruning-study", script.compact_results(results, args, train_log, 32, 2000))
    data = load_results(tmp_path, "pruning-study")
    from tools.docs_results import pruning_study as views

    assert "| 6 | 19 | 0.700 | 0.700 | 0.700 ± 0.020 |  |" in views.curve_table(data)
    assert "random order (mean ± sd of 3)" in views.curve_table(data)
    stop = views.stop_rule(data)
    assert "| global, scored once | **3 of 32 (9%)** | **0.88** (98%) | 6 heads, 0.7 |" in stop
    assert "restated by `restate_uniform_heads`" in stop and "`num_attention_heads=7`, `head_dim=8`" in stop
    assert "**1.50× faster**" in views.speedup(data) and views.earlier_timings(data) == ""
    assert views.majority(data) == "18.0%" and views.stop_threshold(data) == "0.810"
    for view in ("run", "run_minutes", "eval_examples", "training", "importance_examples",
                 "importance_seconds", "half_model", "timing_setup", "timing_length"):
        assert getattr(views, view)(data).strip(), view


def _with_fixed(report, fixed_per_seed):
    """``report`` with a relu2/fixed finetune condition of the given per-seed accuracies on both task
    forms."""
    report = json.loads(json.dumps(report))
    for task in report["finetune"].values():
        task["summary"].append({"condition": "relu2/fixed", "accuracy_mean": sum(fixed_per_seed) / 2,
                                "accuracy_std": 0.01, "accuracy_per_seed": list(fixed_per_seed)})
    return report


def test_lengthgen_reruns_state_the_spread_and_say_when_a_sign_is_not_resolved(tmp_path, capsys):
    """A re-run of the relu² rows (``publish_rerun``) and a reported run join the study's comparison; a
    finetune difference whose sign changes between seeds or runs is "not resolved at this scale"; a
    republished study keeps them; a re-run with other settings is refused naming ``results_json``."""
    from tools.docs_results.publish import publish, publish_rerun
    from tools.docs_results import lengthgen

    study, rerun = tmp_path / "study.json", tmp_path / "rerun.json"
    study.write_text(json.dumps(_with_fixed(_lengthgen_report(), [0.52, 0.53])))  # +0.03, +0.02: fixed better
    rerun.write_text(json.dumps(_with_fixed(_lengthgen_report(), [0.54, 0.515])))  # +0.05, +0.005
    publish(study, "length-study", root=tmp_path, command="run it")
    publish_rerun(rerun, "length-study", root=tmp_path, command="run the relu² rows", code="commit abc")
    data = load_results(tmp_path, "length-study")
    assert [r["code"] for r in data["reruns"]] == ["commit abc"] and data["cpu"]
    verdict = lengthgen.relu2_verdict(data)
    assert ("| zero-shot MLM loss, lengths < L | 4 seed × length cells of 2 runs | −0.005 to −0.005 | "
            "`fixed` lower in every one |") in verdict
    assert "| finetune accuracy, sequence | 4 seeds of 2 runs on " in verdict and ("`fixed` better in every "
                                                                                   "one") in verdict
    assert "not resolved" not in verdict
    assert "(re-run)" in lengthgen.relu2_fixed_minus_dynamic(data)
    assert "commit abc" in lengthgen.relu2_sources(data)
    assert "Mean ± sample standard deviation over seeds 0, 1" in lengthgen.mlm_loss(data)

    data["reported"] = [{"cpu": "Other CPU", "date": "2026-01-01", "source": "an issue",
                         "finetune_fixed_minus_dynamic": {"sequence": [-0.01, 0.02]}}]
    write_results(tmp_path, "length-study", data)
    data = load_results(tmp_path, "length-study")
    verdict = lengthgen.relu2_verdict(data)
    assert "**not resolved at this scale**" in verdict
    assert "not resolved at this scale" in verdict and "3 runs on" in verdict and "Other CPU" in verdict

    publish(study, "length-study", root=tmp_path, command="run it again")
    again = load_results(tmp_path, "length-study")
    assert again["command"] == "run it again" and again["reruns"] == data["reruns"] and again["reported"]
    other = _with_fixed(_lengthgen_report(), [0.5, 0.5])
    other["args"]["max_train_steps"] = 11
    rerun.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="results_json: .*steps"):
        publish_rerun(rerun, "length-study", root=tmp_path, command="x")
    from tools.publish_study import main as publish_study  # the same refusal from the tool the scripts run

    assert publish_study(["rerun", str(rerun), "length-study", "--root", str(tmp_path), "--command",
                          "x"]) == 1
    assert "rerun: error: results_json: " in capsys.readouterr().err
