"""``hf-attn-variants bench``: the --quick smoke run writes a report, plots and raw JSON; the pieces it is
built from measure what they claim. No timing assertions (the CI machine is shared)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_attn_variants.bench.measure import make_step, peak_step_memory, time_step
from hf_attn_variants.bench.report import paired_ratio
from hf_attn_variants.bench.runner import BenchRun, Result
from hf_attn_variants.bench.specs import COMPARISONS, PRESETS, build_variants, select
from hf_attn_variants.cli import SUBCOMMANDS, main


def test_bench_is_a_subcommand() -> None:
    assert SUBCOMMANDS["bench"][0] == "hf_attn_variants.bench.cli"


def test_quick_run_writes_report_plots_and_json(tmp_path) -> None:
    output = tmp_path / "bench.md"
    assert main(["bench", "--quick", "--output", str(output)]) == 0
    text = output.read_text()
    for heading in ("## Setup", "## Targets", "## Results", "Encoder:", "Decoder:", "GAU:", "Synthesizer", "head pruning",
                    "## GPU"):
        assert heading in text, heading
    assert "torch " + torch.__version__ in text
    assert (tmp_path / "bench_time.png").stat().st_size > 0
    assert (tmp_path / "bench_memory.png").stat().st_size > 0
    data = json.loads((tmp_path / "bench.json").read_text())
    ok = [r for r in data["results"] if r["status"] == "ok"]
    assert {r["phase"] for r in ok} == {"train", "infer"}
    assert {r["variant"] for r in ok} >= {"bert_sdpa", "ei_sdpa", "llama_sdpa", "ei_decoder_sdpa", "gau_quadratic",
                                          "gau_flash", "syn_random", "syn_vanilla", "ei_8h_pruned50"}
    for result in ok:
        assert len(result["cpu"]) == len(result["wall"]) >= 1
        assert result["peak_bytes"] > 0 and result["flops"] > 0
    # --report-only re-renders the same report from the JSON without measuring
    again = tmp_path / "again" / "bench.md"
    assert main(["bench", "--report-only", str(tmp_path / "bench.json"), "--output", str(again)]) == 0
    assert again.read_text() == text and (tmp_path / "again" / "bench_time.png").is_file()


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
    assert set(variants) == {"gau_quadratic", "gau_flash"} and [c.key for c in comparisons] == ["gau"]


def test_bad_flags_exit_with_a_message(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--repeats", "0", "--output", "/nonexistent/x.md"])
    assert exit_info.value.code == 2 and "argument --repeats: repeats must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ei_sdpa", "ei_decoder_sdpa", "gau_quadratic", "gau_flash", "gau_softmax_plus",
                                  "syn_random_vanilla", "ei_8h_pruned50"])
def test_torch_compile_sees_one_graph_without_breaks(name: str, monkeypatch) -> None:
    """``torch._dynamo.explain`` on a tiny model of every family (GAU through its blocked kernels too)."""
    from hf_attn_variants import gau_kernels
    from hf_attn_variants.bench.measure import graph_breaks

    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 256)  # 32×32 scores → 4 blocks
    model = build_variants(PRESETS["quick"])[name].build(32).train()
    graphs, breaks, reasons = graph_breaks(model, torch.randint(1, 100, (1, 32)))
    assert (graphs, breaks) == (1, 0), reasons
