"""A two-node launch on one machine (issue 23): two ``torchrun`` agents on loopback equal one node.

``scripts/accelerate/launch_sharded.sh 1`` is started twice with ``NNODES=2``, ``NODE_RANK=0`` and ``1`` and
``RDZV_ENDPOINT=127.0.0.1:<free port>`` — torchrun ``--nnodes 2 --node_rank R --rdzv_backend c10d``, one gloo
process per node — and compared with the one-node launch of the same flags, ``launch_sharded.sh 2``
(``torchrun --standalone --nproc_per_node 2``): every logged loss, the final eval loss and every weight of
``model.safetensors`` within 1e-6. Both for accelerate DDP (plain ``pretrain``: accelerate reads torchrun's
environment) and for the sharded FSDP2 path (``--fsdp_size 2``), and for DDP reading the data as a stream
(``--streaming --packing documents``: each rank its own part); 4 CLM steps of a tiny model, dropout 0.

The two launches run at the same time (most of a launch is imports and waits), each with a datasets cache of
its own. Every agent runs in a session of its own under one deadline; when it is over, or as soon as one agent
fails, all agents and their workers are SIGKILLed (torchrun starts each worker in a session of its own, so
they are found as the agents' descendants in /proc): a failed rendezvous or a hung collective cannot block the
suite.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_pretrain import REPO, cli_flags, free_port, train_file
from tests.test_pretrain_sharded import LAUNCH_TIMEOUT, clm_args, launch_env, max_differences
from tests.utils import needs_fsdp2_torch

__all__ = ["train_file"]  # the module-scoped fixture of test_pretrain.py

SCRIPT = REPO / "scripts" / "accelerate" / "launch_sharded.sh"
TOLERANCE = 1e-6
LAUNCH_VARIABLES = ("NNODES", "NODE_RANK", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_CONF", "MASTER_ADDR",
                    "LOCAL_ADDR", "ACCELERATE_USE_CPU")


@dataclass
class Agent:
    """One ``launch_sharded.sh`` (which ``exec``s the torchrun agent) and the file its stderr goes to."""

    process: subprocess.Popen
    stderr: Path

    def tail(self) -> str:
        """The end of its stderr, named, with its exit status."""
        return f"--- {self.stderr.name} (exit {self.process.returncode}):\n{self.stderr.read_text()[-4000:]}"


def script_env(**variables: str) -> dict[str, str]:
    """This environment for a launch: no launcher or rendezvous variables, OMP_NUM_THREADS=1, this
    interpreter."""
    env = {k: v for k, v in launch_env().items() if k not in LAUNCH_VARIABLES}
    return {**env, "PYTHON": sys.executable, **variables}


def start(agents: list[Agent], nproc: int, flags: list[str], cwd: Path, name: str, **variables: str) -> None:
    """Start ``launch_sharded.sh <nproc> <flags>`` with ``variables`` in a session of its own; add it to
    ``agents`` (stderr in ``cwd/<name>.stderr``)."""
    stderr = cwd / f"{name}.stderr"
    with stderr.open("w") as err:
        process = subprocess.Popen(["bash", str(SCRIPT), str(nproc), *flags], env=script_env(**variables),
                                   cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    agents.append(Agent(process, stderr))


def start_two_nodes(agents: list[Agent], flags: list[str], cwd: Path) -> None:
    """The two-node launch: two agents, one process each, c10d rendezvous on 127.0.0.1 (logging at INFO)."""
    rendezvous = {"NNODES": "2", "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "RDZV_ID": "test-multinode",
                  "LOCAL_ADDR": "127.0.0.1", "LOGLEVEL": "INFO",
                  "HF_DATASETS_CACHE": str(cwd / "cache_two_nodes")}
    for rank in (0, 1):
        start(agents, 1, flags, cwd, f"node{rank}", NODE_RANK=str(rank), **rendezvous)


def start_one_node(agents: list[Agent], flags: list[str], cwd: Path) -> None:
    """The one-node launch of the same flags: ``torchrun --standalone --nproc_per_node 2``."""
    start(agents, 2, flags, cwd, "one_node", HF_DATASETS_CACHE=str(cwd / "cache_one_node"))


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc (torchrun's workers have sessions of their own, not the
    agent's)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_quietly(pid: int, *, group: bool = False) -> None:
    """SIGKILL ``pid`` (or its process group) if it is still there."""
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_all(agents: list[Agent]) -> None:
    """SIGKILL every agent that still runs, its process group and its workers; reap the agents."""
    for agent in agents:
        if agent.process.poll() is None:
            workers = descendants(agent.process.pid)  # before the agent dies and they are re-parented
            kill_quietly(agent.process.pid, group=True)
            for pid in workers:
                kill_quietly(pid)
    for agent in agents:
        agent.process.wait()


@contextmanager
def launches() -> Iterator[list[Agent]]:
    """A list to start agents into; whatever happens in the block, none of them outlives it."""
    agents: list[Agent] = []
    try:
        yield agents
    finally:
        kill_all(agents)


def wait_for(agents: list[Agent], timeout: float = LAUNCH_TIMEOUT) -> None:
    """Wait until every agent has exited 0; at the first failure or after ``timeout`` s, kill them all and
    fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [agent.process.poll() for agent in agents]
        if any(code not in (None, 0) for code in codes) or all(code == 0 for code in codes):
            break
        time.sleep(0.1)
    kill_all(agents)
    codes = [agent.process.returncode for agent in agents]
    assert codes == [0] * len(agents), "\n".join(
        [f"exit codes {codes} (-9: killed after {timeout} s or after another agent failed)",
         *(agent.tail() for agent in agents)])


def rendezvous_result(agent: Agent) -> tuple[int, int]:
    """(group_rank, group_world_size): the node rank and node count the agent's rendezvous gave it, as
    logged."""
    text = agent.stderr.read_text()
    found = [re.search(rf"\b{key}=(\d+)", text) for key in ("group_rank", "group_world_size")]
    assert all(found), agent.tail()
    return int(found[0][1]), int(found[1][1])


@pytest.mark.slow
@pytest.mark.parametrize(("sharding", "distributed_type"),
                         [({}, "DistributedType.MULTI_CPU"),
                          pytest.param({"fsdp_size": 2}, "FSDP2", marks=needs_fsdp2_torch()),
                          ({"streaming": True, "packing": "documents"}, "DistributedType.MULTI_CPU")],
                         ids=["ddp", "fsdp2", "ddp-streaming"])
def test_two_nodes_on_loopback_equal_one_node_with_two_processes(tmp_path, train_file, sharding: dict,
                                                                 distributed_type: str) -> None:
    common = {"max_train_steps": 4, "per_device_train_batch_size": 4, **sharding}
    single, multi = tmp_path / "one_node", tmp_path / "two_nodes"
    with launches() as agents:
        start_two_nodes(agents, cli_flags(clm_args(multi, "entropy_invariant", train_file, **common)),
                        tmp_path)
        start_one_node(agents, cli_flags(clm_args(single, "entropy_invariant", train_file, **common)),
                       tmp_path)
        wait_for(agents)
    assert sorted(rendezvous_result(agent) for agent in agents[:2]) == [(0, 2), (1, 2)]

    for folder in (single, multi):
        info = json.loads((folder / "pretrain_args.json").read_text())
        assert (info["num_processes"], info["distributed_type"]) == (2, distributed_type), info
    loss, weight = max_differences(single, multi)
    assert loss <= TOLERANCE and weight <= TOLERANCE, (loss, weight)
