"""Running a parity matrix in parts: deterministic shards, worker processes, and a time estimate.

A shard is a set of whole weight groups (every case sharing a weight and its probe configuration),
so each shard builds its weights once and probes each configuration once; the n shards of a case
list are disjoint and together cover it, whatever machine computes them.

Workers are processes, one per shard, each importing the kernels by their `module:attr` target and
sending each CaseReport back as it finishes; on a machine with several GPUs each worker gets its own.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterable, Sequence

from .cases import Case
from .check import CaseReport, probe_key

# Seconds per unit of work (oracle.runner.case_cost) on a 2-core CPU machine with an interpreted
# Triton kernel in the run: a rough scale for the estimate printed before a CPU run, not a promise.
CPU_SECONDS_PER_UNIT = 5.0e-8


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 1 <= i <= n -> (i, n)."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"shard: expected 'i/n' with 1 <= i <= n, got {text!r}") from None
    if not 1 <= index <= count:
        raise ValueError(f"shard: expected 'i/n' with 1 <= i <= n, got {text!r}")
    return index, count


def worker_device(worker: str | None, gpus: int) -> str:
    """The device of one pytest-xdist worker: worker gwI runs on GPU I mod G (of the G visible
    devices), so `pytest -n G` spreads a tier over G GPUs; without xdist, GPU 0; without GPUs, the CPU."""
    if gpus == 0:
        return "cpu"
    index = int(worker[2:]) if worker and worker.startswith("gw") and worker[2:].isdigit() else 0
    return f"cuda:{index % gpus}"


def groups_of(cases: Iterable[Case]) -> list[list[Case]]:
    """The cases grouped by weight configuration (probe_key), in first-seen order."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault(probe_key(case), []).append(case)
    return list(groups.values())


def case_cost(case: Case, probed: bool) -> float:
    """Work units of one case: the reference and the kernel over M rows (and a fixed cost per
    call), plus (once per weight configuration) building the weight and running the probes, whose
    one-hot rows cost far less each than a random row (no reference product, wide tiles)."""
    nk = case.n * case.k
    cost = nk * (case.m + 8)
    if probed:
        group = case.k if case.group_size == -1 else case.group_size
        cost += nk * (min(case.k, 4096) // 8 + case.k // group + 40)
    return float(cost)


def group_cost(group: Sequence[Case]) -> float:
    return sum(case_cost(c, i == 0) for i, c in enumerate(group))


def shard(cases: Sequence[Case], index: int, count: int) -> list[Case]:
    """Shard `index` of `count` (1-based): whole weight groups, balanced by cost (the largest group
    first onto the least loaded shard, ties to the lowest shard), in the cases' order."""
    groups = groups_of(cases)
    loads = [0.0] * count
    owner: dict[int, int] = {}
    for g in sorted(range(len(groups)), key=lambda i: (-group_cost(groups[i]), i)):
        target = min(range(count), key=lambda s: (loads[s], s))
        owner[g] = target
        loads[target] += group_cost(groups[g])
    mine = {id(c) for g, members in enumerate(groups) if owner[g] == index - 1 for c in members}
    return [c for c in cases if id(c) in mine]


def estimate_seconds(cases: Sequence[Case], kernels: int, workers: int) -> float:
    """A rough wall time for `kernels` kernels over `cases` on CPU cores."""
    total = sum(group_cost(g) for g in groups_of(cases))
    return total * CPU_SECONDS_PER_UNIT * (1 + kernels) / max(1, workers)


def _worker(targets: list[str], index: int, count: int, tier_cases: list[Case], device: str, seed: int,
            env: dict[str, str], results: multiprocessing.Queue) -> None:
    os.environ.update(env)
    import torch

    from .check import check_kernels
    from .cli import load_spec

    if device == "cpu":  # the workers share the cores: one thread each, not one pool each
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // count))

    try:
        specs = [load_spec(t) for t in targets]
        check_kernels(specs, shard(tier_cases, index, count), seed, device, on_result=results.put)
    except BaseException as exc:  # the parent reports a worker that could not run at all
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))
    finally:
        results.put(("done", index, None))


def run_workers(targets: list[str], cases: list[Case], devices: list[str], seed: int,
                on_result: Callable[[CaseReport], None], env: dict[str, str] | None = None) -> list[str]:
    """One process per entry of `devices` (e.g. ["cpu", "cpu"] or ["cuda:0", "cuda:1"]), worker i
    running shard i of len(devices). Returns the errors of workers that failed outright."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    count = len(devices)
    procs = [context.Process(target=_worker, args=(targets, i + 1, count, cases, dev, seed, dict(env or {}),
                                                   results), daemon=True)
             for i, dev in enumerate(devices)]
    for p in procs:
        p.start()
    errors, running = [], count
    while running:
        try:
            item = results.get(timeout=5)
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
            if dead and len(dead) >= running:
                errors += [f"worker exited with code {p.exitcode}" for p in dead]
                break
            continue
        if isinstance(item, tuple):
            kind, index, text = item
            if kind == "error":
                errors.append(f"worker {index}/{count}: {text}")
            else:
                running -= 1
            continue
        on_result(item)
    for p in procs:
        p.join(timeout=10)
    return errors


class Clock:
    """Elapsed time and the time left: each kernel's seconds per unit of work so far (a fast
    baseline and an interpreted kernel differ by orders of magnitude) applied to its work left,
    shared over the workers."""

    def __init__(self, work: dict[str, float], workers: int) -> None:
        self.start = time.perf_counter()
        self.left = dict(work)
        self.done = {name: 0.0 for name in work}
        self.spent = {name: 0.0 for name in work}
        self.workers = max(1, workers)

    def advance(self, kernel: str, work: float, seconds: float) -> None:
        self.left[kernel] -= work
        self.done[kernel] += work
        self.spent[kernel] += seconds

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def remaining(self) -> float | None:
        rates = {k: self.spent[k] / self.done[k] for k in self.done if self.done[k] > 0}
        if not rates:
            return None
        slowest = max(rates.values())
        return sum(max(0.0, left) * rates.get(k, slowest) for k, left in self.left.items()) / self.workers


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
