"""Every bad command-line value: one error line naming the flag, exit status 2, no traceback, nothing written.

``CASES`` sweeps the flags of every subcommand with a bad value each (several where a flag can be bad in
several ways: a missing path, a file of the wrong kind, bad content, out of range, a contradicting flag).
Each case runs ``hf_attn_variants.cli.main`` in-process with the working directory in ``tmp_path`` and
checks: exit status 2; stderr is one ``hf-attn-variants <command>: error: …`` line naming the flag
(argparse's own errors too: ``OneLineParser``); no traceback; the output folder (which holds a user file),
the working directory and the shared inputs are unchanged. The ``no_work`` guard
makes any training, measuring, pruning or upload that starts fail the test at once: the validation must
come first.

``test_every_flag_has_a_bad_value_case`` lists the flags each subcommand's parser defines and requires a
case for each, except the flags in ``ANY_VALUE`` (values no check can reject); for the ~150 flags that
finetune takes from ``TrainingArguments`` it requires one case per kind of flag instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, TrainingArguments

from hf_attn_variants.cli import SUBCOMMANDS, main
from hf_attn_variants.training import build_config, corpus_splits, embedded_tokenizer

TINY = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64"
"""``--config_overrides`` of a tiny entropy-invariant model (cases that get as far as building it)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """``hf-attn-variants <command> <argv>`` must fail with one error line naming ``flag``.

    ``argv`` items may hold ``{placeholders}`` filled by ``paths`` (see ``inputs`` and ``run_case``).
    """

    command: str
    argv: tuple[str, ...]
    flag: str
    why: str

    @property
    def id(self) -> str:
        return f"{self.command}-{self.flag.lstrip('-')}-{self.why}"


def cases(command: str, base: tuple[str, ...], table: list[tuple[str, tuple[str, ...], str]]) -> list[Case]:
    """One ``Case`` per ``(flag, extra argv, why)`` row; ``extra`` is appended to ``base`` (argparse keeps the
    last value of a repeated flag, so a row can replace a value of ``base``)."""
    return [Case(command, (*base, *extra), flag, why) for flag, extra, why in table]


def case(command: str, argv: tuple[str, ...], flag: str, why: str) -> Case:
    """A case with a complete ``argv`` (no base), for rows that must leave a flag of the base out."""
    return Case(command, argv, flag, why)


PRETRAIN = ("--output_dir", "{out}", "--model_type", "entropy_invariant", "--config_overrides", TINY,
            "--max_seq_length", "16")
FINETUNE = ("--output_dir", "{out}", "--model_name_or_path", "{model}", "--train_file", "{csv}")
EXPORT = ("--model_name_or_path", "{model}", "--output_dir", "{new}")
PUSH = ("--folder", "{export}", "--repo_id", "someone/tiny")
DEMO = ("--output_dir", "{new}")
PRUNE = ("--model_name_or_path", "{model}", "--train_file", "{txt}", "--output_dir", "{new}")
BENCH = ("--quick", "--output", "{out}/bench.md")
LENGTHGEN = ("--output_dir", "{new}", "--variants", "ei_standard")
ENTROPY = ("--models", "{model}", "--output", "{new}/entropy.json")
# {model} is no GAU-α port: checked after output_dir
CONVERT = ("--checkpoint", "{model}", "--output_dir", "{new}")
RENDER_DOCS = ("--check",)

CASES: list[Case] = [
    # ------------------------------------------------------------------ pretrain
    *cases("pretrain", PRETRAIN, [
        ("--train_file", ("--train_file", "{emptyjson}"), "empty-json"),
        ("--dataset_name", ("--dataset_name", ""), "empty"),
        ("--config_overrides", ("--config_overrides", TINY + ",pad_token_id=99999"), "pad-outside-vocab"),
        ("--config_overrides", ("--config_overrides", "model_type=gau"), "model-type"),
        ("--max_seq_length", ("--max_seq_length", "1"), "sets-base-length-1"),
        ("--config_name", ("--config_name", "{evil}/config.json"), "remote-code"),
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--output_dir", ("--output_dir", "{file}/sub"), "inside-file"),
        ("--model_type", ("--model_type", "bert"), "unknown"),
        ("--model_type", ("--model_type", "gau", "--model_name_or_path", "{model}"), "differs-from-model"),
        ("--config_overrides", ("--config_overrides", "hidden_size=abc"), "not-int"),
        ("--config_overrides", ("--config_overrides", "hidden_size=-1"), "out-of-range"),
        ("--config_overrides", ("--config_overrides", "hidden_size"), "no-equals"),
        ("--config_overrides", ("--config_overrides", "num_heads=4"), "unknown-field"),
        ("--config_name", ("--config_name", "{missing}"), "missing"),
        ("--config_name", ("--config_name", "{badconfig}"), "bad-json"),
        ("--model_name_or_path", ("--model_name_or_path", "{missing}"), "missing"),
        ("--model_name_or_path", ("--model_name_or_path", "{notmodel}"), "no-config"),
        ("--model_name_or_path", ("--model_name_or_path", "{noweights}"), "no-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{evil}"), "remote-code"),
        ("--model_name_or_path", ("--model_name_or_path", "{adapter}"), "adapter"),
        ("--tokenizer_name", ("--tokenizer_name", "{missing}"), "missing"),
        ("--tokenizer_name", ("--tokenizer_name", "{notmodel}"), "no-tokenizer"),
        ("--objective", ("--objective", "span"), "choice"),
        ("--train_file", ("--train_file", "{missing}.txt"), "missing"),
        ("--train_file", ("--train_file", "{tsv}"), "extension"),
        ("--train_file", ("--train_file", "{badjson}"), "bad-content"),
        ("--train_file", ("--train_file", "{tiny}"), "too-few-rows"),
        ("--train_file", ("--train_file", "{short}", "--max_seq_length", "128"), "too-few-tokens"),
        ("--validation_file", ("--validation_file", "{txt}"), "without-train-file"),
        ("--validation_file", ("--train_file", "{txt}", "--validation_file", "{missing}.txt"), "missing"),
        ("--validation_file", ("--train_file", "{txt}", "--validation_file", "{csv}"), "other-format"),
        ("--text_column_name", ("--text_column_name", "body"), "without-train-file"),
        ("--text_column_name", ("--train_file", "{txt}", "--text_column_name", "body"), "not-a-column"),
        ("--train_file", ("--train_file", "{missing}-*.txt"), "glob-matches-nothing"),
        ("--train_file", ("--train_file", "{txt},{csv}"), "mixed-formats"),
        ("--train_file", ("--train_file", "{txt}", "--dataset_name", "{txt}"), "with-dataset-name"),
        ("--dataset_name", ("--dataset_name", "{missing}"), "missing"),
        ("--dataset_config_name", ("--dataset_config_name", "en"), "without-dataset-name"),
        ("--streaming", ("--streaming", "maybe"), "not-bool"),
        ("--streaming", ("--streaming", "--max_train_steps", "2"), "without-data"),
        ("--max_train_steps", ("--train_file", "{txt}", "--streaming"), "streaming-without-steps"),
        ("--checkpointing_steps", ("--train_file", "{txt}", "--streaming", "--max_train_steps", "2",
                                   "--checkpointing_steps", "epoch"), "epoch-when-streaming"),
        ("--max_train_samples", ("--train_file", "{txt}", "--streaming", "--max_train_steps", "2",
                                 "--max_train_samples", "3"), "when-streaming"),
        ("--train_file",
         ("--train_file", "{short}", "--streaming", "--max_train_steps", "2", "--max_seq_length",
                          "128"), "streaming-too-few-tokens"),
        ("--packing", ("--packing", "greedy"), "choice"),
        ("--mixed_length_splits", ("--packing", "documents", "--mixed_length_splits", "2"), "with-documents"),
        ("--validation_split_percentage", ("--validation_split_percentage", "100"), "out-of-range"),
        ("--validation_split_percentage", ("--validation_split_percentage", "five"), "not-int"),
        ("--max_seq_length", ("--max_seq_length", "0"), "zero"),
        ("--per_device_train_batch_size", ("--per_device_train_batch_size", "0"), "zero"),
        ("--per_device_eval_batch_size", ("--per_device_eval_batch_size", "-2"), "negative"),
        ("--learning_rate", ("--learning_rate", "0"), "zero"),
        ("--learning_rate", ("--learning_rate", "nan"), "nan"),
        ("--weight_decay", ("--weight_decay", "-0.1"), "negative"),
        ("--adam_beta1", ("--adam_beta1", "1.0"), "out-of-range"),
        ("--adam_beta2", ("--adam_beta2", "-0.5"), "out-of-range"),
        ("--adam_epsilon", ("--adam_epsilon", "0"), "zero"),
        ("--max_grad_norm", ("--max_grad_norm", "inf"), "inf"),
        ("--num_warmup_steps", ("--num_warmup_steps", "-1"), "negative"),
        ("--lr_scheduler_type", ("--lr_scheduler_type", "warp"), "choice"),
        ("--max_train_steps", ("--max_train_steps", "0"), "zero"),
        ("--num_train_epochs", ("--num_train_epochs", "0"), "zero"),
        ("--gradient_accumulation_steps", ("--gradient_accumulation_steps", "0"), "zero"),
        ("--checkpointing_steps", ("--checkpointing_steps", "often"), "not-int"),
        ("--resume_from_checkpoint", ("--resume_from_checkpoint", "{missing}"), "missing"),
        ("--resume_from_checkpoint", ("--resume_from_checkpoint", "latest"), "no-checkpoint"),
        ("--seed", ("--seed", "-1"), "negative"),
        ("--seed", ("--seed", str(2**32)), "too-large"),
        ("--with_tracking", ("--with_tracking", "maybe"), "not-bool"),
        ("--mixed_precision", ("--mixed_precision", "fp8"), "choice"),
        ("--mlm_probability", ("--mlm_probability", "1.5"), "out-of-range"),
        ("--torch_compile", ("--torch_compile", "maybe"), "not-bool"),
        ("--torch_compile_backend", ("--torch_compile", "--torch_compile_backend", "fastest"), "unknown"),
        ("--torch_compile_backend", ("--torch_compile_backend", "eager"), "without-torch-compile"),
        ("--torch_compile_mode", ("--torch_compile", "--torch_compile_mode", "fastest"), "choice"),
        ("--torch_compile_mode", ("--torch_compile_mode", "default"), "without-torch-compile"),
        ("--mixed_length_splits", ("--mixed_length_splits", "3"), "not-a-divisor"),
        ("--mixed_length_splits", ("--mixed_length_splits", "two"), "not-int"),
        ("--logging_steps", ("--logging_steps", "0"), "zero"),
        ("--eval_steps", ("--eval_steps", "0"), "zero"),
        ("--max_train_samples", ("--max_train_samples", "0"), "zero"),
        ("--max_eval_samples", ("--max_eval_samples", "0"), "zero"),
        ("--preprocessing_num_workers", ("--preprocessing_num_workers", "0"), "zero"),
        ("--disable_tqdm", ("--disable_tqdm", "maybe"), "not-bool"),
        ("--fsdp_size", ("--fsdp_size", "0"), "zero"),
        ("--fsdp_size", ("--fsdp_size", "2"), "without-torchrun"),
        ("--tp_size", ("--tp_size", "two"), "not-int"),
        ("--dp_replicate_size", ("--dp_replicate_size", "-1"), "negative"),
        ("--mixed_precision", ("--fsdp_size", "2", "--mixed_precision", "fp16"), "fp16-sharded"),
        *([("--mixed_precision", ("--mixed_precision", "fp16"), "fp16-on-a-cpu")]
          if not torch.accelerator.is_available() else []),
        ("--save_total_limit", ("--save_total_limit", "0"), "zero"),
        ("--checkpointing_minutes", ("--checkpointing_minutes", "-1"), "negative"),
        ("--write_into_output_dir", ("--write_into_output_dir", "maybe"), "not-bool"),
        ("--overwrite_output_dir", ("--overwrite_output_dir", "maybe"), "not-bool"),
        ("--overwrite_output_dir",
         ("--train_file", "{runs}/pretrain/train.txt", "--output_dir", "{runs}/pretrain",
                                    "--overwrite_output_dir"), "holds-an-input"),
        ("--output_dir", ("--output_dir", "{runs}/pretrain"), "other-run"),
        ("--output_dir", ("--output_dir", "{runs}/finetune"), "other-command"),
        ("--output_dir", ("--output_dir", "{model}"), "unrecorded-model"),
    ]),
    case("pretrain", ("--output_dir", "{out}"), "--model_type", "no-model"),
    # ------------------------------------------------------------------ finetune: FinetuneArguments
    *cases("finetune", FINETUNE, [
        ("--train_file", ("--train_file", "{emptyjson}"), "empty-json"),
        ("--train_file", ("--train_file", "{nulltext}"), "null-text"),
        ("--train_file", ("--train_file", "{nulllabel}"), "null-label"),
        ("--train_file", ("--train_file", "{nanlabel}"), "nan-label"),
        ("--model_name_or_path", ("--model_name_or_path", "{gau}", "--config_overrides", "hidden_size=64"),
         "shapes-overridden"),
        ("--model_name_or_path", ("--model_name_or_path", "{evil}"), "remote-code"),
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--task", ("--task", "summarization"), "choice"),
        ("--task", ("--task", "token_classification", "--train_file", "{intcsv}"), "one-label-per-row"),
        ("--train_file", ("--train_file", "{missing}.csv"), "missing"),
        ("--train_file", ("--train_file", "{tsv}"), "extension"),
        ("--train_file", ("--train_file", "{badjson}"), "bad-content"),
        ("--train_file", ("--train_file", "{tinycsv}"), "too-few-rows"),
        ("--train_file", ("--task", "token_classification", "--train_file", "{ner}"), "tags-mismatch"),
        ("--validation_file", ("--validation_file", "{missing}.csv"), "missing"),
        ("--validation_file", ("--validation_file", "{txt}"), "other-format"),
        ("--validation_file", ("--validation_file", "{othercsv}"), "other-columns"),
        ("--validation_split_percentage", ("--validation_split_percentage", "0"), "zero"),
        ("--model_name_or_path", ("--model_name_or_path", "/nonexistent"), "missing"),
        ("--model_name_or_path", ("--model_name_or_path", "{file}"), "file"),
        ("--model_name_or_path", ("--model_name_or_path", "{notmodel}"), "no-config"),
        ("--model_name_or_path", ("--model_name_or_path", "{noweights}"), "no-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{badconfig}"), "bad-json"),
        ("--model_name_or_path", ("--model_name_or_path", "{adapter}"), "adapter"),
        ("--model_type", ("--model_type", "bert"), "unknown"),
        ("--config_overrides", ("--config_overrides", "hidden_size=abc"), "not-int"),
        ("--config_name", ("--config_name", "{missing}"), "missing"),
        ("--tokenizer_name", ("--tokenizer_name", "{missing}"), "missing"),
        ("--tokenizer_name", ("--tokenizer_name", "{notmodel}"), "no-tokenizer"),
        ("--text_column_name", ("--text_column_name", "body"), "not-a-column"),
        ("--text_pair_column_name", ("--text_pair_column_name", "second"), "not-a-column"),
        ("--label_column_name", ("--label_column_name", "gold"), "not-a-column"),
        ("--label_column_name", ("--train_file", "{othercsv}"), "no-label-column"),
        ("--max_seq_length", ("--max_seq_length", "0"), "zero"),
        ("--pad_to_max_length", ("--pad_to_max_length", "maybe"), "not-bool"),
        ("--max_train_samples", ("--max_train_samples", "0"), "zero"),
        ("--max_eval_samples", ("--max_eval_samples", "-1"), "negative"),
        ("--label_all_tokens", ("--label_all_tokens", "true"), "sequence-task"),
        ("--return_entity_level_metrics", ("--return_entity_level_metrics", "true"), "sequence-task"),
        ("--lora_r", ("--lora_r", "-1"), "negative"),
        ("--lora_alpha", ("--lora_alpha", "0"), "zero"),
        ("--lora_dropout", ("--lora_dropout", "1.0"), "out-of-range"),
        ("--lora_target_modules", ("--lora_target_modules", "q_proj"), "without-lora"),
        ("--lora_target_modules", ("--lora_r", "4", "--lora_target_modules", "nope_proj"), "no-such-module"),
        ("--lora_merge", ("--lora_merge", "true"), "without-lora"),
        ("--early_stopping_patience", ("--early_stopping_patience", "0"), "zero"),
        ("--early_stopping_threshold", ("--early_stopping_threshold", "-0.5"), "negative"),
        ("--fsdp_size", ("--fsdp_size", "0"), "zero"),
        ("--fsdp_size", ("--fsdp_size", "2"), "without-torchrun"),
        ("--tp_size", ("--tp_size", "two"), "not-int"),
        ("--dp_replicate_size", ("--dp_replicate_size", "-1"), "negative"),
        ("--lora_r", ("--lora_r", "4", "--fsdp_size", "2"), "sharded"),
        ("--checkpointing_minutes", ("--checkpointing_minutes", "nan"), "nan"),
        ("--write_into_output_dir", ("--write_into_output_dir", "maybe"), "not-bool"),
        ("--overwrite_output_dir", ("--overwrite_output_dir", "maybe"), "not-bool"),
        ("--output_dir", ("--output_dir", "{runs}/finetune"), "other-run"),
    ]),
    case("finetune", ("--output_dir", "{out}", "--model_name_or_path", "{model}"), "--train_file", "none"),
    case("finetune", ("--output_dir", "{out}", "--train_file", "{csv}"), "--model_name_or_path", "no-model"),
    # ------------------------------------------------------------------ finetune: TrainingArguments
    *cases("finetune", FINETUNE, [
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--per_device_train_batch_size", ("--per_device_train_batch_size", "0"), "zero"),
        ("--per_device_eval_batch_size", ("--per_device_eval_batch_size", "0"), "zero"),
        ("--gradient_accumulation_steps", ("--gradient_accumulation_steps", "0"), "zero"),
        ("--eval_accumulation_steps", ("--eval_accumulation_steps", "0"), "zero"),
        ("--dataloader_num_workers", ("--dataloader_num_workers", "-1"), "negative"),
        ("--seed", ("--seed", "abc"), "not-int"),
        ("--seed", ("--seed", "-1"), "negative"),
        ("--data_seed", ("--data_seed", "-1"), "negative"),
        ("--learning_rate", ("--learning_rate", "-1"), "negative"),
        ("--learning_rate", ("--learning_rate", "nan"), "nan"),
        ("--num_train_epochs", ("--num_train_epochs", "0"), "zero"),
        ("--num_train_epochs", ("--num_train_epochs", "three"), "not-float"),
        ("--weight_decay", ("--weight_decay", "-1"), "negative"),
        ("--adam_beta1", ("--adam_beta1", "1.5"), "out-of-range"),
        ("--adam_beta2", ("--adam_beta2", "1"), "out-of-range"),
        ("--adam_epsilon", ("--adam_epsilon", "0"), "zero"),
        ("--max_grad_norm", ("--max_grad_norm", "-1"), "negative"),
        ("--label_smoothing_factor", ("--label_smoothing_factor", "1"), "out-of-range"),
        ("--warmup_steps", ("--warmup_steps", "-1"), "negative"),
        ("--fp16", ("--fp16", "maybe"), "not-bool"),
        ("--fp16", ("--fp16", "--use_cpu"), "on-a-cpu"),
        ("--tf32", ("--tf32", "maybe"), "not-bool"),
        ("--eval_strategy", ("--eval_strategy", "sometimes"), "choice"),
        ("--optim", ("--optim", "sgd_with_wings"), "choice"),
        ("--log_level", ("--log_level", "loud"), "choice"),
        ("--include_for_metrics", ("--include_for_metrics", "logits"), "unknown"),
        ("--debug", ("--debug", "verbose"), "unknown"),
        ("--report_to", ("--report_to", "carrier_pigeon"), "unknown"),
        ("--lr_scheduler_kwargs", ("--lr_scheduler_kwargs", "{{bad"), "bad-json"),
        ("--accelerator_config", ("--accelerator_config", "{missing}.json"), "missing"),
        ("--liger_kernel_config", ("--liger_kernel_config", "x"), "not-dict"),
        ("--parallelism_config", ("--parallelism_config", "x"), "not-config"),
        ("--resume_from_checkpoint", ("--resume_from_checkpoint", "{missing}"), "missing"),
        ("--load_best_model_at_end", ("--load_best_model_at_end", "true", "--eval_strategy", "epoch"),
         "strategies"),
        ("--dataloader_prefetch_factor", ("--dataloader_prefetch_factor", "2"), "without-workers"),
        ("--enable_jit_checkpoint", ("--enable_jit_checkpoint", "true"), "own-preemption"),
    ]),
    # ------------------------------------------------------------------ export
    *cases("export", EXPORT, [
        ("--model_name_or_path", ("--model_name_or_path", "{corrupt}"), "corrupt-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{sharded}"), "corrupt-shard"),
        ("--model_card_template", ("--model_card_template", "{binary}"), "not-utf8"),
        ("--model_name_or_path", ("--model_name_or_path", "{evil}"), "remote-code"),
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--overwrite", ("--output_dir", ".", "--overwrite", "true"), "holds-working-directory"),
        ("--model_name_or_path", ("--model_name_or_path", "{missing}"), "missing"),
        ("--model_name_or_path", ("--model_name_or_path", "{file}"), "file"),
        ("--model_name_or_path", ("--model_name_or_path", "{notmodel}"), "no-config"),
        ("--model_name_or_path", ("--model_name_or_path", "{noweights}"), "no-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{adapter}"), "adapter"),
        ("--model_name_or_path", ("--model_name_or_path", "{badconfig}"), "bad-config"),
        ("--model_name_or_path", ("--model_name_or_path", "{untokenized}"), "no-tokenizer"),
        ("--output_dir", ("--output_dir", "{out}"), "not-empty"),
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--output_dir", ("--output_dir", "{model}", "--overwrite", "true"), "same-as-model"),
        ("--output_dir",
         ("--model_name_or_path", "{nest}/model", "--output_dir", "{nest}", "--overwrite", "true"),
         "holds-model"),
        ("--repo_id", ("--repo_id", "not a repo id!"), "malformed"),
        ("--tokenizer_name", ("--tokenizer_name", "{missing}"), "missing"),
        ("--tokenizer_name", ("--tokenizer_name", "{notmodel}"), "no-tokenizer"),
        ("--license", ("--license", "Apache License 2.0"), "malformed"),
        ("--tags", ("--tags", " "), "empty"),
        ("--model_card_template", ("--model_card_template", "{missing}.md"), "missing"),
        ("--model_card_template", ("--model_card_template", "{badtemplate}"), "bad-jinja"),
        ("--model_card_template", ("--model_card_template", "{txt}"), "no-card-data"),
        ("--overwrite", ("--overwrite", "maybe"), "not-bool"),
        ("--sentence_transformers", ("--sentence_transformers", "maybe"), "not-bool"),
        ("--pooling", ("--pooling", "median", "--sentence_transformers", "true"), "unknown"),
        ("--pooling", ("--pooling", "mean"), "without-sentence-transformers"),
        ("--onnx", ("--onnx", "maybe"), "not-bool"),
    ]),
    # ------------------------------------------------------------------ convert-gau-alpha
    *cases("convert-gau-alpha", CONVERT, [
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--overwrite", ("--output_dir", ".", "--overwrite", "true"), "holds-working-directory"),
        ("--checkpoint", ("--checkpoint", "{missing}"), "missing"),
        ("--checkpoint", ("--checkpoint", "{file}"), "file"),
        ("--checkpoint", ("--checkpoint", "{notmodel}"), "no-config"),
        ("--checkpoint", ("--checkpoint", "{badconfig}"), "bad-json"),
        ("--checkpoint", (), "not-a-gau-alpha-port"),
        ("--output_dir", ("--output_dir", "{out}"), "not-empty"),
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--overwrite", ("--overwrite", "maybe"), "not-bool"),
    ]),
    # ------------------------------------------------------------------ push
    *cases("push", PUSH, [
        ("--folder", ("--folder", "{missing}"), "missing"),
        ("--folder", ("--folder", "{file}"), "file"),
        ("--folder", ("--folder", "{model}"), "not-an-export"),
        ("--repo_id", ("--repo_id", "not a repo id!"), "malformed"),
        ("--repo_id", ("--repo_id", "a/b/c"), "too-many-parts"),
        ("--private", ("--private", "maybe"), "not-bool"),
        ("--token", ("--token", ""), "empty"),  # else the stored login pushed in its place
        ("--commit_message", ("--commit_message", " "), "empty"),
        ("--revision", ("--revision", ""), "empty"),
    ]),
    # ------------------------------------------------------------------ demo
    *cases("demo", DEMO, [
        ("--output_dir", ("--output_dir", "{out}"), "user-files"),  # the demo would replace its own names
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--families", ("--families", "bert"), "unknown"),
        ("--max_seq_length", ("--max_seq_length", "4"), "too-small"),
        ("--max_seq_length", ("--max_seq_length", "long"), "not-int"),
        ("--length_multipliers", ("--length_multipliers", "1", "0"), "zero"),
        # found after training every family before: the evaluation text holds 9,766 tokens, the training 101k
        ("--length_multipliers", ("--length_multipliers", "1", "256"), "longer-than-the-validation-text"),
        ("--max_seq_length", ("--max_seq_length", "200000"), "longer-than-the-training-text"),
        ("--output_dir", ("--output_dir", "/proc/demo"), "unwritable"),  # a traceback before
        ("--max_train_steps", ("--max_train_steps", "0"), "zero"),
        ("--per_device_train_batch_size", ("--per_device_train_batch_size", "0"), "zero"),
        ("--learning_rate", ("--learning_rate", "-0.1"), "negative"),
        ("--num_warmup_steps", ("--num_warmup_steps", "-5"), "negative"),
        ("--hidden_size", ("--hidden_size", "0"), "zero"),
        ("--hidden_size", ("--hidden_size", "30"), "not-a-multiple-of-heads"),
        ("--num_hidden_layers", ("--num_hidden_layers", "0"), "zero"),
        ("--seed", ("--seed", "-3"), "negative"),
        ("--sentence", ("--sentence", "no mask here"), "no-mask"),
        ("--num_threads", ("--num_threads", "-1"), "negative"),
    ]),
    # ------------------------------------------------------------------ prune
    *cases("prune", PRUNE, [
        ("--train_file", ("--train_file", "{emptyjson}"), "empty-json"),
        ("--model_name_or_path", ("--model_name_or_path", "{corrupt}"), "corrupt-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{evil}"), "remote-code"),
        ("--model_name_or_path", ("--model_name_or_path", "{badtype}"), "config-field-of-a-wrong-type"),
        ("--model_name_or_path", ("--model_name_or_path", ""), "empty"),
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--model_name_or_path", ("--model_name_or_path", "{missing}"), "missing"),
        ("--model_name_or_path", ("--model_name_or_path", "{notmodel}"), "no-config"),
        ("--model_name_or_path", ("--model_name_or_path", "{noweights}"), "no-weights"),
        ("--model_name_or_path", ("--model_name_or_path", "{gau}"), "no-heads"),
        ("--tokenizer_name", ("--tokenizer_name", "{missing}"), "missing"),
        ("--train_file", ("--train_file", "{missing}.txt"), "missing"),
        ("--train_file", ("--train_file", "{tsv}"), "extension"),
        ("--train_file", ("--train_file", "{badjson}"), "bad-content"),
        ("--validation_file", ("--validation_file", "{missing}.txt"), "missing"),
        ("--validation_split_percentage", ("--validation_split_percentage", "100"), "out-of-range"),
        ("--task", ("--task", "summarization"), "choice"),
        ("--task", ("--task", "token_classification", "--train_file", "{intcsv}"), "one-label-per-row"),
        ("--task", ("--task", "classification"), "other-head"),
        ("--text_column", ("--text_column", "body"), "not-a-column"),
        ("--text_pair_column", ("--text_pair_column", "second"), "not-a-column"),
        ("--label_column",
         ("--model_name_or_path", "{clf}", "--train_file", "{csv}", "--label_column", "gold"),
         "not-a-column"),
        ("--max_seq_length", ("--max_seq_length", "0"), "zero"),
        ("--batch_size", ("--batch_size", "-4"), "negative"),
        ("--num_importance_examples", ("--num_importance_examples", "0"), "zero"),
        ("--num_eval_examples", ("--num_eval_examples", "0"), "zero"),
        ("--fraction", ("--fraction", "1.5"), "out-of-range"),
        ("--fraction", ("--fraction", "some"), "not-float"),
        ("--threshold", ("--threshold", "-1"), "negative"),
        ("--threshold", ("--threshold", "high"), "not-float"),
        ("--max_heads_pruned", ("--max_heads_pruned", "-1"), "negative"),
        ("--max_heads_pruned", ("--max_heads_pruned", "1.5"), "fraction-above-1"),
        ("--max_heads_pruned", ("--max_heads_pruned", "half"), "not-a-number"),
        ("--min_heads_per_layer", ("--min_heads_per_layer", "-1"), "negative"),
        ("--min_heads_per_layer", ("--min_heads_per_layer", "2"), "all-heads"),
        ("--mlm_probability", ("--mlm_probability", "0"), "zero"),
        ("--seed", ("--seed", "-1"), "negative"),
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--output_dir", ("--output_dir", "{runs}/prune"), "other-run"),
    ]),
    # ------------------------------------------------------------------ render-docs
    *cases("render-docs", RENDER_DOCS, [
        ("--root", ("--root", "{out}"), "no-readme"),
        ("--root", ("--root", "{file}"), "file"),
        ("--root", ("--root", "{missing}"), "missing"),
    ]),
    # ------------------------------------------------------------------ bench
    *cases("bench", BENCH, [
        ("--output", ("--output", "/proc/bench/b.md"), "unwritable"),  # found after measuring before
        ("--preset", ("--preset", "huge"), "choice"),
        ("--preset", ("--preset", "cpu"), "contradicts-quick"),
        ("--device", ("--device", "tpu"), "unknown"),
        ("--dtype", ("--dtype", "float8"), "choice"),
        ("--lengths", ("--lengths", "32", "0"), "zero"),
        ("--lengths", ("--lengths", "long"), "not-int"),
        ("--repeats", ("--repeats", "0"), "zero"),
        ("--only", ("--only", "no_such_variant"), "unknown"),
        ("--compile-lengths", ("--compile-lengths", "-8"), "negative"),
        ("--threads", ("--threads", "0"), "zero"),
        ("--timer", ("--timer", "sundial"), "choice"),
        ("--peak-tflops", ("--peak-tflops", "-1"), "negative"),
        ("--peak-tflops", ("--peak-tflops", "nan"), "nan"),
        ("--output", ("--output", "{out}"), "folder"),
        ("--output", ("--output", "{file}/bench.md"), "inside-file"),
        ("--json", ("--json", "{out}"), "folder"),
        ("--json", ("--output", "{new}/bench.md", "--json", "{foreignjson}"), "not-results"),
        ("--threads", ("--threads", "100000"), "more-than-the-machine-has"),
        ("--report-only", ("--report-only", "{missing}.json"), "missing"),
        ("--report-only", ("--report-only", ""), "empty"),  # Path("") is "."
        ("--report-only", ("--report-only", "{badjson}"), "not-json"),
        ("--report-only", ("--report-only", "{foreignjson}"), "not-results"),
        ("--lengths", ("--report-only", "{foreignjson}", "--lengths", "32"), "with-report-only"),
        ("--compile-lengths", ("--no-compile", "--compile-lengths", "32"), "with-no-compile"),
        ("--peak-tflops", ("--no-flops", "--peak-tflops", "100"), "with-no-flops"),
    ]),
    # ------------------------------------------------------------------ lengthgen
    *cases("lengthgen", LENGTHGEN, [
        ("--output_dir", ("--output_dir", "/proc/lengthgen"), "unwritable"),
        ("--train_file", ("--train_file", "{emptyjson}"), "empty-json"),
        ("--output_dir", ("--output_dir", ""), "empty"),  # Path("") would be the working directory
        ("--output_dir", ("--output_dir", "{file}"), "file"),
        ("--variants", ("--variants", "gau_relu3"), "unknown"),
        ("--train_length", ("--train_length", "2"), "too-small"),
        ("--train_length", ("--train_length", "long"), "not-int"),
        ("--train_length", ("--train_length", "100000000"), "longer-than-the-corpus"),  # named eval_lengths
        ("--eval_lengths", ("--eval_lengths", "1", "64"), "too-small"),
        ("--max_train_steps", ("--max_train_steps", "0"), "zero"),
        ("--seeds", ("--seeds", "0", "0"), "repeated"),
        ("--seeds", ("--seeds", "-1"), "negative"),
        ("--mixed_length", ("--mixed_length", "maybe"), "not-bool"),
        ("--mixed_length_splits", ("--mixed_length_splits", "3"), "not-a-divisor"),
        ("--mixed_length_splits", ("--mixed_length_splits", "0"), "zero"),
        ("--objective", ("--objective", "span"), "choice"),
        ("--hidden_size", ("--hidden_size", "0"), "zero"),
        ("--num_hidden_layers", ("--num_hidden_layers", "0"), "zero"),
        ("--num_attention_heads", ("--num_attention_heads", "5"), "not-a-divisor"),
        ("--hidden_size", ("--hidden_size", "30", "--num_attention_heads", "2"), "odd-rope-heads"),
        ("--intermediate_size", ("--intermediate_size", "0"), "zero"),
        ("--attention_key_size", ("--attention_key_size", "-2"), "negative"),
        ("--attention_key_size", ("--variants", "gau_softmax", "--attention_key_size", "3"), "odd-with-rope"),
        ("--gau_layer_factor", ("--gau_layer_factor", "0"), "zero"),
        ("--synthesizer_length_factor", ("--synthesizer_length_factor", "0"), "zero"),
        ("--hidden_dropout_prob", ("--hidden_dropout_prob", "1.5"), "out-of-range"),
        ("--initializer_range", ("--initializer_range", "0"), "zero"),
        ("--per_device_train_batch_size", ("--per_device_train_batch_size", "0"), "zero"),
        ("--learning_rate", ("--learning_rate", "0"), "zero"),
        ("--num_warmup_steps", ("--num_warmup_steps", "-1"), "negative"),
        ("--train_file", ("--train_file", "{missing}.txt"), "missing"),
        ("--train_file", ("--train_file", "{short}", "--train_length", "128"), "too-few-tokens"),
        ("--validation_file", ("--validation_file", "{txt}"), "without-train-file"),
        ("--validation_file", ("--train_file", "{txt}", "--validation_file", "{missing}.txt"), "missing"),
        ("--max_train_samples", ("--max_train_samples", "0"), "zero"),
        ("--eval_batch_size", ("--eval_batch_size", "0"), "zero"),
        ("--eval_mask_repeats", ("--eval_mask_repeats", "0"), "zero"),
        ("--eval_seed", ("--eval_seed", "-1"), "negative"),
        ("--max_eval_tokens", ("--max_eval_tokens", "0"), "zero"),
        ("--checkpointing_steps", ("--checkpointing_steps", "0"), "zero"),
        ("--finetune", ("--finetune", "maybe"), "not-bool"),
        ("--finetune_tasks", ("--finetune_tasks", "paragraph"), "unknown"),
        ("--finetune_topics", ("--finetune_topics", "0"), "zero"),
        ("--finetune_words", ("--finetune_words", "0"), "zero"),
        ("--finetune_epochs", ("--finetune_epochs", "0"), "zero"),
        ("--finetune_learning_rate", ("--finetune_learning_rate", "-1"), "negative"),
        ("--finetune_batch_size", ("--finetune_batch_size", "0"), "zero"),
        ("--finetune_max_train_samples", ("--finetune_max_train_samples", "0"), "zero"),
        ("--num_threads", ("--num_threads", "0"), "zero"),
        ("--quick", ("--quick", "maybe"), "not-bool"),
        ("--disable_tqdm", ("--disable_tqdm", "maybe"), "not-bool"),
        ("--no_plot", ("--no_plot", "maybe"), "not-bool"),
        ("--write_into_output_dir", ("--write_into_output_dir", "maybe"), "not-bool"),
        ("--overwrite_output_dir", ("--overwrite_output_dir", "maybe"), "not-bool"),
        ("--output_dir", ("--output_dir", "{runs}/lengthgen"), "other-run"),
        ("--task", ("--task", "sorting"), "choice"),
        ("--position_embedding_types", ("--position_embedding_types", "alibi"), "choice"),
        ("--position_embedding_types", ("--position_embedding_types", "none"), "lm-is-rope-only"),
        ("--num_kv_pairs", ("--task", "mqar", "--num_kv_pairs", "0"), "zero"),
        ("--num_kv_pairs", ("--task", "mqar", "--num_kv_pairs", "20"), "does-not-fit"),
        ("--num_kv_pairs", ("--num_kv_pairs", "5"), "with-task-lm"),  # accepted and ignored before
        ("--passkey_digits", ("--task", "passkey", "--passkey_digits", "0"), "zero"),
        ("--task_vocab_size", ("--task", "passkey", "--task_vocab_size", "1"), "too-small"),
        ("--eval_samples", ("--task", "passkey", "--eval_samples", "0"), "zero"),
        ("--eval_memory_gib", ("--task", "passkey", "--eval_memory_gib", "0"), "zero"),
        ("--mixed_length", ("--task", "passkey", "--mixed_length", "true"), "lm-only"),
        ("--num_hidden_layers", ("--task", "passkey", "--position_embedding_types", "nope_every_4"),
         "two-for-nope-every-4"),
        ("--task_bos", ("--task", "passkey", "--task_bos", "maybe"), "not-bool"),
        ("--task_bos", ("--task_bos", "false"), "lm-only"),
        ("--weight_decay", ("--task", "passkey", "--weight_decay", "-0.1"), "negative"),
        ("--weight_decay", ("--weight_decay", "0"), "lm-only"),
        ("--copy_warmup_steps", ("--task", "mqar", "--max_train_steps", "10", "--copy_warmup_steps", "10"),
         "no-task-steps-left"),
        ("--copy_warmup_steps", ("--copy_warmup_steps", "5"), "lm-only"),
        ("--save_models", ("--task", "passkey", "--save_models", "maybe"), "not-bool"),
        ("--save_models", ("--save_models", "true"), "lm-only"),
    ]),
    # ------------------------------------------------------------------ entropy
    *cases("entropy", ENTROPY, [
        ("--models", ("--models", "{corrupt}"), "corrupt-weights"),
        ("--text_file", ("--text_file", "{binary}"), "not-utf8"),
        ("--models", ("--models", "{evil}"), "remote-code"),
        ("--models", ("--models", "{missing}"), "missing"),
        ("--models", ("--models", "{notmodel}"), "no-config"),
        ("--models", ("--models", "{noweights}"), "no-weights"),
        ("--models", ("--models", "{badconfig}"), "bad-config"),
        ("--names", ("--names", "a", "b"), "count"),
        ("--output", ("--output", "{out}"), "folder"),
        ("--output", ("--output", "{file}/entropy.json"), "inside-file"),
        ("--no_plot", ("--no_plot", "maybe"), "not-bool"),
        ("--task", ("--task", "sorting"), "choice"),
        ("--train_length", ("--train_length", "2"), "too-small"),
        ("--train_length", ("--train_length", "long"), "not-int"),
        ("--lengths", ("--lengths", "1"), "too-small"),
        ("--lengths", ("--task", "passkey", "--lengths", "6"), "shorter-than-an-example"),
        ("--samples", ("--samples", "0"), "zero"),
        ("--seed", ("--seed", "-1"), "negative"),
        ("--text_file", ("--text_file", "{missing}.txt"), "missing"),
        ("--text_file", ("--task", "passkey", "--text_file", "{txt}"), "with-a-task"),
        ("--task_vocab_size", ("--task", "passkey", "--task_vocab_size", "1"), "too-small"),
        ("--task_vocab_size", ("--task", "passkey", "--task_vocab_size", "99999"), "beyond-the-model"),
        ("--passkey_digits", ("--task", "passkey", "--passkey_digits", "0"), "zero"),
        ("--num_kv_pairs", ("--task", "mqar", "--num_kv_pairs", "0"), "zero"),
        ("--stock_modes", ("--stock_modes", "flash"), "unknown"),
        ("--stock_scope", ("--stock_scope", "some"), "choice"),
        ("--memory_gib", ("--memory_gib", "0"), "zero"),
    ]),
]

ANY_VALUE: dict[str, dict[str, str]] = {
    "pretrain": {},
    "finetune": {},
    "export": {},
    "push": {},
    "demo": {},
    "prune": {
        "--rescore": "a switch (store_true), takes no value",
        "--no_normalize_per_layer": "a switch (store_true), takes no value",
        "--uniform": "a switch (store_true), takes no value; its bad combinations: tests/test_pruning_cli.py",
        "--overwrite_output_dir": "a switch (store_true), takes no value; what it refuses to clear: the "
                                  "pretrain case holds-an-input and tests/test_resume.py",
        "--write_into_output_dir": "a switch (store_true), takes no value; what it allows: "
                                   "tests/test_first_use.py",
    },
    "bench": {
        "--quick": "a switch (store_true), takes no value",
        "--no-compile": "a switch (store_true), takes no value",
        "--no-graph-check": "a switch (store_true), takes no value",
        "--no-flops": "a switch (store_true), takes no value",
        "--no-plots": "a switch (store_true), takes no value",
        "--merge": "a switch (store_true), takes no value; its refusals (no committed results, other "
                   "settings): tests/test_bench.py",
        "--publish": "a switch (store_true), takes no value; its refusals: tests/test_bench.py",
    },
    "lengthgen": {},
    "entropy": {},
    "convert-gau-alpha": {},
    "render-docs": {"--check": "a switch (store_true), takes no value"},
}
"""Per subcommand, the flags without a bad-value case, each with the reason no value of it is bad."""


# ---------------------------------------------------------------- inputs
def save_model(model: torch.nn.Module, folder: Path) -> Path:
    """``model`` and the embedded tokenizer saved in ``folder``."""
    model.save_pretrained(folder)
    embedded_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The shared read-only inputs the cases point at (placeholder → path)."""
    root = tmp_path_factory.mktemp("inputs")
    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    config = build_config("entropy_invariant", config_overrides=TINY, tokenizer=tokenizer, max_seq_length=16)
    model = save_model(AutoModelForMaskedLM.from_config(config), root / "model")
    save_model(AutoModelForMaskedLM.from_config(config), root / "nest" / "model")
    save_model(AutoModelForSequenceClassification.from_config(config), root / "clf")
    gau = build_config("gau", config_overrides="hidden_size=32,num_hidden_layers=1,attention_key_size=16",
                       tokenizer=tokenizer, max_seq_length=16)
    save_model(AutoModelForMaskedLM.from_config(gau), root / "gau")
    AutoModelForMaskedLM.from_config(config).save_pretrained(root / "untokenized")  # a model, no tokenizer
    evil = save_model(AutoModelForMaskedLM.from_config(config), root / "evil")  # code of its own:
    evil_config = json.loads((evil / "config.json").read_text())
    evil_config.update(model_type="not_ours", auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    (evil / "config.json").write_text(json.dumps(evil_config))
    (evil / "configuration_evil.py").write_text(f"open({str(root / 'ran.txt')!r}, 'w').close()\n")
    badtype = save_model(AutoModelForMaskedLM.from_config(config), root / "badtype")  # a traceback before
    badtype_config = json.loads((badtype / "config.json").read_text())
    (badtype / "config.json").write_text(json.dumps({**badtype_config, "num_attention_heads": "two"}))
    corrupt = save_model(AutoModelForMaskedLM.from_config(config), root / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"\xff" * 8)  # a header length past the file's end
    (root / "binary.txt").write_bytes(bytes(range(256)) * 4)  # not UTF-8
    sharded = root / "sharded"
    AutoModelForMaskedLM.from_config(config).save_pretrained(sharded, max_shard_size="100KB")
    tokenizer.save_pretrained(sharded)
    sorted(sharded.glob("model-*.safetensors"))[0].write_bytes(b"\xff" * 8)  # one shard corrupt
    (root / "empty.jsonl").write_text("")
    for name, column, labels, bad in (("nulltext", "text", ["a", "b"], None),
                                      ("nulllabel", "label", ["a", "b"], None),
                                      ("nanlabel", "label", [0.0, 1.0], float("nan"))):  # regression
        rows = [{"text": f"hello {i}", "label": labels[i % 2]} for i in range(12)]
        rows[3][column] = bad
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "noweights").mkdir()
    config.save_pretrained(root / "noweights")
    tokenizer.save_pretrained(root / "noweights")
    (root / "notmodel").mkdir()
    (root / "notmodel" / "notes.txt").write_text("not a model\n")
    (root / "badconfig").mkdir()
    (root / "badconfig" / "config.json").write_text("{not json")
    (root / "adapter").mkdir()
    (root / "adapter" / "adapter_config.json").write_text("{}")
    export = root / "export"
    export.mkdir()
    for name, text in {"config.json": '{"auto_map": {}, "model_type": "x"}', "README.md": "card",
                       "tokenizer_config.json": "{}", "model.safetensors": "", "configuration_x.py": "",
                       "modeling_x.py": ""}.items():
        (export / name).write_text(text)
    paragraphs = [p.replace("\n", " ") for p in corpus_splits()["train"][:60]]
    (root / "train.txt").write_text("\n".join(paragraphs) + "\n")
    (root / "tiny.txt").write_text("one line\n")
    (root / "short.txt").write_text("a\n" * 30)
    (root / "train.tsv").write_text("text\tlabel\nhello\t1\n")
    (root / "bad.jsonl").write_text('{"text": "unterminated\n')
    (root / "results.json").write_text(json.dumps({"not": "a bench run"}))
    (root / "bad_template.md").write_text("{% if %}\n")
    (root / "plain.txt").write_text("a file where a folder is expected\n")
    # folders of earlier runs (outputs.py's rule)
    for command in ("pretrain", "finetune", "prune", "lengthgen"):
        (root / "runs" / command).mkdir(parents=True)
        (root / "runs" / command / "run.json").write_text(json.dumps(
            {"command": command, "arguments": {"seed": 12345}, "finished": True}))
    (root / "runs" / "pretrain" / "train.txt").write_text("\n".join(paragraphs) + "\n")
    rows = [f'"{paragraphs[i][:80].replace(chr(34), "")}",{"pos" if i % 2 else "neg"}' for i in range(24)]
    (root / "train.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    (root / "tiny.csv").write_text("text,label\nhello,pos\n")
    (root / "intcsv.csv").write_text("text,label\n" + "\n".join(f"row {i},{i % 2}" for i in range(24)) + "\n")
    (root / "other.csv").write_text("a,b\n" + "\n".join(f"{i},{i * 2}" for i in range(12)) + "\n")
    ner = [{"tokens": ["the", "for", "loop"], "ner_tags": ["O", "B-KW"]} for _ in range(12)]
    (root / "ner.json").write_text("\n".join(json.dumps(row) for row in ner) + "\n")
    return {
        "model": str(model), "nest": str(root / "nest"), "clf": str(root / "clf"), "gau": str(root / "gau"),
        "noweights": str(root / "noweights"), "notmodel": str(root / "notmodel"),
        "untokenized": str(root / "untokenized"), "evil": str(evil), "corrupt": str(corrupt),
        "badtype": str(badtype),
        "sharded": str(sharded),
        "binary": str(root / "binary.txt"), "emptyjson": str(root / "empty.jsonl"),
        **{name: str(root / f"{name}.jsonl") for name in ("nulltext", "nulllabel", "nanlabel")},
        "badconfig": str(root / "badconfig"), "adapter": str(root / "adapter"), "export": str(export),
        "txt": str(root / "train.txt"), "short": str(root / "short.txt"),
        "tiny": str(root / "tiny.txt"), "tinycsv": str(root / "tiny.csv"), "tsv": str(root / "train.tsv"),
        "badjson": str(root / "bad.jsonl"), "foreignjson": str(root / "results.json"),
        "badtemplate": str(root / "bad_template.md"), "file": str(root / "plain.txt"),
        "csv": str(root / "train.csv"), "othercsv": str(root / "other.csv"), "ner": str(root / "ner.json"),
        "intcsv": str(root / "intcsv.csv"),
        "missing": str(root / "missing"), "root": str(root), "runs": str(root / "runs"),
    }


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every step after validation fail the test: training (both loops), measuring, pruning, the
    studies, uploading. Set ``HF_HUB_OFFLINE`` too, so that nothing reaches the network anyway."""
    import huggingface_hub
    import transformers

    import hf_attn_variants.bench.runner
    import hf_attn_variants.demo
    import hf_attn_variants.entropy.cli
    import hf_attn_variants.lengthgen.study
    import hf_attn_variants.pruning.cli

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command started working: validation let a bad value through")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(torch.optim, "AdamW", started)
    monkeypatch.setattr(transformers.Trainer, "__init__", started)
    monkeypatch.setattr(hf_attn_variants.bench.runner.Runner, "run_all", started)
    monkeypatch.setattr(hf_attn_variants.pruning.cli, "compute_head_importance", started)
    monkeypatch.setattr(hf_attn_variants.lengthgen.study, "run_study", started)
    monkeypatch.setattr(hf_attn_variants.demo, "demo", started)
    monkeypatch.setattr(hf_attn_variants.entropy.cli, "measure", started)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", started)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", started)


# ---------------------------------------------------------------- checks
def snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` → its content digest (``"dir"`` for folders)."""
    return {
        str(path.relative_to(folder)): "dir" if path.is_dir()
        else hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
    }


RENDER_DOCS = "tools.render_docs"
"""The maintainer command ``render-docs`` (the repository's ``tools/render_docs.py``; not part of the
installed package)."""


def run_cli(argv: list[str]) -> int:
    """``main(argv)``'s exit status, also when argparse exits (``SystemExit``); ``render-docs`` runs through
    its repository script's module, with the same flags and error lines."""
    try:
        if argv[0] == "render-docs":
            module = importlib.import_module(RENDER_DOCS)
            parser = argparse.ArgumentParser(prog="hf-attn-variants render-docs")
            module.add_arguments(parser)
            return module.run(parser.parse_args(argv[1:]))
        return main(argv)
    except SystemExit as exit_info:
        return exit_info.code if isinstance(exit_info.code, int) else 1


def the_error_line(stderr: str, command: str) -> str:
    """The single ``hf-attn-variants <command>: error: …`` line of ``stderr``; fails unless stderr is that
    line alone (argparse's own errors too: no usage block before them, ``OneLineParser``)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"hf-attn-variants {command}: error: "), stderr
    return lines[0]


def fill(argv: tuple[str, ...], paths: Mapping[str, str]) -> list[str]:
    """``argv`` with ``{placeholder}``s replaced (``{{`` stands for a literal ``{``)."""
    return [item.format(**paths) for item in argv]


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_value_gives_one_error_line_naming_the_flag(
    bad: Case, inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], no_work: None,
) -> None:
    monkeypatch.chdir(tmp_path)  # default output paths (runs/…, docs/…) are relative: they land here
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("the user's data\n")
    paths = {**inputs, "out": str(out), "new": str(tmp_path / "new" / "run")}
    before = snapshot(tmp_path), snapshot(Path(inputs["root"]))

    code = run_cli([bad.command, *fill(bad.argv, paths)])

    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    line = the_error_line(captured.err, bad.command)
    assert re.search(rf"{re.escape(bad.flag)}(?![\w-])", line), f"{bad.flag} not named in: {line}"
    assert code == 2, (code, line)
    assert (snapshot(tmp_path), snapshot(Path(inputs["root"]))) == before, "something was written"


def test_a_folder_without_a_tokenizer_gets_the_whole_reason(
    inputs: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None,
) -> None:
    """Transformers' reason spans several lines ("… from one of: (1) … (2) … (3) …"): the one error line
    carries all of it, not a first line that ends in a colon."""
    from transformers import AutoTokenizer

    with pytest.raises(ValueError) as upstream:
        AutoTokenizer.from_pretrained(inputs["untokenized"])
    reason = " ".join(line.strip() for line in str(upstream.value).splitlines() if line.strip())

    code = run_cli(["export", "--model_name_or_path", inputs["untokenized"], "--output_dir",
                    str(tmp_path / "new")])

    line = the_error_line(capsys.readouterr().err, "export")
    assert code == 2 and line.endswith(f"(pass --tokenizer_name with a tokenizer folder): {reason}"), line
    assert not (tmp_path / "new").exists()


def test_a_pretrained_configs_own_token_id_sentinel_is_kept(tmp_path: Path) -> None:
    """Only new or overridden pad/BOS/EOS ids must lie in the vocabulary: a saved config's own sentinel (-1)
    loads as before, and the same id as an override is refused."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, pad_token_id=-1).save_pretrained(tmp_path)
    assert build_config(config_name=str(tmp_path)).pad_token_id == -1
    with pytest.raises(ValueError, match="^config_overrides: pad_token_id=-1 is not a token id"):
        build_config(config_name=str(tmp_path), config_overrides="pad_token_id=-1")


EMPTY_OUTPUT_DIR = [c for c in CASES if c.flag == "--output_dir" and c.why == "empty"]


@pytest.mark.parametrize("bad", EMPTY_OUTPUT_DIR, ids=[c.id for c in EMPTY_OUTPUT_DIR])
def test_an_empty_output_dir_is_refused_in_an_empty_working_directory(
    bad: Case, inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], no_work: None,
) -> None:
    """``Path("")`` is ``"."``: in an empty working directory (where no "not empty" rule can catch it) an
    empty --output_dir must still be refused, not mean the working directory."""
    monkeypatch.chdir(tmp_path)
    code = run_cli([bad.command, *fill(bad.argv, {**inputs, "out": str(tmp_path), "new": str(tmp_path)})])
    line = the_error_line(capsys.readouterr().err, bad.command)
    assert code == 2 and line.endswith("--output_dir must be a folder path, got ''."), line
    assert not any(tmp_path.iterdir())


VALID: dict[str, tuple[str, ...]] = {
    "pretrain": PRETRAIN,
    "finetune": FINETUNE,
    "demo": DEMO,
    "prune": PRUNE,
    "bench": BENCH,
    "lengthgen": LENGTHGEN,
    "entropy": ENTROPY,
}
"""The base argv of the sweep, which is valid: the commands whose work ``no_work`` blocks reach it."""


@pytest.mark.parametrize("command", list(VALID))
def test_no_work_guard_stops_a_valid_run(
    command: str, inputs: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_work: None,
) -> None:
    """The guard has teeth: with every value valid, the command gets past its checks and the guard stops it
    (so a bad value the checks missed would fail its case instead of training)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    paths = {**inputs, "out": str(tmp_path / "out"), "new": str(tmp_path / "new" / "run")}
    with pytest.raises(AssertionError, match="started working"):
        run_cli([command, *fill(VALID[command], paths)])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["pretrain", "--model_type", "gau", "--config_overrides", "hidden_size=abc", "--output_dir", "out"],
         "hf-attn-variants pretrain: error: --config_overrides: hidden_size must be an int, got 'abc'."),
        (["finetune", "--model_name_or_path", "/nonexistent", "--train_file", "train.csv", "--output_dir",
          "out"],
         "hf-attn-variants finetune: error: --model_name_or_path: no such model folder '/nonexistent'."),
    ],
    ids=["pretrain-config_overrides", "finetune-model_name_or_path"],
)
def test_reported_failures_print_one_line_in_a_fresh_process(argv: list[str], expected: str,
                                                             tmp_path: Path) -> None:
    """The two failures the issue reported, through ``python -m`` (stderr as a user sees it, import-time
    warnings included): exactly the one line, exit status 2, nothing written."""
    (tmp_path / "train.csv").write_text("text,label\nhello,pos\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "hf_attn_variants", *argv], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert (result.returncode, result.stderr.splitlines(), result.stdout) == (2, [expected], "")
    assert [p.name for p in tmp_path.iterdir()] == ["train.csv"]


# ---------------------------------------------------------------- every flag has a case
def parser_flags(command: str) -> set[str]:
    """The flags (first option string of each) that the parser of ``command`` defines.

    argparse has no public accessor for a parser's actions; its usage text lists every option by its
    first option string, exactly as a user sees them.
    """
    module = importlib.import_module(SUBCOMMANDS[command][0] if command in SUBCOMMANDS else RENDER_DOCS)
    parser = argparse.ArgumentParser(prog=f"hf-attn-variants {command}")
    module.add_arguments(parser)
    return set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", parser.format_usage()))


def flag_kind(field: dataclasses.Field, hint: object) -> str:
    """The kind of value a dataclass field's flag takes: list, dict, choice, bool, int, float, str or
    object."""
    members = typing.get_args(hint) or (hint,)
    if any(typing.get_origin(m) is list or m is list for m in members):
        return "list"
    if any(typing.get_origin(m) is dict or m is dict for m in members):
        return "dict"
    if field.metadata.get("choices") or any(isinstance(m, type) and issubclass(m, enum.Enum)
                                            for m in members):
        return "choice"
    for kind in (bool, int, float, str):
        if kind in members:
            return kind.__name__
    return "object"


def training_argument_kinds() -> dict[str, str]:
    """``--flag`` → kind for every flag finetune takes from ``TrainingArguments``; ``--no_x`` (switches
    that turn a default-True boolean off, no value) are ``"switch"``."""
    hints = typing.get_type_hints(TrainingArguments)
    kinds = {}
    for field in dataclasses.fields(TrainingArguments):
        if field.init:
            kinds[f"--{field.name}"] = flag_kind(field, hints[field.name])
            kinds[f"--no_{field.name}"] = "switch"
    return kinds


def test_every_flag_has_a_bad_value_case() -> None:
    commands = [*SUBCOMMANDS, "render-docs"]
    tested = {command: {c.flag for c in CASES if c.command == command} for command in commands}
    training_kinds = training_argument_kinds()
    for command in commands:
        flags = parser_flags(command)
        unknown = tested[command] - flags
        assert not unknown, f"{command}: cases for flags it does not have: {unknown}"
        assert not set(ANY_VALUE[command]) - flags, f"{command}: ANY_VALUE lists unknown flags"
        own = flags - set(training_kinds) if command == "finetune" else flags
        untested = own - tested[command] - set(ANY_VALUE[command])
        assert not untested, (f"{command}: flags without a bad-value case (add one, or to ANY_VALUE): "
                              f"{untested}")
    kinds_defined = {training_kinds[f] for f in parser_flags("finetune") if f in training_kinds} - {"switch"}
    kinds_tested = {training_kinds[f] for f in tested["finetune"] if f in training_kinds}
    assert kinds_defined <= kinds_tested, ("TrainingArguments kinds without a case: "
                                           f"{kinds_defined - kinds_tested}")


def test_code_in_a_model_or_tokenizer_folder_never_runs(inputs: dict[str, str], tmp_path: Path) -> None:
    """A folder whose config (or tokenizer config) maps to code of its own: no command asks on stdin whether
    to run it (Transformers' prompt, answered "y" here) or runs it. A model of an unknown type is refused in
    one line; a tokenizer folder loads without its code (``trust_remote_code=False``)."""
    marker = Path(inputs["root"]) / "ran.txt"
    tokenizer = tmp_path / "tokenizer"
    embedded_tokenizer().save_pretrained(tokenizer)
    settings = json.loads((tokenizer / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(settings))
    (tokenizer / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                                    "from transformers import PreTrainedTokenizerFast as "
                                                    "EvilTokenizer\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hf_attn_variants", "export", *argv], cwd=tmp_path,
                              env=env, input="y\n", capture_output=True, text=True, timeout=300, check=False)

    refused = run("--model_name_or_path", inputs["evil"], "--output_dir", "refused")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "--model_name_or_path" in refused.stderr
    assert "runs no code from a model folder" in refused.stderr
    exported = run("--model_name_or_path", inputs["model"], "--tokenizer_name", str(tokenizer),
                   "--output_dir", "exported")
    assert exported.returncode == 0, exported.stderr
    assert not marker.exists() and not (tmp_path / "refused").exists()
