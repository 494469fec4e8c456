"""Synthetic retrieval tasks of the length study: passkey retrieval and multi-query associative recall (MQAR).

Both tasks are generated on the fly from a seed (no files, no tokenizer): every example is a deterministic
function of ``(seed, index)``, so a training run, an evaluation length and a rerun all see exactly the same
examples. Tokens come from a small task vocabulary (``TaskVocabulary``)::

    PAD = 0, BOS = 1, KEY = 2, QUERY = 3, then digits (passkey) or keys and values (MQAR), then filler tokens.

Every sequence starts with BOS unless ``TaskSpec.bos`` is False; then filler (or the KEY block) starts it.

- **Passkey retrieval** (Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length
  for Transformers", arXiv:2305.16300, §4.2; as in the issue's experiment with random filler tokens instead of
  the repeated sentence): ``[BOS, filler…, KEY, d1…dk, filler…, QUERY, d1…dk]``; the KEY block sits at a
  uniformly drawn position in the filler; the answer is the k digits after QUERY.
- **MQAR** (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language Models",
  arXiv:2312.04927, §3.1): ``[BOS, filler…, k1 v1 … kP vP, filler…, QUERY, q1 a1 … qP aP]``: P distinct keys
  each bound to a value (values may repeat) at a uniformly drawn offset, then the P keys again in a random
  order, each followed by its value; the answers are those values.
- **Copy warm-up** (``copy_example``, the first ``--copy_warmup_steps`` of an MQAR run): random non-special
  tokens whose last third repeats an earlier span at a uniformly drawn offset; the answers are the repeated
  tokens after the first. It trains the induction circuit (a previous-token head, then a head that attends to
  the token after an earlier occurrence of the current one) that MQAR's key-value binding needs and that
  MQAR's own loss, a few answers per sequence, does not build in a CPU budget.

The loss is taken on the answer tokens only: ``labels`` are -100 everywhere else (Transformers' causal LMs
shift the labels, so the logits at position i − 1 predict the answer at i). The metric is the teacher-forced
argmax at the answer positions, which equals greedy decoding being right (a wrong answer token makes the
sequence wrong either way): ``passkey`` accuracy = sequences with all k digits right; ``mqar`` accuracy =
queries answered right (plus the sequence exact match, every query right).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PAD, BOS, KEY, QUERY = 0, 1, 2, 3
SPECIAL_TOKENS = 4
TASKS = ("passkey", "mqar")
COPY = "copy"
"""The warm-up task (``make_batch(..., example=COPY)``)."""
METRICS = {"passkey": "exact-match accuracy", "mqar": "accuracy per query"}
"""What each task's ``accuracy`` (``score``) counts, as plots and tables name it."""
IGNORE_INDEX = -100
TASK_WEIGHT_DECAY = 0.01
"""The tasks' AdamW weight decay where ``lengthgen --weight_decay`` is not given."""


@dataclass(frozen=True)
class TaskVocabulary:
    """Token-id ranges ``[start, stop)`` of one task: ``answers`` (digits, or MQAR's values), ``keys`` (MQAR's
    keys; empty for passkey) and ``filler``."""

    size: int
    keys: tuple[int, int]
    answers: tuple[int, int]
    filler: tuple[int, int]


def vocabulary(task: str, vocab_size: int, num_kv_pairs: int = 1) -> TaskVocabulary:
    """The token ranges of ``task`` in a vocabulary of ``vocab_size`` ids. Passkey: 10 digits, the rest
    filler. MQAR: a quarter of the non-special ids is filler, the rest split into keys and values.
    ``ValueError`` naming ``task_vocab_size`` when it is too small (passkey: 16; MQAR: ``num_kv_pairs``
    distinct keys and 2 filler ids)."""
    free = vocab_size - SPECIAL_TOKENS
    if task == "passkey":
        if vocab_size < SPECIAL_TOKENS + 12:
            raise ValueError(f"task_vocab_size must be >= {SPECIAL_TOKENS + 12} for passkey (10 digits and "
                             f"filler), got {vocab_size}.")
        digits = (SPECIAL_TOKENS, SPECIAL_TOKENS + 10)
        return TaskVocabulary(vocab_size, (SPECIAL_TOKENS, SPECIAL_TOKENS), digits, (digits[1], vocab_size))
    if task != "mqar":
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    filler = max(2, free // 4)
    keys = (free - filler) // 2
    if keys < max(2, num_kv_pairs):
        needed = SPECIAL_TOKENS + 2 * max(2, num_kv_pairs) + max(2, (vocab_size - SPECIAL_TOKENS) // 4) + 1
        raise ValueError(f"task_vocab_size={vocab_size} leaves {max(keys, 0)} MQAR keys, fewer than "
                         f"num_kv_pairs={num_kv_pairs} distinct keys; raise task_vocab_size to at least "
                         f"{needed}.")
    start = SPECIAL_TOKENS
    return TaskVocabulary(vocab_size, (start, start + keys), (start + keys, start + 2 * keys),
                          (start + 2 * keys, vocab_size))


def min_length(task: str, *, digits: int = 3, num_kv_pairs: int = 4) -> int:
    """The shortest sequence that holds one example of ``task`` (no filler; copy: a span of 2) after a
    BOS."""
    if task == COPY:
        return 7
    return 2 * digits + 3 if task == "passkey" else 4 * num_kv_pairs + 2


@dataclass(frozen=True)
class TaskSpec:
    """One task's settings: ``task``, ``vocab_size``, ``digits`` (passkey), ``num_kv_pairs`` (MQAR) and
    ``bos``."""

    task: str
    vocab_size: int = 64
    digits: int = 3
    num_kv_pairs: int = 4
    bos: bool = True
    """Whether every sequence starts with BOS (without: filler from the first token on)."""

    @property
    def vocab(self) -> TaskVocabulary:
        return vocabulary(self.task, self.vocab_size, self.num_kv_pairs)

    @property
    def answers_per_example(self) -> int:
        return self.digits if self.task == "passkey" else self.num_kv_pairs


def _generator(seed: int, index: int) -> torch.Generator:
    """A generator seeded from both the seed and the example's index (distinct, stable streams)."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(index)) % (2**63 - 1))


def _randint(gen: torch.Generator, span: tuple[int, int], count: int) -> torch.Tensor:
    return torch.randint(span[0], span[1], (count,), generator=gen)


def _filled(spec: TaskSpec, length: int, gen: torch.Generator) -> torch.Tensor:
    """``length`` filler tokens, the first one BOS when ``spec.bos``."""
    ids = torch.empty(length, dtype=torch.long)
    start = int(spec.bos)
    ids[:start] = BOS
    ids[start:] = _randint(gen, spec.vocab.filler, length - start)
    return ids


def passkey_example(spec: TaskSpec, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, answer_positions)`` of one passkey example of exactly ``length`` tokens."""
    vocab, k, start = spec.vocab, spec.digits, int(spec.bos)
    filler = length - min_length("passkey", digits=k) + 1 - start
    ids = _filled(spec, length, gen)
    digits = _randint(gen, vocab.answers, k)
    at = start + int(torch.randint(0, filler + 1, (1,), generator=gen))
    ids[at] = KEY
    ids[at + 1: at + 1 + k] = digits
    ids[length - k - 1] = QUERY
    ids[length - k:] = digits
    return ids, torch.arange(length - k, length)


def mqar_example(spec: TaskSpec, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, answer_positions)`` of one MQAR example of exactly ``length`` tokens."""
    vocab, pairs, start = spec.vocab, spec.num_kv_pairs, int(spec.bos)
    filler = length - min_length("mqar", num_kv_pairs=pairs) + 1 - start
    keys = vocab.keys[0] + torch.randperm(vocab.keys[1] - vocab.keys[0], generator=gen)[:pairs]
    values = _randint(gen, vocab.answers, pairs)
    ids = _filled(spec, length, gen)
    at = start + int(torch.randint(0, filler + 1, (1,), generator=gen))
    context = torch.stack([keys, values], dim=1).reshape(-1)
    ids[at: at + 2 * pairs] = context
    query_start = length - 2 * pairs
    ids[query_start - 1] = QUERY
    order = torch.randperm(pairs, generator=gen)
    ids[query_start::2] = keys[order]
    ids[query_start + 1::2] = values[order]
    return ids, torch.arange(query_start + 1, length, 2)


def copy_example(spec: TaskSpec, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, answer_positions)`` of one copy warm-up example of exactly ``length`` tokens: random
    non-special ids (after BOS when ``spec.bos``) whose last ``n = (length − BOS) // 3`` repeat the span of
    ``n`` at a uniformly drawn offset before them; the answers are the ``n − 1`` repeated tokens after the
    first."""
    start = int(spec.bos)
    span = (length - start) // 3
    ids = torch.randint(SPECIAL_TOKENS, spec.vocab_size, (length,), generator=gen)
    ids[:start] = BOS
    at = start + int(torch.randint(0, length - 2 * span - start + 1, (1,), generator=gen))
    ids[length - span:] = ids[at: at + span]
    return ids, torch.arange(length - span + 1, length)


EXAMPLES = {"passkey": passkey_example, "mqar": mqar_example, COPY: copy_example}


def make_batch(spec: TaskSpec, length: int, seed: int, start: int, count: int,
               example: str | None = None) -> dict[str, torch.Tensor]:
    """Examples ``start … start + count − 1`` of the stream ``seed`` at ``length`` tokens of ``example``
    (default ``spec.task``; ``COPY``: the warm-up): ``input_ids``, ``labels`` (-100 except the answers) and
    ``answer_positions``. ``ValueError`` naming the length when one example does not fit."""
    kind = example or spec.task
    need = min_length(kind, digits=spec.digits, num_kv_pairs=spec.num_kv_pairs) - 1 + int(spec.bos)
    if length < need:
        raise ValueError(f"length {length} is shorter than one {kind} example ({need} tokens).")
    make = EXAMPLES[kind]
    rows, positions = zip(*(make(spec, length, _generator(seed, i)) for i in range(start, start + count)))
    input_ids = torch.stack(rows)
    answer_positions = torch.stack(positions)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels.scatter_(1, answer_positions, input_ids.gather(1, answer_positions))
    return {"input_ids": input_ids, "labels": labels, "answer_positions": answer_positions}


def answer_hits(logits: torch.Tensor, input_ids: torch.Tensor,
                answer_positions: torch.Tensor) -> torch.Tensor:
    """Boolean ``(batch, answers)``: whether the argmax of the logits one position before each answer is the
    answer (teacher forcing; the causal shift is applied here)."""
    previous = (answer_positions - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    predicted = logits.gather(1, previous).argmax(-1)
    return predicted == input_ids.gather(1, answer_positions)


def score(task: str, hits: torch.Tensor) -> dict[str, Any]:
    """The metrics of ``hits`` (``answer_hits`` of one or more batches, concatenated): ``accuracy`` (passkey:
    every digit right per sequence; MQAR: per query), ``exact_match`` (every answer of the sequence right),
    ``answer_accuracy`` (per answer token), ``sequences`` and ``answers``."""
    exact = hits.all(dim=1).float().mean().item()
    per_answer = hits.float().mean().item()
    return {"accuracy": exact if task == "passkey" else per_answer, "exact_match": exact,
            "answer_accuracy": per_answer, "sequences": int(hits.shape[0]), "answers": int(hits.numel())}


__all__ = [
    "BOS",
    "COPY",
    "EXAMPLES",
    "IGNORE_INDEX",
    "KEY",
    "METRICS",
    "PAD",
    "QUERY",
    "SPECIAL_TOKENS",
    "TASKS",
    "TASK_WEIGHT_DECAY",
    "TaskSpec",
    "TaskVocabulary",
    "answer_hits",
    "copy_example",
    "make_batch",
    "min_length",
    "mqar_example",
    "passkey_example",
    "score",
    "vocabulary",
]
