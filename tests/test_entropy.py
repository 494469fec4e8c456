"""``hf-attn-variants entropy``: the measurement (uniform rows give log n, the window's in a sliding-window
layer; the fitted slope; causality from the maps), the command's results file and plot for this package's
softmax families and stock models with and without stock log-n, and one error line per bad flag or
unmeasurable model with nothing measured or written."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    EntropyInvariantModel,
    GAUConfig,
    GAUForCausalLM,
)
from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import plain_mode
from hf_attn_variants.entropy.cli import default_lengths
from hf_attn_variants.entropy import measure
from hf_attn_variants.entropy.measure import (
    diffuse_heads,
    entropy_by_length,
    fit_slope,
    head_slopes,
    layer_entropy_sums,
    measured_rows,
    row_entropy,
)

TINY = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "initializer_range": 0.5}


def test_row_entropy_of_uniform_and_one_hot_rows() -> None:
    uniform = torch.full((3, 8), 1 / 8)
    torch.testing.assert_close(row_entropy(uniform), torch.full((3,), math.log(8), dtype=torch.float64))
    assert row_entropy(torch.eye(4)).abs().max() == 0
    relu2 = torch.tensor([[0.0, 2.0, 2.0, 0.0]])  # not a probability row: normalised first
    torch.testing.assert_close(row_entropy(relu2, normalize=True), torch.tensor([math.log(2)],
                                                                                dtype=torch.float64))


def mean_log_keys(length: int, causal: bool) -> float:
    """Mean log nᵢ over ``measured_rows`` of a model without windows, computed here independently: causal row
    i sees i + 1 keys, a bidirectional row all ``length``."""
    if not causal:
        return math.log(length)
    rows = range(length // 2, length)
    return sum(math.log(i + 1) for i in rows) / len(rows)


def test_fit_slope_is_the_least_squares_slope() -> None:
    x = [math.log(n) for n in (8, 16, 32, 64)]
    assert fit_slope(x, [0.7 * v + 1.0 for v in x]) == pytest.approx(0.7)
    assert math.isnan(fit_slope([1.0], [2.0]))
    assert math.isnan(fit_slope([1.0, 1.0], [2.0, 3.0]))  # one length twice: no slope, not ZeroDivisionError
    with pytest.raises(ValueError, match="one value per point, got 3 and 2"):
        fit_slope(x[:3], [1.0, 2.0])
    assert head_slopes([]) == [] and diffuse_heads([], 4) == []


@pytest.mark.parametrize("causal", [True, False])
def test_uniform_attention_has_entropy_log_n_and_slope_one(causal: bool) -> None:
    torch.manual_seed(0)
    config = EntropyInvariantConfig(**TINY, num_attention_heads=4, intermediate_size=64, is_decoder=causal,
                                    attn_implementation="eager")
    model = EntropyInvariantModel(config).eval()
    for layer in model.layers:  # q = k = 0: every visible key gets the same weight
        torch.nn.init.zeros_(layer.self_attn.q_proj.weight)
    lengths = [8, 16, 32]
    points = entropy_by_length(model, lambda n: [torch.randint(0, 64, (2, n))], lengths, causal=causal)
    for point in points:
        assert point.log_keys == pytest.approx(mean_log_keys(point.length, causal))
        torch.testing.assert_close(torch.tensor(point.entropy, dtype=torch.float64),
                                   torch.full((2, 4), point.log_keys, dtype=torch.float64), atol=1e-6, rtol=0)
    assert fit_slope([p.log_keys for p in points], [p.mean_entropy for p in points]) == pytest.approx(1.0)


def streamed_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    heads = {"num_attention_heads": 4, "intermediate_size": 64, "attn_implementation": "eager"}
    if name == "ei":
        return EntropyInvariantForCausalLM(EntropyInvariantConfig(**TINY, **heads, base_length=16,
                                                                  is_decoder=True))
    if name == "ei_bidirectional":
        return EntropyInvariantModel(EntropyInvariantConfig(**TINY, **heads))
    if name == "gau":
        return GAUForCausalLM(GAUConfig(**TINY, attention_key_size=16, is_decoder=True,
                                        attention_normalization="relu2"))
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3,
                                        num_key_value_heads=2, initializer_range=0.5, **heads))


@pytest.mark.parametrize("name", ["ei", "ei_bidirectional", "gau", "llama"])
def test_layer_by_layer_entropy_equals_the_whole_models_maps(name, monkeypatch) -> None:
    """``layer_entropy_sums`` gives the entropies of ``output_attentions``' maps, and each layer's map is
    freed before the next layer attends (a weak reference to it is dead by then), nor passed on."""
    model = streamed_model(name).eval()
    causal = name != "ei_bidirectional"
    normalize = name == "gau"
    input_ids = torch.randint(0, 64, (2, 24))
    rows = measured_rows(24, causal)
    with torch.no_grad():
        maps = model(input_ids=input_ids, output_attentions=True).attentions
    expected = torch.stack([row_entropy(layer[:, :, rows], normalize).sum(dim=(0, 2)) for layer in maps])

    import weakref

    seen: list[weakref.ref] = []
    reduce = measure.summed_row_entropy

    def remember(attention, *args):
        assert all(ref() is None for ref in seen), "an earlier layer's map is still alive"
        seen.append(weakref.ref(attention))
        return reduce(attention, *args)

    passed_on: list[object] = []
    attention_modules = [module for module in model.modules()
                         if type(module).__name__.endswith(("Attention", "AttentionUnit"))]
    assert len(attention_modules) == model.config.num_hidden_layers
    for module in attention_modules:
        module.register_forward_hook(lambda _m, _a, output: passed_on.append(output[1]))
    monkeypatch.setattr(measure, "summed_row_entropy", remember)
    streamed, log_keys = layer_entropy_sums(model, input_ids, rows, normalize, causal=causal)
    torch.testing.assert_close(streamed, expected)
    torch.testing.assert_close(log_keys / (2 * len(range(24)[rows])), torch.full(
        (model.config.num_hidden_layers,), mean_log_keys(24, causal), dtype=torch.float64))
    assert len(seen) == model.config.num_hidden_layers and all(ref() is None for ref in seen)
    assert passed_on == [None] * len(attention_modules)


def test_layer_by_layer_entropy_needs_attention_weights() -> None:
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        layer_entropy_sums(model, torch.randint(0, 64, (1, 8)), measured_rows(8, True), causal=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("entropy-models")
    torch.manual_seed(0)
    heads = {"num_attention_heads": 4, "intermediate_size": 64}
    EntropyInvariantForCausalLM(EntropyInvariantConfig(**TINY, **heads, base_length=16, is_decoder=True)
                                ).save_pretrained(root / "ei")
    GAUForCausalLM(GAUConfig(**TINY, attention_key_size=16, base_length=16, is_decoder=True,
                             attention_normalization="softmax_plus")).save_pretrained(root / "gau")
    GAUForCausalLM(GAUConfig(**TINY, attention_key_size=16, base_length=16, is_decoder=True,
                             attention_normalization="relu2")).save_pretrained(root / "relu2")
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=16, initializer_range=0.5))
    llama.save_pretrained(root / "llama")
    EntropyInvariantForCausalLM(EntropyInvariantConfig(
        **TINY, **heads, is_decoder=True, position_embedding_type="absolute", max_position_embeddings=32)
    ).save_pretrained(root / "absolute")
    return root


def test_command_writes_results_and_plot_for_every_kind_of_model(folders, tmp_path) -> None:
    output = tmp_path / "entropy.json"
    names = ("ei", "gau", "relu2", "llama", "absolute")
    argv = ["entropy", "--models", *(str(folders / name) for name in names), "--task", "passkey",
            "--train_length", "16", "--samples", "2", "--output", str(output)]
    assert main(argv) == 0
    results = json.loads(output.read_text())
    series = {entry["name"]: entry for entry in results["series"]}
    assert list(series) == ["ei", "gau", "relu2", "llama", "llama + log-n", "absolute"]
    assert results["train_length"] == 16 and output.with_suffix(".png").stat().st_size > 10_000
    lengths = [n for n in default_lengths(16) if n >= 9]  # a passkey example needs 9 tokens
    for name, entry in series.items():
        assert entry["causal"] and all(math.isfinite(s) for row in entry["head_slopes"] for s in row)
        heads = 1 if entry["model_type"] == "gau" else 4
        assert [len(layer) for layer in entry["entropy"][0]] == [heads, heads]
        expected = [n for n in lengths if name != "absolute" or n <= 32]
        assert entry["lengths"] == expected and entry["skipped_lengths"] == [n for n in lengths
                                                                           if n not in expected]
    assert series["relu2"]["normalized"] and not series["gau"]["normalized"]
    eager, log_n = series["llama"], series["llama + log-n"]
    assert eager["attn_implementation"] == "eager"
    assert log_n["attn_implementation"] == "entropy_invariant_eager"
    # scope beyond: rows that see at most L = 16 keys are untouched, longer ones sharpened (lower entropy)
    assert log_n["mean_entropy"][0] == pytest.approx(eager["mean_entropy"][0])
    assert all(s < e for s, e in zip(log_n["mean_entropy"][2:], eager["mean_entropy"][2:]))


def test_text_inputs_use_the_embedded_tokenizer_where_the_folder_has_none(folders, tmp_path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 50)
    output = tmp_path / "text.json"
    folder = tmp_path / "ei_text"
    from hf_attn_variants.training.corpus import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    EntropyInvariantForCausalLM(EntropyInvariantConfig(**{**TINY, "vocab_size": len(tokenizer)},
                                                       num_attention_heads=4, intermediate_size=64,
                                                       is_decoder=True)).save_pretrained(folder)
    assert main(["entropy", "--models", str(folder), "--text_file", str(text), "--lengths", "8", "32",
                 "--samples", "2", "--output", str(output), "--no_plot"]) == 0
    entry = json.loads(output.read_text())["series"][0]
    assert entry["lengths"] == [8, 32] and not output.with_suffix(".png").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--names", "a", "b"], "--names: 2 names for 1 models"),
    (["--task", "passkey", "--lengths", "4"], "--lengths: 4 is shorter than one passkey example"),
    (["--stock_modes", "flash"], "--stock_modes: 'flash' is not one of"),
    (["--task", "passkey", "--text_file", "x.txt"], "--text_file: inputs are the passkey task's"),
    (["--task", "mqar", "--task_vocab_size", "200"], "--task_vocab_size=200 exceeds the vocab_size=64"),
    (["--samples", "0"], "--samples"),
])
def test_bad_flags_give_one_line_naming_the_flag_and_write_nothing(folders, tmp_path, capsys, extra,
                                                                   message) -> None:
    output = tmp_path / "out.json"
    assert main(["entropy", "--models", str(folders / "ei"), "--output", str(output), *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hf-attn-variants entropy: error: ") and message in error and "\n" not in error
    assert not output.exists() and not output.with_suffix(".png").exists()


@pytest.mark.parametrize(("output", "files", "message"), [
    ("model/config.json", {},
     "--output: the results file 'model/config.json' would be written over --models 'model'"),
    ("text.txt", {"text.txt": "some text " * 40},
     "--output: the results file 'text.txt' would be written over --text_file 'text.txt'"),
    ("notes.json", {"notes.json": '{"mine": 1}'},
     "--output: 'notes.json' exists and is not from an earlier run of `hf-attn-variants entropy` (its "
     "results file 'notes.json' is not one)"),
    ("notes.json", {"notes.png": "mine"}, "--output: 'notes.png' exists and is not from an earlier run"),
    ("plot.png", {}, "--output: 'plot.png' would be both the results file and the plot"),
])
def test_no_file_the_command_did_not_write_is_replaced(folders, tmp_path, monkeypatch, capsys, output, files,
                                                       message) -> None:
    """The results file and the plot beside it never replace a model's files, the text read, or a file of
    the user's; a rerun replaces its own (mode as a plain ``open`` gives, not ``mkstemp``'s 0o600)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(folders / "ei", tmp_path / "model")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    text_file = ["--text_file", "text.txt"] if "text.txt" in files else []
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["entropy", "--models", "model", "--output", output, "--lengths", "8", "--samples", "1",
                 *text_file]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_rerun_replaces_its_own_results(folders, tmp_path) -> None:
    """The second run's results, and only them, are in the file (and its plot beside it)."""
    output = tmp_path / "entropy.json"
    plot = output.with_suffix(".png")
    for lengths in (["16", "32"], ["16"]):
        assert main(["entropy", "--models", str(folders / "ei"), "--output", str(output), "--task", "passkey",
                     "--train_length", "16", "--lengths", *lengths, "--samples", "1"]) == 0
        if len(lengths) == 2:
            first_plot = plot.read_bytes()
    series = json.loads(output.read_text())["series"]
    assert [(entry["name"], entry["lengths"]) for entry in series] == [("ei", [16])]
    assert plot.read_bytes() != first_plot
    for path in (output, plot):
        assert oct(path.stat().st_mode & 0o777) == oct(plain_mode()), path


def test_a_folder_without_a_model_is_refused(tmp_path, capsys) -> None:
    assert main(["entropy", "--models", str(tmp_path), "--output", str(tmp_path / "o.json")]) == 2
    assert "is not a model folder" in capsys.readouterr().err


def test_flash_gau_is_refused_in_one_line_before_anything_is_measured(folders, tmp_path, capsys) -> None:
    """FLASH's effective weights take both signs: the command wrote -inf entropies and exited 0."""
    torch.manual_seed(0)
    GAUForCausalLM(GAUConfig(**TINY, attention_key_size=16, is_decoder=True, attention_normalization="relu2",
                             chunk_size=8)).save_pretrained(tmp_path / "flash")
    capsys.readouterr()  # the save's progress bar
    output = tmp_path / "entropy.json"
    assert main(["entropy", "--models", str(folders / "ei"), str(tmp_path / "flash"), "--task", "passkey",
                 "--train_length", "16", "--samples", "2", "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "--models" in err and "is FLASH GAU (chunk_size=8)" in err and "have no entropy" in err, err
    assert len(err.strip().splitlines()) == 1 and not output.exists()


STOCK = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def window_model(name: str) -> torch.nn.Module:
    """A stock model with a sliding window of 8 keys: Mistral's on every layer, Qwen2's on its second only."""
    from transformers import MistralConfig, MistralModel, Qwen2Config, Qwen2Model

    torch.manual_seed(0)
    if name == "mistral":
        return MistralModel(MistralConfig(**STOCK, sliding_window=8, attn_implementation="eager"))
    return Qwen2Model(Qwen2Config(**STOCK, sliding_window=8, use_sliding_window=True, max_window_layers=1,
                                  layer_types=["full_attention", "sliding_attention"],
                                  attn_implementation="eager"))


@pytest.mark.parametrize("name", ["mistral", "qwen2"])
def test_a_sliding_window_layer_counts_the_keys_in_its_window(name) -> None:
    """Uniform rows (q = 0) have H = log nᵢ exactly: the log n reported per layer must be the window's,
    min(i + 1, 8), not i + 1 (which read a flat H as entropy-invariance)."""
    model = window_model(name).eval()
    for layer in model.layers:  # q = 0: every visible key gets the same weight
        torch.nn.init.zeros_(layer.self_attn.q_proj.weight)
        if layer.self_attn.q_proj.bias is not None:
            torch.nn.init.zeros_(layer.self_attn.q_proj.bias)
    points = entropy_by_length(model, lambda n: [torch.randint(0, 64, (2, n))], [16, 32, 64], causal=True)
    windowed = [True, True] if name == "mistral" else [False, True]
    for point in points:
        rows = range(point.length // 2, point.length)
        expected = [math.log(8) if sliding else sum(math.log(i + 1) for i in rows) / len(rows)
                    for sliding in windowed]
        assert point.layer_log_keys == pytest.approx(expected)
        for layer, values in enumerate(point.entropy):
            assert values == pytest.approx([expected[layer]] * 4, abs=1e-6)
    slopes = head_slopes(points)
    assert all(math.isnan(s) for layer, sliding in zip(slopes, windowed) if sliding for s in layer)
    assert all(s == pytest.approx(1.0) for layer, sliding in zip(slopes, windowed) if not sliding
               for s in layer)


def test_causality_comes_from_the_maps_not_from_module_flags() -> None:
    """XGLM's attention has no ``is_causal``: it was measured as bidirectional (every row, log n)."""
    from transformers import XGLMConfig, XGLMModel

    from hf_attn_variants.entropy.measure import attends_causally

    torch.manual_seed(0)
    xglm = XGLMModel(XGLMConfig(vocab_size=64, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
                                attn_implementation="eager")).eval()
    assert not any(getattr(module, "is_causal", False) for module in xglm.modules())
    assert attends_causally(xglm, torch.randint(0, 64, (2, 8)))
    assert attends_causally(streamed_model("ei").eval(), torch.randint(0, 64, (2, 8)))
    assert not attends_causally(streamed_model("ei_bidirectional").eval(), torch.randint(0, 64, (2, 8)))


def save_stock(root, name: str) -> str:
    """A tiny stock model of ``name`` saved in ``root / name`` (weights, no tokenizer: passkey inputs)."""
    import transformers as tf

    torch.manual_seed(0)
    small = {"vocab_size": 64}
    models = {
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**STOCK, sliding_window=8)),
        "xglm": lambda: tf.XGLMForCausalLM(tf.XGLMConfig(**small, d_model=32, num_layers=2, attention_heads=4,
                                                         ffn_dim=64, max_position_embeddings=64)),
        "bloom": lambda: tf.BloomForCausalLM(tf.BloomConfig(**small, hidden_size=32, n_layer=2, n_head=4)),
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**small, n_embd=32, n_layer=2, n_head=4,
                                                         n_positions=32)),
        "bert": lambda: tf.BertModel(tf.BertConfig(**small, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=4,
                                                   max_position_embeddings=32)),
        "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(**small, hidden_size=32, num_hidden_layers=2,
                                                      ffn_dim=64, num_attention_heads=4,
                                                      word_embed_proj_dim=32, max_position_embeddings=32)),
        "llama3": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**STOCK, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
        "gpt_oss": lambda: tf.GptOssForCausalLM(tf.GptOssConfig(
            **STOCK, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"])),
        "t5": lambda: tf.T5Model(tf.T5Config(**small, d_model=32, d_ff=64, num_layers=1, num_heads=4,
                                             d_kv=8)),
        "mpt": lambda: tf.MptForCausalLM(tf.MptConfig(**small, d_model=32, n_layers=2, n_heads=4,
                                                      max_seq_len=64)),
        "gemma2": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(**STOCK, head_dim=8, sliding_window=8)),
        "deberta": lambda: tf.DebertaV2Model(tf.DebertaV2Config(  # a relative table of 32 rows, no absolute
            **small, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=32, position_buckets=16, relative_attention=True,
            position_biased_input=False, pos_att_type=["p2c", "c2p"])),
    }
    models[name]().save_pretrained(root / name)
    return str(root / name)


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    root = tmp_path_factory.mktemp("entropy-stock")
    return lambda name: save_stock(root, name)


def entropy_run(models: list[str], tmp_path, *extra: str) -> tuple[int, dict | None]:
    """``entropy`` on passkey inputs without a plot: its exit status and results (``None`` when none)."""
    output = tmp_path / "entropy.json"
    code = main(["entropy", "--models", *models, "--task", "passkey", "--samples", "2", "--output",
                 str(output), "--no_plot", *extra])
    return code, json.loads(output.read_text()) if output.exists() else None


def test_the_command_reports_the_windowed_log_n_of_a_sliding_window_model(stock, tmp_path) -> None:
    code, results = entropy_run([stock("mistral")], tmp_path, "--train_length", "16", "--lengths", "16", "32",
                                "64", "--stock_modes", "eager")
    assert code == 0
    (entry,) = results["series"]
    assert entry["causal"] and entry["log_keys"] == pytest.approx([math.log(8)] * 3)
    assert [v for layers in entry["layer_log_keys"] for v in layers] == pytest.approx([math.log(8)] * 6)
    assert entry["slope"] is None and entry["head_slopes"] == [[None] * 4] * 2  # n does not change


@pytest.mark.parametrize("name", ["xglm", "bloom"])
def test_log_n_is_refused_for_a_model_that_does_not_dispatch_its_attention(stock, tmp_path, capsys,
                                                                            name) -> None:
    """Their "+ log-n" series was eager's, silently: ``configure_log_n`` refuses them, and so does this."""
    folder = stock(name)
    capsys.readouterr()
    code, results = entropy_run([folder], tmp_path, "--train_length", "16")
    err = capsys.readouterr().err.strip()
    assert code == 2 and results is None and "\n" not in err
    assert err.startswith("hf-attn-variants entropy: error: --stock_modes: log_n cannot apply to") and (
        "ALL_ATTENTION_FUNCTIONS" in err)
    code, results = entropy_run([folder], tmp_path, "--train_length", "16", "--lengths", "16", "32",
                                "--stock_modes", "eager")
    assert code == 0 and results["series"][0]["causal"]  # XGLM's modules say nothing about causality


@pytest.mark.parametrize(("name", "cap"), [("gpt2", 32), ("bert", 32), ("opt", 32), ("deberta", None)])
def test_a_learned_position_table_caps_the_lengths(stock, tmp_path, name, cap) -> None:
    """GPT-2 (IndexError), BERT (RuntimeError) and OPT crashed past their table (no
    ``position_embedding_type`` in their configs); now they stop at it. DeBERTa-v2's relative table has as
    many rows as ``max_position_embeddings`` and caps nothing."""
    code, results = entropy_run([stock(name)], tmp_path, "--train_length", "16", "--stock_modes", "eager")
    assert code == 0
    entry = results["series"][0]
    lengths = [n for n in default_lengths(16) if n >= 9]
    assert entry["lengths"] == [n for n in lengths if cap is None or n <= cap]
    assert entry["skipped_lengths"] == [n for n in lengths if cap is not None and n > cap]
    assert entry["causal"] == (name not in ("bert", "deberta"))


@pytest.mark.parametrize(("name", "extra", "message"), [
    ("gpt2", ["--train_length", "16", "--lengths", "64", "128"], "--lengths: no length fits"),
    ("llama3", ["--lengths", "64", "--memory_gib", "1e-6"], "--lengths: one sequence of 64 tokens needs"),
    ("gpt_oss", ["--train_length", "16"], "--models: "),
    ("t5", ["--train_length", "16"], "is an encoder-decoder model (t5)"),
    ("mpt", [], "--train_length: the config of"),
    ("gemma2", ["--train_length", "16"], "--stock_modes: log_n cannot apply to"),
])
def test_unmeasurable_models_are_refused_before_anything_is_measured(stock, tmp_path, capsys, monkeypatch,
                                                                     name, extra, message) -> None:
    folder = stock(name)
    capsys.readouterr()
    from hf_attn_variants.entropy import cli

    def never(*args, **kwargs):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(cli, "load", never)
    code, results = entropy_run([folder], tmp_path, *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and results is None and "\n" not in err and message in err, err
    if name == "gpt_oss":
        assert "attention sinks" in err


def test_the_default_train_length_is_stock_log_ns(stock, tmp_path) -> None:
    """L is RoPE's original_max_position_embeddings (16), as stock log-n's ``resolve_base_length`` takes it,
    not max_position_embeddings (64)."""
    code, results = entropy_run([stock("llama3")], tmp_path, "--lengths", "16", "32")
    assert code == 0 and results["train_length"] == 16


def test_one_length_writes_null_slopes_not_nan(folders, tmp_path) -> None:
    output = tmp_path / "one.json"
    assert main(["entropy", "--models", str(folders / "ei"), "--task", "passkey", "--train_length", "16",
                 "--lengths", "32", "--samples", "1", "--output", str(output)]) == 0
    text = output.read_text()

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in strict JSON")

    entry = json.loads(text, parse_constant=refuse)["series"][0]
    assert entry["slope"] is None and entry["slope_of_mean"] is None
    assert entry["head_slopes"] == [[None] * 4] * 2 and output.with_suffix(".png").stat().st_size > 0


def test_ctrl_c_while_plotting_marks_the_file_and_leaves_no_old_plot(folders, tmp_path, monkeypatch) -> None:
    from hf_attn_variants.entropy import cli

    output = tmp_path / "entropy.json"
    argv = ["entropy", "--models", str(folders / "ei"), "--task", "passkey", "--train_length", "16",
            "--lengths", "16", "32", "--samples", "1", "--output", str(output)]
    assert main(argv) == 0 and output.with_suffix(".png").exists()

    def interrupted(results, path):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "plot", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    results = json.loads(output.read_text())
    assert "while writing the results" in results["interrupted"] and len(results["series"]) == 1
    assert not output.with_suffix(".png").exists()


def test_an_unwritable_output_is_refused_before_measuring(folders, capsys) -> None:
    target = "/proc/entropy.json"
    assert main(["entropy", "--models", str(folders / "ei"), "--task", "passkey", "--train_length", "16",
                 "--lengths", "16", "--output", target]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hf-attn-variants entropy: error: --output: '{target}' cannot be written") and (
        "\n" not in err)
