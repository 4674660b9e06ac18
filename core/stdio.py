"""The process's standard error: what native libraries print there, and progress bars for long steps.

LiteRT writes ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` (and, for its GPU
accelerator, some forty lines of registry and driver logs) straight to file descriptor 2, with no
switch to turn it off.  Captured lines go to the log (``-vv`` shows them); the caller decides which
still reach stderr, and ``native_reason`` turns them into the one line that says why something failed.

``progress`` is the one progress bar of the project (compiling partitions, timing candidate plans,
calibrating, benchmark rows): shown on stderr only when the command line turned it on (a terminal,
no ``--json``) and only for steps still running after ``SHOW_AFTER_S``; nested steps share one display.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from typing import Callable, Iterator

SHOW_AFTER_S = 1.0  # a step shorter than this draws nothing (0: every step draws at once)
_LOCK = threading.RLock()  # file descriptor 2 is the process's: one redirection at a time
_LOCATION = re.compile(r"^(?:ERROR|E\d+ [\d:.]+ +\d+ [\w.]+:\d+\]):?\s*(?:\[[^\]]*\]\s*)?")


def not_info(line: str) -> bool:
    return not line.startswith("INFO: ")


@contextlib.contextmanager
def native_stderr(log: logging.Logger, echo: Callable[[str], bool] = not_info) -> Iterator[list[str]]:
    """Capture file descriptor 2 during the block into the yielded list (filled when it ends).

    Every line goes to ``log`` at debug level; those ``echo`` accepts are written back to stderr.
    """
    lines: list[str] = []
    with _LOCK, tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no standard error at all (a daemon): nothing to keep clean
            yield lines
            return
        os.dup2(capture.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines.extend(capture.read().decode(errors="replace").splitlines())
            for line in lines:
                log.debug("native: %s", line)
            shown = [line + "\n" for line in lines if echo(line)]
            if shown:
                os.write(2, "".join(shown).encode())


def native_reason(lines: list[str], message: str) -> str:
    """One readable line for a native failure: the first captured error line that says something (its
    source location dropped), else the first such line of the exception's ``message``; "" if none does."""
    for line in [*(x for x in lines if x.startswith(("ERROR", "E0"))), *message.splitlines()]:
        text = _LOCATION.sub("", line.strip(" └"))
        if text:
            return text
    return ""


_shown = False  # set by the command line: stderr is a terminal and stdout is not a JSON document
_display: dict = {}  # while steps run: the rich Progress they share ("bar"), how many ("users"), its timer
_display_lock = threading.Lock()


def show_progress(enabled: bool) -> None:
    global _shown
    _shown = enabled


def _start(bar) -> None:
    with _display_lock:
        if _display.get("bar") is bar:  # the steps may have ended while the timer fired
            bar.start()


def _Rate():
    """The rate column: parts per second of the steps that name a unit, nothing for the others."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            unit = task.fields.get("unit")
            return Text(f"{task.speed:.1f} {unit}/s" if unit and task.speed else "")

    return Rate()


@contextlib.contextmanager
def progress(description: str, total: int | None, unit: str = "") -> Iterator[Callable[..., None]]:
    """A bar for a step of ``total`` parts (None: not known yet); yields ``advance(label=None, parts=1,
    total=None)``, which counts parts done and may rename the step or set its total.  With ``unit`` the bar
    also shows the rate (e.g. samples/s).  Draws nothing unless :func:`show_progress` turned bars on."""
    if not _shown:
        yield lambda label=None, parts=1, total=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with _display_lock:
        if not _display:
            bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), _Rate(), console=Console(stderr=True), transient=True,
                           redirect_stdout=False)  # what a command prints stays on stdout
            _display.update(bar=bar, users=0, timer=threading.Timer(SHOW_AFTER_S, _start, (bar,)))
            _display["timer"].daemon = True
            if SHOW_AFTER_S > 0:
                _display["timer"].start()
            else:  # at once
                bar.start()
        bar = _display["bar"]
        _display["users"] += 1
        task = bar.add_task(description, total=total, unit=unit)

    def advance(label: str | None = None, parts: int = 1, total: int | None = None) -> None:
        bar.update(task, advance=parts, **({"description": label} if label else {}),
                   **({"total": total} if total is not None else {}))

    try:
        yield advance
    finally:
        with _display_lock:
            bar.remove_task(task)
            _display["users"] -= 1
            if not _display["users"]:
                _display["timer"].cancel()
                bar.stop()
                _display.clear()
