"""Preemption: SIGTERM or SIGUSR1 → finish the optimizer step, write a checkpoint, exit with
``PREEMPTED_EXIT_CODE``; Ctrl-C (SIGINT) at the command line → the same stop, exit ``INTERRUPTED_EXIT_CODE``.

Spot instances, Kubernetes and SLURM send SIGTERM (SLURM with ``--signal=USR1@<s>``: SIGUSR1) some seconds
before they kill a job; ``torchrun`` leaves 30 s between forwarding SIGTERM to its workers and SIGKILL.
``StopSignals`` turns the first such signal into a request (``requested``) instead of an exit; the training
loops (``pretrain``'s, and ``finetune``'s ``Trainer`` through a callback) look at it between optimizer steps.

- Every rank stops at the same step: the ranks agree with one all-reduce (MAX of the signal numbers), so a
  signal that reached one rank only, or the ranks at different steps, stops all of them after the same step;
  they write that step's checkpoint together and exit with ``PREEMPTED_EXIT_CODE``. One process looks after
  every step (nothing to exchange); several agree at the steps ``Agreement`` picks, about once every
  ``AGREEMENT_SECONDS`` of training, not after every step: an all-reduce read on the host is a host
  synchronisation, which on a GPU would stall the queue of kernels once per step. A signal is acted on within
  that time and one step, well inside ``torchrun``'s 30 s.
- A second signal ends the process at once, with the signal's default action (status 128 + signal number in a
  shell), as if no handler were installed. A repeat within ``REPEAT_WINDOW_S`` of the first is taken as the
  same notice delivered twice (a scheduler signals every process of a job, and ``torchrun`` forwards its own
  copy to the workers), not as a second request.
- Ctrl-C is what a person at a terminal sends: the command lines of ``pretrain`` and ``finetune``
  (``run_training_command``) catch SIGINT too (``COMMAND_STOP_SIGNALS``), and a run stopped by it exits with
  ``INTERRUPTED_EXIT_CODE`` (130, what a shell reports for a process ended by SIGINT) after its checkpoint
  and one line. A second Ctrl-C ends the process at once (outside ``torchrun`` even within
  ``REPEAT_WINDOW_S``: only a person sends it twice). Called from Python (``pretrain(args)``, a notebook),
  SIGINT keeps its usual ``KeyboardInterrupt``.
- Under ``torchrun``, its agent forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to the workers; to have it
  forward SIGUSR1 too, set ``TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1``.

Global state: Python's signal handlers are process-wide by nature. ``StopSignals`` installs its handlers only
inside its ``with`` block, only from the main thread (the only one Python lets install them), and restores the
previous handlers when the block ends; nothing else here is global.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from hf_attn_variants_cli import INTERRUPTED_EXIT_CODE as CONSOLE_INTERRUPTED_EXIT_CODE

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75
"""Exit status of a run stopped by SIGTERM/SIGUSR1 after writing its checkpoint: ``EX_TEMPFAIL`` of sysexits.h
("temporary failure; the user is invited to retry"): run the same command again and it resumes."""
INTERRUPTED_EXIT_CODE = CONSOLE_INTERRUPTED_EXIT_CODE
"""Exit status of a command-line run stopped by Ctrl-C (SIGINT) after writing its checkpoint: 128 + 2, what a
shell reports for a process ended by SIGINT, so that scripts see an interruption; the same command resumes.
The console's own for Ctrl-C elsewhere (``hf_attn_variants_cli``), so that both say the same."""
DIVERGED_EXIT_CODE = 65
"""Exit status of a run whose training loss became NaN or infinite (``EX_DATAERR`` of sysexits.h): nothing
more was saved; rerunning the same command would diverge again."""
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
COMMAND_STOP_SIGNALS: tuple[signal.Signals, ...] = (*STOP_SIGNALS, signal.SIGINT)
"""What the command lines of ``pretrain`` and ``finetune`` catch: the preemption signals and Ctrl-C."""
REPEAT_WINDOW_S = 1.0
"""A repeat of the signal within this many seconds of the first is the same notice, not a second request."""
AGREEMENT_SECONDS = 1.0
"""With several processes, about how many seconds of training pass between two agreements of the ranks
(``Agreement``)."""


def exit_code_for(signal_name: str) -> int:
    """The exit status of a run stopped by ``signal_name``: ``INTERRUPTED_EXIT_CODE`` for SIGINT (Ctrl-C),
    ``PREEMPTED_EXIT_CODE`` for the others."""
    return INTERRUPTED_EXIT_CODE if signal_name == "SIGINT" else PREEMPTED_EXIT_CODE


def signal_label(signal_name: str) -> str:
    """How a message names the signal: ``"SIGINT (Ctrl-C)"``, ``"SIGTERM"``."""
    return "SIGINT (Ctrl-C)" if signal_name == "SIGINT" else signal_name


class TrainingPreempted(Exception):
    """A run stopped by a signal after writing the checkpoint of its last finished step; rerun to resume."""

    def __init__(self, command: str, signal_name: str, step: int, checkpoint: Path | None,
                 note: str = "") -> None:
        code = exit_code_for(signal_name)
        if checkpoint is not None:
            outcome = (f"wrote the checkpoint {str(checkpoint)!r}; run the same command again to resume "
                       f"(exit status {code})")
        else:
            outcome = f"wrote no checkpoint ({note or 'none could be written'}; exit status {code})"
        super().__init__(f"stopped by {signal_label(signal_name)} after step {step} and {outcome}.")
        self.command, self.signal_name, self.step, self.checkpoint = command, signal_name, step, checkpoint
        self.exit_code = code


class TrainingDiverged(Exception):
    """A run whose logged training loss (the mean since the last row) became NaN or infinite: it stops at the
    step that logged it, saves no model, and its ``run.json`` stays unfinished."""

    def __init__(self, command: str, step: int, loss: float, learning_rate: float) -> None:
        super().__init__(
            f"the training loss logged at step {step} is {loss}: the run diverged, so it stopped there and "
            f"saved no model. Lower --learning_rate (now {learning_rate:g}) or raise --num_warmup_steps, and "
            "start again with --overwrite_output_dir (a resumed run would take the checkpoint's learning "
            f"rate schedule, and its weights may already have diverged; exit status {DIVERGED_EXIT_CODE}).")
        self.command, self.step, self.loss = command, step, loss


class StopSignals:
    """``with StopSignals() as stop:`` — SIGTERM/SIGUSR1 set ``stop.requested`` (see the module docstring)."""

    def __init__(self, signals: Sequence[signal.Signals] = STOP_SIGNALS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.signals = tuple(signals)
        self.clock = clock
        self.received: int | None = None
        self._agreed = 0
        self._first_at = 0.0
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived in this process."""
        return self.received is not None

    @property
    def signal_name(self) -> str:
        """The name of the signal that stopped the run (``"SIGTERM"``; in this process or, after ``agreed``,
        in another rank), or ``""``."""
        number = self.received or self._agreed
        return signal.Signals(number).name if number else ""

    @property
    def number(self) -> int:
        """The number of the signal received in this process, 0 before one arrives."""
        return self.received or 0

    def agreed(self, device: object = None) -> bool:
        """Whether a stop signal arrived in any process of the launch (one all-reduce of the signal numbers
        when ``torch.distributed`` runs several; every rank must call it at the same point of the loop)."""
        return self.settle(max_over_ranks(self.number, device))

    def settle(self, agreed_number: int) -> bool:
        """Take ``agreed_number``, the largest ``number`` over the ranks (an all-reduce the caller made, e.g.
        ``Agreement.agree``), as the launch's answer; returns whether a stop signal arrived anywhere."""
        self._agreed = agreed_number
        return agreed_number > 0

    def __enter__(self) -> StopSignals:  # noqa: PYI034 - Self needs Python 3.11
        if threading.current_thread() is threading.main_thread():
            self._previous = {int(s): signal.signal(s, self._handle) for s in self.signals}
        else:
            logger.warning("not in the main thread: SIGTERM/SIGUSR1 cannot be caught; a signal ends the run")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def ignore_after_exit(self) -> None:
        """The checkpoint is written and this process only has to exit: from now on, and after the block, the
        stop signals are ignored. For a ``torchrun`` worker: its agent sends SIGTERM to the ranks still
        running once the first one has exited, which would otherwise replace their ``PREEMPTED_EXIT_CODE`` by
        a death by signal."""
        self._first_at = float("inf")  # every further signal counts as a repeat of the first
        self._previous = {number: signal.SIG_IGN for number in self._previous}

    def _repeat_window(self, number: int) -> float:
        """Seconds within which a repeat of the first signal is the same notice: ``REPEAT_WINDOW_S``, but none
        for Ctrl-C outside ``torchrun`` (only a person sends it, and a second press means "now"); always
        infinite after ``ignore_after_exit``."""
        if self._first_at == float("inf"):
            return float("inf")
        if number == signal.SIGINT and not launched_by_torchrun():
            return 0.0
        return REPEAT_WINDOW_S

    def _handle(self, number: int, frame: FrameType | None) -> None:
        now = self.clock()
        if self.received is None:
            self.received, self._first_at = number, now
            again = "Ctrl-C again" if number == signal.SIGINT else "a second signal"
            logger.warning("%s received: finishing this optimizer step, then writing a checkpoint (%s ends "
                           "the process at once)", signal_label(signal.Signals(number).name), again)
            return
        if now - self._first_at < self._repeat_window(number):  # (always after ignore_after_exit)
            return
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)


def launched_by_torchrun() -> bool:
    """Whether this process is a worker of ``torchrun`` / ``accelerate launch`` (torch elastic's agent)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


@contextlib.contextmanager
def stop_signals(stop: StopSignals | None) -> Iterator[StopSignals]:
    """``stop`` itself when the caller already handles the stop signals, else a ``StopSignals`` block."""
    if stop is not None:
        yield stop
        return
    with StopSignals() as own:
        yield own


def preempted_exit(command: str, stopped: TrainingPreempted, stop: StopSignals) -> int:
    """The CLI's end of a stopped run: its one line (from the main process; ``interrupted:`` after Ctrl-C,
    ``preempted:`` after SIGTERM/SIGUSR1), the stop signals ignored from now on in a ``torchrun`` worker
    (``StopSignals.ignore_after_exit``), and ``stopped.exit_code`` (``INTERRUPTED_EXIT_CODE`` or
    ``PREEMPTED_EXIT_CODE``)."""
    from ..cli_utils import fail

    if launched_by_torchrun():
        stop.ignore_after_exit()
    if int(os.environ.get("RANK", "0")) == 0:
        fail(command, str(stopped), label="interrupted" if stopped.signal_name == "SIGINT" else "preempted")
    return stopped.exit_code


def run_training_command(command: str, train: Callable[..., Any], namespace: argparse.Namespace,
                         *dataclass_types: type) -> int:
    """The CLI entry of ``pretrain`` and ``finetune``: the stop signals and Ctrl-C (``COMMAND_STOP_SIGNALS``)
    are caught from the start (a signal during setup stops the run after its first step);
    ``train(*arguments, stop)`` runs with the flags parsed into ``dataclass_types``. Returns 0; 2 after one
    error line for a bad flag value, output folder or checkpoint file (``FlagError``);
    ``PREEMPTED_EXIT_CODE`` after a stop signal, ``INTERRUPTED_EXIT_CODE`` after Ctrl-C
    (``preempted_exit``); ``SAVE_FAILED_EXIT_CODE`` after one line for a save that failed
    (``safe_state.SaveFailed``: a full disk); ``DIVERGED_EXIT_CODE`` after one line for a training loss that
    became NaN or infinite (``TrainingDiverged``)."""
    from ..cli_utils import FlagError, dataclasses_from_namespace, fail, fail_flag
    from .safe_state import SAVE_FAILED_EXIT_CODE, SaveFailed

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_attn_variants").setLevel(logging.INFO)
    with StopSignals(COMMAND_STOP_SIGNALS) as stop:
        try:
            train(*dataclasses_from_namespace(namespace, *dataclass_types), stop)
        except FlagError as error:
            return fail_flag(command, error)
        except TrainingPreempted as stopped:
            return preempted_exit(command, stopped, stop)
        except SaveFailed as failed:
            fail(command, str(failed))
            return SAVE_FAILED_EXIT_CODE
        except TrainingDiverged as diverged:  # every rank raises it (the loss is reduced over ranks)
            if int(os.environ.get("RANK", "0")) == 0:
                fail(command, str(diverged))
            return DIVERGED_EXIT_CODE
    end_of_launch()
    return 0


def end_of_launch() -> None:
    """A ``torchrun`` worker's orderly end after a finished run: every rank meets at a barrier, then the
    process group is destroyed, so that no rank's communication threads outlive the peers' sockets (left to
    interpreter exit, a rank can abort with "terminate called without an active exception" when its peer exits
    first). Nothing outside a torchrun worker, or when the run already closed its group
    (``ShardedRuntime.close``)."""
    import torch.distributed as dist

    if launched_by_torchrun() and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def several_processes() -> bool:
    """Whether ``torch.distributed`` runs more than one process in this launch."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def max_over_ranks(value: int, device: object = None) -> int:
    """The largest ``value`` over every process of the launch (one all-reduce when ``torch.distributed`` runs
    several, ``value`` itself otherwise); all ranks must call it at the same point."""
    return max_each_over_ranks([value], device)[0]


def max_each_over_ranks(values: Sequence[int], device: object = None) -> list[int]:
    """The largest of each of ``values`` over every process of the launch: one all-reduce (and one read on
    the host) when ``torch.distributed`` runs several, ``values`` themselves otherwise; all ranks must call it
    at the same point with as many values."""
    import torch
    import torch.distributed as dist

    if not several_processes():
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(value) for value in tensor.tolist()]


class Agreement:
    """The steps after which the ranks of a launch agree on what each of them saw (a stop signal, a clock).

    One process agrees after every step, for free. Several agree after their first step, then about once
    every ``seconds`` of training: each agreement is one all-reduce (``max_each_over_ranks``) that also
    carries every rank's seconds per step since the previous one, and the slowest rank's figure sets how many
    steps go by until the next: every rank reads the same numbers, so every rank agrees after the same steps.
    Between agreements nothing is exchanged and nothing waits for the device.
    """

    def __init__(self, device: object = None, *, seconds: float = AGREEMENT_SECONDS,
                 several: bool | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}.")
        self.device = device
        self.seconds = seconds
        self.several = several_processes() if several is None else several
        self.clock = clock
        self.next_step: int | None = None
        """The step after which the ranks agree next; ``None``: after the first step this process trains."""
        self._last: tuple[int, float] | None = None

    def due(self, step: int) -> bool:
        """Whether the ranks agree after ``step`` (every step in one process)."""
        return not self.several or self.next_step is None or step >= self.next_step

    def agree(self, step: int, values: Sequence[int]) -> list[int]:
        """After ``step`` (a step ``due`` answers yes to, on every rank): the largest of each of ``values``
        over the ranks, and the next step to agree after."""
        now = self.clock()
        micros = 0
        if self._last is not None and step > self._last[0]:
            micros = round((now - self._last[1]) / (step - self._last[0]) * 1e6)
        *agreed, slowest = max_each_over_ranks([*values, micros], self.device)
        self.next_step = step + (max(1, int(self.seconds * 1e6 / slowest)) if slowest > 0 else 1)
        self._last = (step, now)
        return agreed


__all__ = [
    "AGREEMENT_SECONDS",
    "COMMAND_STOP_SIGNALS",
    "DIVERGED_EXIT_CODE",
    "INTERRUPTED_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "REPEAT_WINDOW_S",
    "STOP_SIGNALS",
    "Agreement",
    "StopSignals",
    "TrainingDiverged",
    "TrainingPreempted",
    "end_of_launch",
    "exit_code_for",
    "launched_by_torchrun",
    "max_each_over_ranks",
    "max_over_ranks",
    "preempted_exit",
    "run_training_command",
    "several_processes",
    "signal_label",
    "stop_signals",
]
