"""The demo's terminal output: plain lines, and budget meters.

On a terminal the meters are a live footer, redrawn in place (ANSI cursor moves)
below the lines printed so far, and filled smoothly. Anywhere else (a pipe, a
file, a test) nothing is redrawn: each update of the meters is one more line.
Colour only on a terminal, and never when NO_COLOR is set.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

EIGHTHS = " ▏▎▍▌▋▊▉"
FULL = "█"
EMPTY = "░"
BAR_WIDTH = 28
COMPACT_BAR_WIDTH = 16  # one-line-per-update form: two meters on a line
LIVE_MIN_COLUMNS = 72  # narrower, the meters would wrap and redrawing in place would garble them
ANIMATION_FRAMES = 8
ANIMATION_FRAME_SEC = 0.03


def bar(fraction: float, width: int) -> str:
    """A bar `width` cells wide, filled to `fraction` in eighths of a cell."""
    fraction = min(max(fraction, 0.0), 1.0)
    full, part = divmod(round(fraction * width * 8), 8)
    filled = FULL * full + (EIGHTHS[part] if part else "")
    return filled + EMPTY * (width - len(filled))


@dataclass(frozen=True)
class Meter:
    label: str  # "tokens"
    used: float
    limit: float | None
    show: Callable[[float], str] = lambda v: f"{v:,.0f}"

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit else 0.0

    def at(self, used: float) -> "Meter":
        return Meter(self.label, used, self.limit, self.show)

    def numbers(self) -> str:
        limit = self.show(self.limit) if self.limit is not None else "no limit"
        return f"{self.show(self.used)} / {limit}  {self.fraction:>4.0%}"


class Terminal:
    def __init__(self, out: TextIO | None = None, *, live: bool | None = None, color: bool | None = None,
                 pace: bool = True) -> None:
        self.out = out or sys.stdout
        if live is None:
            live = self.out.isatty() and shutil.get_terminal_size().columns >= LIVE_MIN_COLUMNS
        self.live = live
        self.color = (self.live and "NO_COLOR" not in os.environ) if color is None else color
        self.pace = pace  # False (--fast): no pauses, no animation
        self._footer: list[str] = []  # the live meters' lines, drawn last (live mode only)
        self._shown: dict[str, float] = {}  # meter label -> value last drawn (animation start)

    # --- text ----------------------------------------------------------------------

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def say(self, text: str = "") -> None:
        """A line above the live meters."""
        if self._footer:
            self._erase_footer()
            self._write(text + "\n")
            self._draw_footer()
        else:
            self._write(text + "\n")

    def heading(self, number: int, text: str) -> None:
        self.freeze()
        self.say()
        self.say(self.style(f"{number}  {text}", "1"))

    def field(self, name: str, value: str, width: int = 11) -> None:
        self.say(f"   {name:<{width}}{value}")

    def style(self, text: str, code: str) -> str:
        """SGR `code` around `text` when colour is on (1 bold, 2 dim, 31 red, 32 green, 33 yellow)."""
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def ok(self, text: str) -> str:
        return self.style(text, "32")

    def bad(self, text: str) -> str:
        return self.style(text, "31")

    async def pause(self, seconds: float) -> None:
        if self.pace:
            await asyncio.sleep(seconds)

    # --- meters --------------------------------------------------------------------

    async def meters(self, meters: Sequence[Meter]) -> None:
        """Show the meters' new values: redrawn in place (live), or one more line."""
        if not self.live:
            self._write("   " + "   ".join(self._compact(m) for m in meters) + "\n")
            return
        frames = ANIMATION_FRAMES if self.pace and self._footer else 1
        for frame in range(1, frames + 1):
            shown = []
            for meter in meters:
                start = self._shown.get(meter.label, meter.used)
                shown.append(meter.at(start + (meter.used - start) * frame / frames))
            self._redraw([self._full(m) for m in shown])
            if frame < frames:
                await asyncio.sleep(ANIMATION_FRAME_SEC)
        self._shown.update({m.label: m.used for m in meters})

    def freeze(self) -> None:
        """Leave the live meters as they are, as ordinary lines; the next meters start afresh."""
        self._footer = []
        self._shown = {}

    def _color_for(self, fraction: float) -> str:
        return "31" if fraction >= 1.0 else "33" if fraction >= 0.75 else "32"

    def _full(self, meter: Meter) -> str:
        cells = self.style(bar(meter.fraction, BAR_WIDTH), self._color_for(meter.fraction))
        return f"   {meter.label:<10} {cells}  {meter.numbers()}"

    def _compact(self, meter: Meter) -> str:
        return f"{meter.label} {bar(meter.fraction, COMPACT_BAR_WIDTH)} {meter.numbers()}"

    def _redraw(self, lines: list[str]) -> None:
        if self._footer:
            self._erase_footer()
        self._footer = lines
        self._draw_footer()

    def _erase_footer(self) -> None:
        # to the start of the footer's first line, then clear to the end of the screen
        self._write(f"\x1b[{len(self._footer)}F\x1b[J")

    def _draw_footer(self) -> None:
        self._write("".join(line + "\n" for line in self._footer))
