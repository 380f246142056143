"""Progress of a long command: a bar on a terminal, one summary line everywhere else.

On a terminal (standard output is a TTY, and no ``--json``) a bulk command shows a bar with
the cases done, the rate and the time left (rich's progress bar), and its status lines are
printed above the bar. In cron, in a pipe or with ``--json`` there is no bar: the status
lines are written exactly as before, and the command adds one summary line at the end.

rich is imported only when a bar is shown, so cron runs do not pay for it.
"""

from __future__ import annotations

import time
from typing import Any


def bar_wanted(stdout: Any, *, as_json: bool = False) -> bool:
    """A bar only for a person at a terminal: never with --json, never into a pipe or a file."""
    isatty = getattr(stdout, "isatty", None)
    return not as_json and bool(isatty and isatty())


def rate_text(done: int, seconds: float, unit: str) -> str:
    return f"{done / seconds:.1f} {unit}/s" if seconds > 0 else f"- {unit}/s"


class CommandProgress:
    """``with CommandProgress(self.stdout, label=..., total=n, bar=...) as progress:``

    ``advance(n)`` counts work done; ``write(text)`` prints a status line (above the bar, if
    there is one); ``elapsed`` and ``rate`` are for the summary line. ``total`` may be None
    when it is not known (the bar then counts without a time left).
    """

    def __init__(self, stdout: Any, *, label: str, total: int | None, bar: bool, unit: str = "cases"):
        self.stdout = stdout
        self.label = label
        self.total = total
        self.unit = unit
        self.bar = bar
        self.done = 0
        self._started = time.monotonic()
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> CommandProgress:
        self._started = time.monotonic()
        if self.bar:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            unit = self.unit

            class RateColumn(ProgressColumn):
                def render(self, task) -> Text:
                    speed = task.finished_speed or task.speed
                    return Text(f"{speed:.1f} {unit}/s" if speed else f"- {unit}/s")

            # The OutputWrapper's own stream: the bar and the status lines share one console.
            stream = getattr(self.stdout, "_out", self.stdout)
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(unit),
                RateColumn(),
                TextColumn("time left"),
                TimeRemainingColumn(),
                console=Console(file=stream, highlight=False),
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._progress is not None:
            self._progress.update(self._task, advance=n)

    def write(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stdout.write(text)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def rate(self) -> str:
        return rate_text(self.done, self.elapsed, self.unit)
