"""Imported into `governor run` by bench/hook_cpu.py: times chosen functions with time.thread_time.

`install(targets)` wraps each "module:Class.method" (or "module:function") so that every
call adds its thread CPU time and a count to a table. SIGUSR1 clears the table (the end of a
warm-up), SIGUSR2 writes it as JSON to the file named by HOOK_CPU_OUT. The cyclic garbage
collector's passes are timed too (gc.callbacks), one row per generation ("gc:0", "gc:1",
"gc:2"), with the objects each freed (cyclic garbage). HOOK_CPU_GC_THRESHOLD, when set, is
the youngest generation's threshold to run with (an experiment: `governor run` keeps
Python's default). Async functions are timed across their awaits too, which is only their
own work while nothing else runs in between: true of the governor's hooks on the usual
path, where no await suspends.
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import json
import os
import signal
import time
from typing import Any, Callable

_TABLE: dict[str, list[float]] = {}  # target -> [thread seconds, calls, objects collected (gc rows)]


def _timed(fn: Callable[..., Any], cell: list[float]) -> Callable[..., Any]:
    clock = time.thread_time
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                cell[0] += clock() - began
                cell[1] += 1
        return timed_async

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            cell[0] += clock() - began
            cell[1] += 1
    return timed


def install(targets: list[str]) -> None:
    for target in targets:
        module_name, _, path = target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        cell = _TABLE.setdefault(target, [0.0, 0, 0])
        setattr(owner, name, _timed(getattr(owner, name), cell))
    _time_collections()
    signal.signal(signal.SIGUSR1, lambda *_: _clear())
    signal.signal(signal.SIGUSR2, lambda *_: _write(os.environ["HOOK_CPU_OUT"]))


def _time_collections() -> None:
    """A row per generation: the thread CPU time of each collection and their count."""
    threshold = os.environ.get("HOOK_CPU_GC_THRESHOLD")
    if threshold:
        gc.set_threshold(int(threshold), *gc.get_threshold()[1:])
    cells = [_TABLE.setdefault(f"gc:{generation}", [0.0, 0, 0]) for generation in range(3)]
    clock = time.thread_time
    began = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = clock()
        else:
            cell = cells[info["generation"]]
            cell[0] += clock() - began[0]
            cell[1] += 1
            cell[2] += info["collected"]  # unreachable objects freed: garbage in reference cycles

    gc.callbacks.append(callback)


def _clear() -> None:
    for cell in _TABLE.values():
        cell[0], cell[1], cell[2] = 0.0, 0, 0


def _write(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({target: {"seconds": s, "calls": int(n), "collected": int(c)} for target, (s, n, c) in _TABLE.items()}, f)
    os.replace(path + ".tmp", path)
