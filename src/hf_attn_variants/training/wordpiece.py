"""Deterministic WordPiece vocabulary learning (pure Python).

``tokenizers``' ``WordPieceTrainer`` gives a different vocabulary in every process (its Rust hash maps are
randomly seeded and ties between equally frequent symbols/pairs are broken in hash order), so two machines
would train different "embedded" tokenizers from the same text. This module learns the vocabulary the same
way — BPE merges (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units") over
word counts, with BERT's ``##`` continuation prefix, as ``WordPieceTrainer`` does (it wraps the BPE trainer)
— but breaks every tie explicitly, so the result is a pure function of the text:

1. words = the normalizer + pre-tokenizer output, counted; a word is split into its first character and
   ``##``-prefixed following characters;
2. the alphabet (every symbol) enters the vocabulary after the special tokens, ordered by (−count, symbol);
3. repeatedly merge the adjacent pair (a, b) with the highest count — ties broken by (a, b) in string order —
   into a + b without b's ``##``, until ``vocab_size`` symbols or no pair occurs ``min_frequency`` times.

Pair counts are updated incrementally (only words containing the merged pair are re-counted) and the best
pair is taken from a heap with lazy invalidation, so the ~100k-word embedded corpus takes a few seconds.
The vocabulary is then used by ``tokenizers.models.WordPiece`` (greedy longest-match-first), as BERT does.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise

PREFIX = "##"


def _pairs(symbols: Sequence[str]) -> Counter:
    return Counter(pairwise(symbols))


def _merge(symbols: list[str], a: str, b: str, merged: str) -> list[str]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def learn_wordpiece_vocab(
    words: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    min_frequency: int = 2,
) -> list[str]:
    """The vocabulary (special tokens first, then the alphabet, then merges in order) learned from ``words``.

    ``words`` are already normalised and pre-tokenized (one entry per occurrence).
    """
    if vocab_size < len(special_tokens) + 1:
        raise ValueError(f"vocab_size must exceed the {len(special_tokens)} special tokens, got "
                         f"{vocab_size}.")
    counts = Counter(w for w in words if w)
    entries = sorted(counts.items())  # fixed order, independent of iteration order of the input
    symbols = [[word[0], *(PREFIX + ch for ch in word[1:])] for word, _ in entries]
    freqs = [count for _, count in entries]

    alphabet: Counter = Counter()
    for word_symbols, freq in zip(symbols, freqs):
        for symbol in word_symbols:
            alphabet[symbol] += freq
    vocab = list(dict.fromkeys(special_tokens))
    known = set(vocab)
    for symbol, _ in sorted(alphabet.items(), key=lambda item: (-item[1], item[0])):
        if symbol not in known:
            vocab.append(symbol)
            known.add(symbol)

    pair_counts: Counter = Counter()
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for index, (word_symbols, freq) in enumerate(zip(symbols, freqs)):
        for pair, n in _pairs(word_symbols).items():
            pair_counts[pair] += n * freq
            where[pair].add(index)
    heap = [(-count, a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        negative, a, b = heapq.heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -negative:  # stale heap entry; the current count (if any) was pushed separately
            continue
        if count < min_frequency:
            break
        merged = a + b[len(PREFIX):] if b.startswith(PREFIX) else a + b
        for index in sorted(where.pop((a, b), ())):
            old = symbols[index]
            new = _merge(old, a, b, merged)
            freq = freqs[index]
            for pair, n in _pairs(old).items():
                pair_counts[pair] -= n * freq
                if pair != (a, b):
                    where[pair].discard(index)
            for pair, n in _pairs(new).items():
                pair_counts[pair] += n * freq
                where[pair].add(index)
            changed = set(_pairs(old)) | set(_pairs(new))
            for pair in changed:
                if pair_counts[pair] > 0:
                    heapq.heappush(heap, (-pair_counts[pair], *pair))
            symbols[index] = new
        pair_counts.pop((a, b), None)
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
    return vocab


__all__ = ["PREFIX", "learn_wordpiece_vocab"]
