"""Run the benchmark: every variant at every length, interleaved, with warm-up and repeats.

At each sequence length n, all variants (and their ``torch.compile``d copies) are built, warmed up, and
then timed in ``repeats`` rounds; each round runs every entry once, in an order rotated by one each round,
so slow drifts of a shared machine hit all entries alike. A ratio to the baseline is the median of the
per-round ratios (paired), which is far more stable than a ratio of two medians on a noisy machine.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..records import cpu_model, numerics_environment
from .measure import graph_breaks, make_step, peak_step_memory, time_step, warmup_with_memory_and_flops
from .specs import (
    LOOP_FAMILY,
    LOOP_MODEL_TYPE,
    Comparison,
    Preset,
    Variant,
    loop_model,
    loop_size,
    random_input_ids,
)

PHASES = ("train", "infer")
"""``train`` = forward + backward; ``infer`` = forward under ``torch.no_grad``."""


@dataclass
class Result:
    """One (variant, mode, phase, length) measurement; times in seconds, memory in bytes."""

    variant: str
    family: str
    mode: str  # "eager" | "compiled"
    phase: str  # "train" | "infer"
    length: int
    batch_size: int
    status: str = "ok"  # "ok" | "skipped" | "failed"
    reason: str = ""
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    flops: int | None = None
    compile_s: float | None = None
    merge: int = 0
    """0: measured by the run that wrote the results file; k > 0: by the k-th partial run merged into it
    (``--merge``, described in ``BenchRun.replaced[k - 1]``). Ratios pair only rows of the same run."""
    loop: dict[str, Any] | None = None
    """A training loop's row (``bench/loops.py``): loop, objective, sizes and each round's mean training loss;
    its times are each round's mean time per optimizer step."""

    def times(self, timer: str) -> list[float]:
        return self.cpu if timer == "cpu" else self.wall

    def median(self, timer: str) -> float | None:
        values = self.times(timer)
        return statistics.median(values) if values else None

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.variant, self.mode, self.phase, self.length


@dataclass
class BenchRun:
    """Everything a report needs: settings, environment, results, graph-break checks."""

    preset: Preset
    device: str
    dtype: str
    timer: str
    threads: int
    environment: dict[str, Any]
    comparisons: tuple[Comparison, ...]
    variants: dict[str, dict[str, Any]]
    results: list[Result] = field(default_factory=list)
    graph_checks: list[dict[str, Any]] = field(default_factory=list)
    peak_tflops: float | None = None
    elapsed_s: float = 0.0
    replaced: list[dict[str, Any]] = field(default_factory=list)
    """One entry per partial run merged in later (``--merge``): its command, date, load and the rows it
    replaced."""
    interrupted: str | None = None
    """Where Ctrl-C stopped the run and what it kept (``Runner.run_all``); ``None`` for a whole run."""

    def find(self, variant: str, mode: str, phase: str, length: int) -> Result | None:
        for result in self.results:
            if result.key == (variant, mode, phase, length):
                return result
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """Machine and library versions for the report, and the environment variables that change numerics."""
    import transformers

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_attn_variants": _package_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "environment": numerics_environment(),
        "cpu_count": os.cpu_count(),
        "load_average_start": _load_average(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
    }
    return env


def _package_version() -> str:
    from ..models import __version__

    return __version__


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@dataclass
class _Entry:
    variant: Variant
    mode: str
    model: nn.Module
    result: Result | None = None
    step: Callable[[], None] | None = None


def strict_recompiles() -> contextlib.AbstractContextManager[Any]:
    """A compiled model that reaches dynamo's recompile limit raises instead of running eagerly (its row then
    fails rather than reporting eager times as compiled): ``torch.compiler.config``'s
    ``fail_on_recompile_limit_hit`` where torch has it (2.11 and 2.13 do, 2.7 does not). Elsewhere nothing
    (the reset per phase keeps the recompiles of a phase below the limit)."""
    config = torch.compiler.config
    if hasattr(config, "fail_on_recompile_limit_hit"):
        return config.patch(fail_on_recompile_limit_hit=True)
    return contextlib.nullcontext()


class Runner:
    """Builds the models and fills a ``BenchRun``. ``log`` receives one progress line at a time."""

    def __init__(
        self,
        preset: Preset,
        variants: dict[str, Variant],
        comparisons: tuple[Comparison, ...],
        *,
        device: str = "cpu",
        dtype: str = "float32",
        timer: str = "cpu",
        threads: int | None = None,
        compile: bool = True,
        count_flops: bool = True,
        check_graph_breaks: bool = True,
        peak_tflops: float | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.preset = preset
        self.variants = variants
        self.comparisons = comparisons
        self.device = torch.device(device)
        self.autocast_dtype = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.compile = compile
        self.count_flops = count_flops
        self.check_graph_breaks = check_graph_breaks
        self.log = log
        if threads:
            torch.set_num_threads(threads)
        self.run = BenchRun(
            preset=preset,
            device=str(self.device),
            dtype=dtype,
            timer=timer,
            threads=torch.get_num_threads(),
            environment=environment(self.device),
            comparisons=comparisons,
            variants={n: {"family": v.family, "description": v.description, "causal": v.causal}
                      for n, v in variants.items()},
            peak_tflops=peak_tflops,
        )
        self._models: dict[str, nn.Module] = {}
        self._flops: dict[tuple[str, str, int], int] = {}

    # ------------------------------------------------------------------------------------------ models
    def _model(self, variant: Variant, length: int) -> nn.Module:
        """``variant``'s model for inputs of ``length`` tokens (one for all lengths where it is shared). Its
        parameter count goes to ``BenchRun.variants``: ``parameters``, and for a model built per length
        (Synthesizer: l = n) ``parameters_by_length`` too, with ``parameters`` the count at the shortest
        length (the one the report's description names), not at whichever length was built last."""
        if variant.shared_across_lengths and variant.name in self._models:
            return self._models[variant.name]
        torch.manual_seed(0)
        model = variant.build(length).to(self.device).train()
        info = self.run.variants.setdefault(variant.name, {})
        count = sum(p.numel() for p in model.parameters())
        if variant.shared_across_lengths:
            info["parameters"] = count
            self._models[variant.name] = model
        else:
            by_length = info.setdefault("parameters_by_length", {})
            by_length[str(length)] = count
            info["parameters"] = by_length[min(by_length, key=int)]
        return model

    def _entries(self, length: int) -> list[_Entry]:
        entries = []
        batch = self.preset.batch_size
        extra = length not in self.preset.lengths
        for variant in self.variants.values():
            if extra and length not in variant.extra_lengths:
                continue
            modes = ["eager"]
            compiled_here = variant.compile and length in self.preset.compile_lengths
            if self.compile and (compiled_here or length in variant.compile_lengths):
                modes.append("compiled")
            if not variant.runs_at(length):
                if variant.lengths is None or length in variant.lengths:
                    for mode in modes:
                        for phase in PHASES:
                            self.run.results.append(
                                Result(variant.name, variant.family, mode, phase, length, batch, "skipped",
                                       variant.skip_reason)
                            )
                continue
            try:
                model = self._model(variant, length)
            except Exception as error:  # noqa: BLE001 - a variant that cannot be built is reported, not fatal
                for mode in modes:
                    for phase in PHASES:
                        self.run.results.append(
                            Result(variant.name, variant.family, mode, phase, length, batch, "failed",
                                   f"build: {type(error).__name__}: {error}")
                        )
                continue
            for mode in modes:
                compiled = torch.compile(model) if mode == "compiled" else model
                entries.append(_Entry(variant, mode, compiled))
        return entries

    # ------------------------------------------------------------------------------------------ running
    def _fail(self, entry: _Entry, stage: str, error: BaseException) -> None:
        entry.result.status = "failed"
        entry.result.reason = f"{stage}: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
        entry.step = None
        self.log(f"    {entry.variant.name} [{entry.mode}] {entry.result.phase} FAILED at {stage}: {error}")

    def _warm_up(self, entry: _Entry, input_ids: torch.Tensor) -> None:
        result = entry.result
        flop_key = (entry.variant.name, result.phase, result.length)
        try:
            entry.model.zero_grad(set_to_none=True)  # free old gradients outside the profiled step
            if entry.mode == "compiled":
                start = time.perf_counter()
                entry.step()
                result.compile_s = time.perf_counter() - start
                entry.model.zero_grad(set_to_none=True)
                result.peak_bytes = peak_step_memory(entry.step, self.device)
                result.flops = self._flops.get(flop_key)
            else:
                count = self.count_flops and flop_key not in self._flops
                result.peak_bytes, flops = warmup_with_memory_and_flops(entry.step, self.device, count)
                if flops is not None:
                    self._flops[flop_key] = flops
                result.flops = self._flops.get(flop_key)
        except Exception as error:  # noqa: BLE001 - e.g. out of memory or a compile failure: report and go on
            self._fail(entry, "warm-up", error)

    def _measure_phase(self, entries: list[_Entry], phase: str, input_ids: torch.Tensor) -> None:
        length = input_ids.shape[1]
        for entry in entries:
            entry.result = Result(entry.variant.name, entry.variant.family, entry.mode, phase, length,
                                  self.preset.batch_size)
            self.run.results.append(entry.result)
            entry.step = make_step(entry.model, input_ids, phase == "train", self.autocast_dtype)
        if any(entry.mode == "compiled" for entry in entries):
            torch.compiler.reset()  # fresh dynamo caches: the recompile limit counts from zero each phase
        # Eager first: compiled models take their FLOPs from their eager twin.
        with strict_recompiles():
            for entry in sorted(entries, key=lambda e: e.mode != "eager"):
                self._warm_up(entry, input_ids)
            self._time_rounds(entries, length)
        for entry in entries:
            result = entry.result
            if result.status == "ok":
                median = result.median(self.run.timer)
                memory = f"{result.peak_bytes / 2**20:.1f} MiB" if result.peak_bytes is not None else "-"
                self.log(f"    {entry.variant.name:<22} {entry.mode:<8} {phase:<5} n={length:<6} "
                         f"{1e3 * median:9.1f} ms  peak {memory}")

    def _time_rounds(self, entries: list[_Entry], length: int) -> None:
        """``preset.repeats_at(length)`` rounds, each timing every live entry once, rotated by one a round
        (slow drifts of a shared machine hit all entries alike)."""
        for round_index in range(self.preset.repeats_at(length)):
            alive = [e for e in entries if e.step is not None]
            shift = round_index % max(len(alive), 1)
            for entry in alive[shift:] + alive[:shift]:
                try:
                    elapsed = time_step(entry.step, self.device)
                except Exception as error:  # noqa: BLE001
                    self._fail(entry, f"repeat {round_index}", error)
                    continue
                entry.result.wall.append(elapsed.wall)
                entry.result.cpu.append(elapsed.cpu)

    def run_all(self) -> BenchRun:
        """Measure everything. On Ctrl-C (``KeyboardInterrupt``, raised again) ``self.run`` keeps the rows of
        every finished phase, drops those of the phase it stopped in (its models were timed in rotated rounds,
        so none of its rows is whole), and ``BenchRun.interrupted`` says where it stopped, and what stopped
        it: the interrupt's message (a caller's signal handler may raise one, e.g. at a time limit), else
        "Ctrl-C"."""
        start = time.perf_counter()
        stage = "the graph-break checks"
        kept = 0  # results of the finished phases
        try:
            if self.check_graph_breaks:
                self._graph_checks()
            extra = {n for variant in self.variants.values() for n in variant.extra_lengths}
            for length in sorted({*self.preset.lengths, *extra}):
                stage = f"building the models for n = {length}"
                entries = self._entries(length)
                if not entries:
                    continue
                self.log(f"n = {length}: {len(entries)} entries, {self.preset.repeats_at(length)} repeats")
                input_ids = random_input_ids(self.preset.batch_size, length, self.device)
                for phase in PHASES:
                    stage = f"the {phase} phase at n = {length}"
                    self._measure_phase(entries, phase, input_ids)
                    kept = len(self.run.results)
                del entries
                self._drop_per_length_models()
            stage = "the training loops"
            self._loops()
        except KeyboardInterrupt as stop:
            dropped = len(self.run.results) - kept
            del self.run.results[kept:]
            cause = str(stop) or "Ctrl-C"
            self.run.interrupted = (f"stopped by {cause} during {stage}: {kept} rows of the phases before it "
                                    f"are kept, {dropped} unfinished rows of that stage dropped")
            self.log(f"  {self.run.interrupted}")
            raise
        finally:
            self.run.elapsed_s = time.perf_counter() - start
            self.run.environment["load_average_end"] = _load_average()
        return self.run

    def _drop_per_length_models(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------------ loops
    def _loops(self) -> None:
        """The training loops (family ``loop``) side by side, ``preset.repeats`` rounds (``bench/loops.py``);
        on another device than the CPU their rows are skipped."""
        sides = {name: v for name, v in self.variants.items() if v.family == LOOP_FAMILY}
        if not sides:
            return
        size = loop_size(self.preset)
        shared = {"model": LOOP_MODEL_TYPE, "batch_size": size.batch_size, "steps": size.steps,
                  "warmup_steps": size.warmup_steps, "tokens_per_step": size.tokens_per_step}
        details = {name: {"loop": v.extra["loop"], "objective": v.extra["objective"], **shared}
                   for name, v in sides.items()}
        if self.device.type != "cpu":
            for name, v in sides.items():
                self.run.results.append(Result(name, v.family, "eager", "train", size.length, size.batch_size,
                                               "skipped", "the loop comparison runs on CPU, in one process",
                                               loop=details[name]))
            return
        from .loops import LoopJob, measure_loops

        model = tuple(loop_model(self.preset).items())
        jobs = {name: LoopJob(v.extra["loop"], v.extra["objective"], model, size)
                for name, v in sides.items()}
        self.log(f"training loops: {', '.join(jobs)}; {self.preset.repeats} round(s) of {size.steps} steps "
                 f"({size.warmup_steps} untimed) of {size.batch_size} × {size.length} tokens")
        for name, outcome in measure_loops(jobs, self.preset.repeats, log=self.log).items():
            result = Result(name, LOOP_FAMILY, "eager", "train", size.length, size.batch_size,
                            loop={**details[name],
                                  "train_loss": [round(r.train_loss, 6) for r in outcome.runs]})
            result.wall, result.cpu = [r.wall for r in outcome.runs], [r.cpu for r in outcome.runs]
            if outcome.error is not None:
                result.status, result.reason = "failed", outcome.error
            if outcome.runs:
                self.run.variants[name]["parameters"] = outcome.runs[0].parameters
                result.loop["steps_done"] = [r.steps for r in outcome.runs]
            self.run.results.append(result)

    def _graph_checks(self) -> None:
        """``torch._dynamo.explain`` on every variant (forward, shortest length): one graph, no break?"""
        for variant in self.variants.values():
            lengths = [n for n in self.preset.lengths if variant.runs_at(n)]
            if not lengths:
                continue
            length = min(lengths)
            input_ids = random_input_ids(1, length, self.device)
            try:
                model = self._model(variant, length)
                graphs, breaks, reasons = graph_breaks(model, input_ids)
                check = {"variant": variant.name, "graphs": graphs, "breaks": breaks, "reasons": reasons}
            except Exception as error:  # noqa: BLE001
                check = {"variant": variant.name, "graphs": None, "breaks": None,
                         "reasons": [f"{type(error).__name__}: {error}"[:200]]}
            self.run.graph_checks.append(check)
            self.log(f"  dynamo.explain {variant.name}: graphs={check['graphs']} breaks={check['breaks']}")


__all__ = ["PHASES", "BenchRun", "Result", "Runner", "environment"]
