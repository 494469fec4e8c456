"""The embedded default corpus and tokenizer: text that ships with Python, so nothing is downloaded.

``pydoc_data.topics.topics`` is the reference text behind ``help("assert")`` & co. (~80 topics, ~460 kB of
English prose and code from the Python Language Reference). It is split into paragraphs at blank lines;
a paragraph belongs to the validation split when ``crc32(paragraph) mod 1000 < 1000 · validation_fraction``,
which is deterministic, independent of paragraph order and of the Python hash seed.

The default tokenizer is a lower-cased WordPiece (Schuster & Nakajima 2012; BERT's variant, Devlin et al.
2019) learned deterministically (``wordpiece.py``) on the *train* split only and run by ``tokenizers``, with
``[PAD]`` = id 0 (the configs' default ``pad_token_id``), ``[UNK]``, ``[CLS]`` (also used as BOS), ``[SEP]``
(also used as EOS) and ``[MASK]``. It is cached under ``$HF_ATTN_VARIANTS_CACHE`` (default
``~/.cache/hf_attn_variants``) in a folder whose name holds the vocabulary size and a hash of the corpus; the
folder is written to a temporary name under a file lock and renamed into place, so concurrent processes (DDP
ranks, pytest-xdist workers) build it once and a killed build never leaves a half-written tokenizer behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import zlib
from pathlib import Path

from filelock import FileLock
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""In id order: [PAD] = 0, [UNK] = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4."""

DEFAULT_VOCAB_SIZE = 4096
TOKENIZER_FORMAT_VERSION = 2
"""Bumped whenever the tokenizer recipe changes, so stale caches are not reused."""

CORPUS_NAME = "pydoc_data.topics"
CORPUS_DESCRIPTION = (
    "the Python Language Reference topics that ship with CPython (`pydoc_data.topics`), "
    "split into paragraphs; deterministic crc32 train/validation split"
)

_UNDERLINE = re.compile(r"^[*=\-~^\"#+]{3,}$")


def cache_root() -> Path:
    """``$HF_ATTN_VARIANTS_CACHE`` or ``~/.cache/hf_attn_variants`` (created if missing)."""
    root = Path(os.environ.get("HF_ATTN_VARIANTS_CACHE", Path.home() / ".cache" / "hf_attn_variants"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def corpus_paragraphs() -> list[str]:
    """All paragraphs of ``pydoc_data.topics`` in a fixed order (topics sorted by name).

    Heading underlines (``*****``, ``=====``) are dropped; a paragraph is a run of non-blank lines, with
    its internal line breaks and indentation kept (code examples stay readable).
    """
    from pydoc_data.topics import topics

    return [paragraph for name in sorted(topics) for paragraph in split_paragraphs(topics[name])]


def split_paragraphs(text: str) -> list[str]:
    """Runs of non-blank lines of ``text`` (line breaks and indentation kept), heading underlines dropped."""
    paragraphs: list[str] = []
    block: list[str] = []
    for line in [*(line.rstrip() for line in text.splitlines()), ""]:
        if _UNDERLINE.match(line.strip()):
            continue
        if line.strip():
            block.append(line)
        elif block:
            paragraphs.append("\n".join(block))
            block = []
    return paragraphs


def is_validation(paragraph: str, validation_fraction: float) -> bool:
    """Deterministic split: ``crc32(utf-8 text) mod 1000 < 1000 · validation_fraction``."""
    return zlib.crc32(paragraph.encode("utf-8")) % 1000 < round(1000 * validation_fraction)


def corpus_splits(validation_fraction: float = 0.1) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}`` paragraphs of the embedded corpus.

    Raises ``ValueError`` unless ``0 < validation_fraction < 1``.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}.")
    splits: dict[str, list[str]] = {"train": [], "validation": []}
    for paragraph in corpus_paragraphs():
        splits["validation" if is_validation(paragraph, validation_fraction) else "train"].append(paragraph)
    return splits


def corpus_fingerprint() -> str:
    """Short sha256 of the corpus text (differs between Python versions, whose docs differ)."""
    digest = hashlib.sha256()
    for paragraph in corpus_paragraphs():
        digest.update(paragraph.encode("utf-8") + b"\0")
    return digest.hexdigest()[:12]


def train_wordpiece(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train a lower-cased BERT-style WordPiece tokenizer on ``texts`` and wrap it for Transformers.

    The vocabulary is learned by ``wordpiece.learn_wordpiece_vocab`` (deterministic: the same text gives the
    same tokenizer on every machine, unlike ``tokenizers.trainers.WordPieceTrainer``). Encodings are
    ``[CLS] text [SEP]`` (pairs: ``[CLS] a [SEP] b [SEP]``); the wrapper returns only ``input_ids`` and
    ``attention_mask`` (these models take no ``token_type_ids``).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from .wordpiece import learn_wordpiece_vocab

    if (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
            or vocab_size < len(SPECIAL_TOKENS) + 1):
        raise ValueError(f"vocab_size must be an int > {len(SPECIAL_TOKENS)}, got {vocab_size!r}.")
    normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, strip_accents=None)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = (word for text in texts
             for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    vocab = learn_wordpiece_vocab(words, vocab_size, SPECIAL_TOKENS, min_frequency=2)
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]",
                                           max_input_chars_per_word=100))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_input_names=["input_ids", "attention_mask"],
        padding_side="right",
    )


def causal_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """A copy of a fast tokenizer that adds only BOS to a single text (``[CLS] text``, not
    ``[CLS] text [SEP]``).

    A causal LM continues its prompt, so the prompt must not end with EOS; training data gets the EOS back
    explicitly (``group_into_blocks(..., append_eos_id=...)``). Tokenizers that do not append EOS, or have
    no BOS/EOS, are returned unchanged.
    """
    import copy

    from tokenizers import processors

    bos, eos = tokenizer.bos_token, tokenizer.eos_token
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or bos is None or eos is None:
        return tokenizer
    ids = tokenizer("a")["input_ids"]
    if not ids or ids[-1] != tokenizer.eos_token_id:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {eos} $B:1",
        special_tokens=[(bos, tokenizer.bos_token_id), (eos, tokenizer.eos_token_id)],
    )
    return tokenizer


def embedded_tokenizer_path(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Folder of the cached embedded tokenizer, trained (once, under a lock) on first use."""
    target = cache_root() / "tokenizers" / (
        f"pydoc-wordpiece-v{TOKENIZER_FORMAT_VERSION}-{vocab_size}-{corpus_fingerprint()}"
    )
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "tokenizer.json").exists():
            return target
        tokenizer = train_wordpiece(corpus_splits()["train"], vocab_size)
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            tokenizer.save_pretrained(staging)
            if target.exists() and not (target / "tokenizer.json").exists():  # stale, incomplete folder
                shutil.rmtree(target)
            try:
                os.replace(staging, target)
            except OSError:  # another process renamed its complete copy into place first
                if not (target / "tokenizer.json").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def embedded_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The default tokenizer (see module docstring), loaded from its cache folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_tokenizer_path(vocab_size))


__all__ = [
    "CORPUS_DESCRIPTION",
    "CORPUS_NAME",
    "DEFAULT_VOCAB_SIZE",
    "SPECIAL_TOKENS",
    "cache_root",
    "causal_tokenizer",
    "corpus_fingerprint",
    "corpus_paragraphs",
    "corpus_splits",
    "embedded_tokenizer",
    "embedded_tokenizer_path",
    "is_validation",
    "train_wordpiece",
]
