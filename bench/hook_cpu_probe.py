"""Imported into `governor run` by bench/hook_cpu.py: times chosen functions with time.thread_time.

`install(targets)` wraps each "module:Class.method" (or "module:function") so that every
call adds its thread CPU time and a count to a table. SIGUSR1 clears the table (the end of a
warm-up), SIGUSR2 writes it as JSON to the file named by HOOK_CPU_OUT. Async functions are
timed across their awaits too, which is only their own work while nothing else runs in
between: true of the governor's hooks on the usual path, where no await suspends.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import signal
import time
from typing import Any, Callable

_TABLE: dict[str, list[float]] = {}  # target -> [thread seconds, calls]


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
        cell = _TABLE.setdefault(target, [0.0, 0])
        setattr(owner, name, _timed(getattr(owner, name), cell))
    signal.signal(signal.SIGUSR1, lambda *_: _clear())
    signal.signal(signal.SIGUSR2, lambda *_: _write(os.environ["HOOK_CPU_OUT"]))


def _clear() -> None:
    for cell in _TABLE.values():
        cell[0], cell[1] = 0.0, 0


def _write(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({target: {"seconds": s, "calls": int(n)} for target, (s, n) in _TABLE.items()}, f)
    os.replace(path + ".tmp", path)
