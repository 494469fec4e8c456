"""``pretrain --streaming`` and ``--packing``: sources (globs, several files, a dataset folder), each
data-parallel rank its own part of the stream, document packing, exact mid-stream resume (one process, and two
under torchrun: DDP and FSDP2), ``kill -9`` after a checkpoint, and the throughput columns of
``train_log.jsonl``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_attn_variants.cli_utils import FlagError
from hf_attn_variants.training import PretrainArguments, pretrain
from hf_attn_variants.training.corpus import corpus_splits
from hf_attn_variants.training.data import Packer, group_token_lists, pack_token_lists
from hf_attn_variants.training.sources import open_stream, rank_token_stream, stream_validation_texts
from hf_attn_variants.training.streaming import PackedStream, TrainStream
from tests.test_pretrain import cli_flags, read_log, tiny_args, tiny_overrides, weights
from tests.test_pretrain_sharded import LAUNCH_TIMEOUT, kill_job, launch_env
from tests.utils import needs_fsdp2_torch

STEPS, CHECKPOINT = 6, 3


# ---------------------------------------------------------------- corpora
def paragraphs(count: int, start: int = 0) -> list[str]:
    """Short, distinct paragraphs of the embedded corpus (one line each)."""
    texts = [p.replace("\n", " ") for p in corpus_splits()["train"] if 80 < len(p) < 400]
    return texts[start : start + count]


def write_shards(folder: Path, shards: int, per_shard: int, suffix: str = "jsonl") -> Path:
    """``folder/part-<i>.<suffix>``: ``shards`` files of ``per_shard`` paragraphs (``{"text", "id"}``
    rows)."""
    from datasets import Dataset

    folder.mkdir(parents=True, exist_ok=True)
    texts = paragraphs(shards * per_shard)
    for shard in range(shards):
        rows = [{"text": texts[shard * per_shard + i], "id": shard * per_shard + i} for i in range(per_shard)]
        if suffix == "parquet":
            Dataset.from_list(rows).to_parquet(str(folder / f"train-{shard:05d}-of-{shards:05d}.parquet"))
        else:
            (folder / f"part-{shard}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """4 jsonl shards of 3 paragraphs: one pass is ~10 steps of 4 × 16 tokens, so 6 steps stay within it and a
    checkpoint at step 3 falls mid-stream."""
    return write_shards(tmp_path_factory.mktemp("corpus"), 4, 3)


@pytest.fixture(scope="module")
def dataset_folder(tmp_path_factory) -> Path:
    """A local dataset folder (``load_dataset(folder)``): ``data/train-*.parquet``, 2 shards of 2 paragraphs
    (a pass is shorter than the run: the stream starts its second pass)."""
    root = tmp_path_factory.mktemp("dataset")
    write_shards(root / "data", 2, 2, suffix="parquet")
    return root


def stream_args(folder: Path, source: dict, **kwargs: object) -> PretrainArguments:
    family = kwargs.pop("family", "entropy_invariant")
    defaults = {"streaming": True, "max_train_steps": STEPS, "checkpointing_steps": str(CHECKPOINT),
                "max_eval_samples": 2, "objective": "clm",
                "config_overrides": tiny_overrides(family, hidden_dropout_prob=0.1)}
    return tiny_args(folder, family, **{**defaults, **source, **kwargs})


# ---------------------------------------------------------------- packing
def test_concat_packing_is_group_texts_and_carries_the_remainder() -> None:
    lists = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]
    assert pack_token_lists(lists, 4, documents=False)["input_ids"] == group_token_lists(lists, 4)
    packer = Packer(4)
    packer.add([1, 2, 3])
    assert list(packer.blocks()) == [] and packer.tokens == [1, 2, 3]
    packer.add([4, 5, 6, 7, 8, 9])
    assert [b["input_ids"] for b in packer.blocks()] == [[1, 2, 3, 4], [5, 6, 7, 8]] and packer.tokens == [9]


def test_document_packing_restarts_positions_at_every_document_and_after_a_cut() -> None:
    columns = pack_token_lists([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]], 4, documents=True)
    assert columns["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # the second document is cut by the block end: its rest is a document of its own in the next block
    assert columns["position_ids"] == [[0, 1, 2, 0], [0, 1, 2, 3]]
    long = pack_token_lists([list(range(10))], 4, documents=True)
    assert long["position_ids"] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_packer_state_round_trip_continues_exactly() -> None:
    lists = [[i] * (i % 5 + 1) for i in range(1, 30)]
    whole = pack_token_lists(lists, 6, documents=True)
    first, second = Packer(6, documents=True), Packer(6, documents=True)
    blocks = []
    for ids in lists[:11]:
        first.add(ids)
        blocks += list(first.blocks())
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for ids in lists[11:]:
        second.add(ids)
        blocks += list(second.blocks())
    assert [b["input_ids"] for b in blocks] == whole["input_ids"]
    assert [b["position_ids"] for b in blocks] == whole["position_ids"]


# ---------------------------------------------------------------- each rank its own part
class IdTokenizer:
    """Tokenizes a ``"<id>"`` text to ``[id]``: token counts are example counts."""

    def __call__(self, texts: list[str], return_attention_mask: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": [[int(text)] for text in texts]}


def id_shards(folder: Path, shards: int, per_shard: int) -> Path:
    folder.mkdir()
    for shard in range(shards):
        ids = range(shard * per_shard, (shard + 1) * per_shard)
        (folder / f"part-{shard}.jsonl").write_text("".join(json.dumps({"text": str(i)}) + "\n" for i in ids))
    return folder


@pytest.mark.parametrize(("shards", "world", "held"), [(4, 2, 0), (3, 2, 0), (4, 3, 5), (6, 2, 3)])
def test_each_rank_reads_its_own_part_and_together_they_read_everything_once(tmp_path, shards, world,
                                                                             held) -> None:
    """Whole shards per rank when the shard count divides by the world size, every world-th example otherwise;
    either way no example of a pass is read twice, none is skipped, and the held-out ones never come."""
    folder = id_shards(tmp_path / "ids", shards, 7)
    args = PretrainArguments(output_dir=str(tmp_path / "out"), model_type="gau",
                             train_file=str(folder / "part-*.jsonl"), streaming=True, max_train_steps=1,
                             max_eval_samples=held or None)
    train = open_stream(args)
    texts, held_out = stream_validation_texts(args, train)
    assert texts == [str(i) for i in range(held)]
    seen = []
    for rank in range(world):
        ids = [row["input_ids"][0]
               for row in rank_token_stream(train, held_out, IdTokenizer(), None, rank, world)()]
        assert ids, rank
        seen.append(ids)
    flat = [i for ids in seen for i in ids]
    assert len(flat) == len(set(flat)) and sorted(flat) == list(range(held, shards * 7))


def test_packed_stream_resumes_mid_pass_and_across_passes(tmp_path) -> None:
    folder = id_shards(tmp_path / "ids", 2, 5)
    args = PretrainArguments(output_dir=str(tmp_path / "out"), model_type="gau",
                             train_file=str(folder / "*.jsonl"), streaming=True, max_train_steps=1)
    source = rank_token_stream(open_stream(args), frozenset(), IdTokenizer(), None, 0, 1)

    def stream() -> TrainStream:
        return TrainStream(PackedStream(source, 3, documents=False, rank=0, world=1), 2, 0)

    reference = stream().batches(torch.device("cpu"))
    # 10 ids a pass: 36 ids span 4 passes
    expected = [next(reference)["input_ids"].tolist() for _ in range(6)]
    for cut in (1, 2, 4):
        first = stream()
        got = [next(first.batches(torch.device("cpu")))["input_ids"].tolist() for _ in range(cut)]
        first.save(tmp_path / f"cut{cut}")
        second = stream()
        second.load(tmp_path / f"cut{cut}")
        batches = second.batches(torch.device("cpu"))
        got += [next(batches)["input_ids"].tolist() for _ in range(6 - cut)]
        assert got == expected, cut


# ---------------------------------------------------------------- pretrain --streaming
def test_streaming_needs_max_train_steps_and_names_the_flags(tmp_path) -> None:
    with pytest.raises(FlagError, match="max_train_steps is required with --streaming") as error:
        PretrainArguments(output_dir=str(tmp_path), model_type="gau", train_file="x.jsonl", streaming=True)
    assert error.value.flag == "max_train_steps"
    with pytest.raises(FlagError, match="dataset_name are two sources"):
        PretrainArguments(output_dir=str(tmp_path), model_type="gau", train_file="x.jsonl", dataset_name="d")
    with pytest.raises(FlagError, match="matches no file") as error:
        pretrain(tiny_args(tmp_path / "out", train_file=str(tmp_path / "none-*.jsonl"), streaming=True))
    assert error.value.flag == "train_file" and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("source", "objective", "packing", "family"),
    [("files", "clm", "documents", "entropy_invariant"), ("dataset", "mlm", "concat", "gau"),
     ("several", "clm", "concat", "synthesizer")],
)
def test_streaming_resume_mid_stream_equals_the_uninterrupted_run(tmp_path, shards, dataset_folder, source,
                                                                  objective, packing, family) -> None:
    """The uninterrupted run checkpoints at step 3 (mid-pass, the packer's buffer non-empty); a run resumed
    from that checkpoint into another folder reaches the same weights (≤ 1e-6) and losses."""
    sources = {"files": {"train_file": str(shards / "part-*.jsonl")},
               "several": {"train_file": [str(shards / "part-0.jsonl"), str(shards / "part-[123].jsonl")]},
               "dataset": {"dataset_name": str(dataset_folder)}}[source]  # several: a file and a glob
    common = {"objective": objective, "packing": packing, "family": family}
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    pretrain(stream_args(reference, sources, **common))
    state = json.loads((reference / "checkpoints" / f"step_{CHECKPOINT}" / "data_state"
                        / "rank_0.json").read_text())
    assert state["dataset_state"]["packer"]["tokens"], "the checkpoint should hold a non-empty packer buffer"
    checkpoint = reference / "checkpoints" / f"step_{CHECKPOINT}"
    pretrain(stream_args(resumed, sources, resume_from_checkpoint=str(checkpoint), **common))
    # another folder: its log starts after the checkpoint
    expected, got = read_log(reference), read_log(resumed)
    assert [r["step"] for r in got] == list(range(CHECKPOINT + 1, STEPS + 1))
    for want, have in zip(expected[CHECKPOINT:], got):
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-6) and have["tokens"] == want["tokens"]
    assert got[-1]["eval_loss"] == pytest.approx(expected[-1]["eval_loss"], abs=1e-6)
    a, b = weights(reference), weights(resumed)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    if source == "dataset":  # 2 × 2 short paragraphs: the run read the stream more than once
        final = json.loads((reference / "checkpoints" / f"step_{STEPS}" / "data_state"
                            / "rank_0.json").read_text())
        assert final["dataset_state"]["passes"] >= 1


def test_log_rows_show_tokens_and_tokens_per_second_and_no_mfu_on_cpu(tmp_path, shards) -> None:
    pretrain(stream_args(tmp_path, {"train_file": str(shards / "part-*.jsonl")}, checkpointing_steps=None))
    rows = read_log(tmp_path)
    assert [r["tokens"] for r in rows] == [4 * 16 * r["step"] for r in rows]
    assert all(r["tokens_per_second"] > 0 for r in rows) and not any("mfu" in r for r in rows)
    info = json.loads((tmp_path / "pretrain_args.json").read_text())
    assert info["tokens"] == 4 * 16 * STEPS and info["train_blocks"] is None


def test_a_checkpoint_of_the_other_way_of_reading_is_refused_before_writing(tmp_path, shards) -> None:
    """A streamed run cannot resume a checkpoint without a stream position, nor a whole-file run one with
    it."""
    source = {"train_file": str(shards / "part-*.jsonl")}
    pretrain(tiny_args(tmp_path / "whole", **source, max_train_steps=3, checkpointing_steps="3",
                       validation_split_percentage=25))
    pretrain(stream_args(tmp_path / "streamed", source, max_train_steps=3))
    for reader, writer in (("streamed", "whole"), ("whole", "streamed")):
        checkpoint = tmp_path / writer / "checkpoints" / "step_3"
        args = (stream_args if reader == "streamed" else lambda f, s, **k: tiny_args(f, **s, **k))(
            tmp_path / "new", source, max_train_steps=3, resume_from_checkpoint=str(checkpoint))
        with pytest.raises(FlagError, match="stream position") as error:
            pretrain(args)
        assert error.value.flag == "resume_from_checkpoint" and not (tmp_path / "new").exists()


# ---------------------------------------------------------------- kill -9, and two processes
SLOW_STREAM = r"""
import importlib, os, pathlib, sys, time
if "PID_DIR" in os.environ:
    pathlib.Path(os.environ["PID_DIR"], os.environ.get("RANK", "0") + ".pid").write_text(str(os.getpid()))
streaming = importlib.import_module("hf_attn_variants.training.streaming")
collate = streaming.collate_blocks
def slow_collate(items):  # slow the run down so that the parent can kill it after the checkpoint
    time.sleep(0.4)
    return collate(items)
streaming.collate_blocks = slow_collate
from hf_attn_variants.cli import main
sys.exit(main(sys.argv[1:]))
"""


def kill_after_checkpoint(command: list[str], folder: Path, cwd: Path, pid_dir: Path | None = None) -> None:
    """Start ``command``; once step ``CHECKPOINT``'s checkpoint is complete and a later step has run, SIGKILL
    it (and its torchrun workers, whose pids are in ``pid_dir``)."""
    env = {**launch_env(), "ACCELERATE_USE_CPU": "1", **({"PID_DIR": str(pid_dir)} if pid_dir else {})}
    with (cwd / "killed.stderr").open("w") as stderr:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.time() + LAUNCH_TIMEOUT
        written = folder / "checkpoints" / f"step_{CHECKPOINT}" / "training_state.json"
        try:
            while time.time() < deadline and process.poll() is None:
                log = folder / "train_log.jsonl"
                if written.exists() and log.exists() and read_log(folder)[-1]["step"] > CHECKPOINT:
                    break
                time.sleep(0.02)
        finally:
            kill_job(process, pid_dir) if pid_dir else process.send_signal(signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, (cwd / "killed.stderr").read_text()[-3000:]
    assert not (folder / "model.safetensors").exists()


def pretrain_command(args: PretrainArguments, processes: int, script: Path | None = None) -> list[str]:
    """``hf-attn-variants pretrain`` with ``args`` (through ``script``, a wrapper of the CLI, if given): in
    this interpreter for one process, else under ``torchrun --standalone --nproc_per_node <processes>``."""
    target = [str(script)] if script else ["-m", "hf_attn_variants"]
    if processes == 1:
        return [sys.executable, *target, "pretrain", *cli_flags(args)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            *target, "pretrain", *cli_flags(args)]


def launch(command: list[str], cwd: Path) -> None:
    result = subprocess.run(command, env={**launch_env(), "ACCELERATE_USE_CPU": "1"}, cwd=cwd,
                            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr[-5000:]


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["one", "ddp", pytest.param("fsdp2", marks=needs_fsdp2_torch())])
def test_kill_9_after_a_checkpoint_loses_nothing(tmp_path, shards, dataset_folder, processes: str) -> None:
    """kill -9 after step 3's checkpoint (a later step already ran); the same command resumes from it
    (mid-stream: stream position and packer buffer) and ends with the uninterrupted run's weights, under one
    process and two (torchrun: DDP through accelerate, FSDP2 through ``--fsdp_size 2``); DDP reads the dataset
    folder (one parquet shard per rank), the others the glob of jsonl shards."""
    sizes = {"fsdp_size": 2} if processes == "fsdp2" else {}
    source = ({"dataset_name": str(dataset_folder), "max_eval_samples": 1} if processes == "ddp"
              else {"train_file": str(shards / "part-*.jsonl")})
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    script = tmp_path / "slow_pretrain.py"
    script.write_text(SLOW_STREAM)

    def command(folder: Path, slow: bool) -> list[str]:
        args = stream_args(folder, source, packing="documents", **sizes)
        return pretrain_command(args, 1 if processes == "one" else 2, script if slow else None)

    launch(command(reference, False), tmp_path)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    kill_after_checkpoint(command(killed, True), killed, tmp_path, None if processes == "one" else pid_dir)
    launch(command(killed, False), tmp_path)
    expected, got = read_log(reference), read_log(killed)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in expected], abs=1e-6)
    a, b = weights(reference), weights(killed)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    ranks = 1 if processes == "one" else 2
    data_state = reference / "checkpoints" / f"step_{CHECKPOINT}" / "data_state"
    assert sorted(p.name for p in data_state.iterdir()) == [f"rank_{r}.json" for r in range(ranks)]


# ---------------------------------------------------------------- read whole: a dataset folder, documents
def test_a_dataset_folder_and_document_packing_work_without_streaming(tmp_path, dataset_folder,
                                                                      shards) -> None:
    """``--dataset_name <folder>`` read whole (validation held out by percentage), and ``--packing documents``
    on a glob read whole: its blocks carry positions restarting at each document, and training sees them."""
    result = pretrain(tiny_args(tmp_path / "folder", dataset_name=str(dataset_folder), objective="clm",
                                validation_split_percentage=25, max_train_steps=2))
    assert result.completed_steps == 2 and "eval_loss" in result.metrics
    info = json.loads((tmp_path / "folder" / "pretrain_args.json").read_text())
    assert info["dataset"] == str(dataset_folder) and info["train_blocks"] > 0

    from hf_attn_variants.training.data import group_into_blocks, load_text_datasets
    from hf_attn_variants.training.modeling import load_tokenizer

    raw = load_text_datasets(str(shards / "part-*.jsonl"), validation_split_percentage=25)
    assert raw["train"].num_rows == 9 and raw["validation"].num_rows == 3
    blocks = group_into_blocks(raw["train"], load_tokenizer(None), 16, documents=True)
    starts = sum(row.count(0) for row in blocks["position_ids"])
    assert blocks.column_names == ["input_ids", "position_ids"] and starts > len(blocks)
    result = pretrain(tiny_args(tmp_path / "documents", train_file=str(shards / "part-*.jsonl"),
                                packing="documents", objective="clm", validation_split_percentage=25,
                                max_train_steps=2))
    assert result.completed_steps == 2 and result.metrics["eval_loss"] > 0


def test_mfu_is_tokens_per_second_times_flops_per_token_over_the_peak() -> None:
    from hf_attn_variants.training.modeling import build_config, build_lm_model, load_tokenizer
    from hf_attn_variants.training.throughput import device_peak_flops, mfu, model_flops_per_token

    config = build_config("entropy_invariant", config_overrides=tiny_overrides("entropy_invariant"),
                          tokenizer=load_tokenizer(None), max_seq_length=16)
    model = build_lm_model(config, "clm")
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    inside = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()  # the head's product runs, tied or not
    assert model_flops_per_token(model, config, 16) == 6 * (inside + head) + 12 * 2 * 32 * 16
    config.tie_word_embeddings = False
    untied = build_lm_model(config, "clm")
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight
    assert model_flops_per_token(untied, config, 16) == model_flops_per_token(model, config, 16)
    assert mfu(1000.0, 2e9, 1e15, 2) == pytest.approx(1000 * 2e9 / 2e15)
    assert mfu(1000.0, 2e9, None, 1) is None
    assert device_peak_flops(torch.device("cpu"), "bf16") is None


def test_streamed_validation_comes_from_the_validation_file(tmp_path, shards) -> None:
    """``--validation_file`` (a glob too) under ``--streaming``: at most ``--max_eval_samples`` of its
    examples; the training stream keeps all of its own."""
    args = stream_args(tmp_path / "out", {"train_file": str(shards / "part-[012].jsonl"),
                                          "validation_file": str(shards / "part-3*.jsonl")},
                       max_eval_samples=2)
    train = open_stream(args)
    texts, held_out = stream_validation_texts(args, train)
    expected = [json.loads(line)["text"] for line in (shards / "part-3.jsonl").read_text().splitlines()[:2]]
    assert texts == expected and held_out == frozenset()
    result = pretrain(args)
    assert result.metrics["eval_loss"] > 0


def test_a_rank_left_without_examples_is_refused_on_every_rank_before_writing(tmp_path,
                                                                              dataset_folder) -> None:
    """Two ranks over the 2-shard dataset folder, the 2 first examples held out: rank 0's whole shard is
    validation. Both processes stop with the one line naming the flag, and nothing is written."""
    args = stream_args(tmp_path / "out", {"dataset_name": str(dataset_folder)}, max_eval_samples=2)
    result = subprocess.run(pretrain_command(args, 2), env={**launch_env(), "ACCELERATE_USE_CPU": "1"},
                            cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, check=False)
    said = [line for line in result.stderr.splitlines()
            if line.startswith("hf-attn-variants pretrain: error:")]
    assert result.returncode != 0 and len(said) >= 1, result.stderr[-3000:]
    assert "1 of 2 data-parallel rank(s) get no training example" in said[0] and "--dataset_name" in said[0]
    assert "Connection closed" not in result.stderr and not (tmp_path / "out").exists()
