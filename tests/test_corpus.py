"""The embedded corpus, its tokenizer and the data/config helpers shared by pretrain, finetune and demo."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from hf_attn_variants.training import build_config, embedded_tokenizer, parse_config_overrides
from hf_attn_variants.training.corpus import (
    SPECIAL_TOKENS,
    causal_tokenizer,
    corpus_paragraphs,
    corpus_splits,
    embedded_tokenizer_path,
    is_validation,
)
from hf_attn_variants.training.data import EpochShuffleSampler, group_token_lists, mask_tokens, mix_seed
from hf_attn_variants.training.wordpiece import learn_wordpiece_vocab


def test_split_is_deterministic_disjoint_and_about_ten_percent() -> None:
    first, second = corpus_splits(), corpus_splits()
    assert first == second
    train, validation = first["train"], first["validation"]
    assert set(train).isdisjoint(validation)
    assert len(train) + len(validation) == len(corpus_paragraphs())
    assert 0.05 < len(validation) / (len(train) + len(validation)) < 0.15
    assert sum(map(len, train)) > 300_000 and all(p.strip() for p in train + validation)
    assert all(is_validation(p, 0.1) for p in validation)
    with pytest.raises(ValueError, match="validation_fraction"):
        corpus_splits(1.5)


def test_tokenizer_special_tokens_and_inputs() -> None:
    tokenizer = embedded_tokenizer()
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, tokenizer.bos_token_id,
            tokenizer.eos_token_id) == (0, 4, 2, 3)
    assert tokenizer.model_input_names == ["input_ids", "attention_mask"]
    encoded = tokenizer("The assert statement [MASK] an exception.")
    assert set(encoded) == {"input_ids", "attention_mask"}
    ids = encoded["input_ids"]
    assert ids[0] == 2 and ids[-1] == 3 and ids.count(4) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("the assert statement")
    assert tokenizer.unk_token_id not in tokenizer("def f(x): return x ** 2")["input_ids"]
    assert causal_tokenizer(tokenizer)("the assert")["input_ids"] == ids[:3]  # BOS only, no EOS


def test_tokenizer_is_built_once_under_concurrency(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_ATTN_VARIANTS_CACHE", str(tmp_path))
    paths, errors = [], []

    def build() -> None:
        try:
            paths.append(embedded_tokenizer_path(vocab_size=512))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(set(paths)) == 1
    folder = Path(paths[0])
    assert folder.parent == tmp_path / "tokenizers" and (folder / "tokenizer.json").exists()
    assert [p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")] == [folder.name]
    mtime = (folder / "tokenizer.json").stat().st_mtime
    assert (embedded_tokenizer_path(vocab_size=512) == folder
            and (folder / "tokenizer.json").stat().st_mtime == mtime)


def test_wordpiece_vocabulary_is_learned_deterministically() -> None:
    words = ["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3
    vocab = learn_wordpiece_vocab(words, vocab_size=20, special_tokens=["[PAD]", "[UNK]"])
    assert vocab[:2] == ["[PAD]", "[UNK]"]
    # the alphabet first, by (-count, symbol): ##e 17, ##w 13, ##s 9, ##t 9, ##o 7, l 7, n 6, ##d 3, ##i 3,
    # w 3, ##r 2
    assert vocab[2:13] == ["##e", "##w", "##s", "##t", "##o", "l", "n", "##d", "##i", "w", "##r"]
    # merges: (##e,##s) 9 ties with (##s,##t) 9 and wins by string order; then ##es+##t; (##o,##w) 7 before
    # (l,##o) 7
    assert vocab[13:17] == ["##es", "##est", "##ow", "low"]
    shuffled = words[::-1]
    assert learn_wordpiece_vocab(shuffled, 20, ["[PAD]", "[UNK]"]) == vocab
    assert len(learn_wordpiece_vocab(words, 1000, [])) < 1000  # stops when no pair occurs twice


def test_grouping_makes_full_blocks_and_drops_the_remainder() -> None:
    assert group_token_lists([[1, 2, 3], [4, 5], [6, 7, 8, 9]], 4) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert group_token_lists([[1, 2]], 4) == []
    with pytest.raises(ValueError, match="block_size"):
        group_token_lists([[1]], 0)


def test_mlm_masks_depend_only_on_each_rows_seed() -> None:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (64, 32), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    seeds = [mix_seed(7, 0, i) for i in range(64)]
    kwargs = {"mask_token_id": 4, "vocab_size": 100, "special_ids": [0, 2, 3, 4], "probability": 0.15}
    inputs, labels = mask_tokens(ids, seeds, **kwargs)
    alone_inputs, alone_labels = mask_tokens(ids[5:6], seeds[5:6], **kwargs)
    assert torch.equal(alone_inputs[0], inputs[5]) and torch.equal(alone_labels[0], labels[5])
    selected = labels != -100
    assert torch.equal(labels[selected], ids[selected]) and not selected[:, [0, -1]].any()
    assert selected.any(dim=1).all()  # every row has at least one target (never an empty loss)
    rate = selected[:, 1:-1].float().mean().item()
    assert 0.12 < rate < 0.19
    masked = (inputs == 4) & selected
    assert 0.7 < masked.sum().item() / selected.sum().item() < 0.9  # 80% [MASK]
    assert torch.equal(inputs[~selected], ids[~selected])


def test_sampler_order_is_a_function_of_seed_and_epoch() -> None:
    sampler = EpochShuffleSampler(50, seed=1)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    sampler.set_epoch(0)
    assert list(sampler) == epoch0 != epoch1 and sorted(epoch1) == list(range(50))


def test_config_overrides_are_typed_and_validated() -> None:
    parsed = parse_config_overrides("hidden_size=64,hidden_dropout_prob=0.0,use_bias=false,chunk_size=none,"
                                    "synthesizer_components=[random,vanilla],attention_scale=ssmax")
    assert parsed == {"hidden_size": 64, "hidden_dropout_prob": 0.0, "use_bias": False, "chunk_size": None,
                      "synthesizer_components": ["random", "vanilla"], "attention_scale": "ssmax"}
    with pytest.raises(ValueError, match="key=value"):
        parse_config_overrides("hidden_size")
    tokenizer = embedded_tokenizer()
    config = build_config("entropy_invariant", config_overrides="hidden_size=32,num_attention_heads=4",
                          tokenizer=tokenizer, max_seq_length=1024)
    assert (config.vocab_size, config.pad_token_id, config.bos_token_id,
            config.eos_token_id) == (len(tokenizer), 0, 2, 3)
    assert config.max_position_embeddings == 1024 and config.base_length == 1024  # the training length
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['hiden_size'\]"):
        build_config("gau", config_overrides="hiden_size=3")
    with pytest.raises(ValueError, match="attention_scale"):
        build_config("entropy_invariant", config_overrides="attention_scale=huge")
    with pytest.raises(ValueError, match="model_type must be one of"):
        build_config("bert")
