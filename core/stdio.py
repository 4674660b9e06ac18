"""What native libraries print on the process's standard error, captured and routed through logging.

LiteRT writes ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` (and, for its GPU
accelerator, some forty lines of registry and driver logs) straight to file descriptor 2, with no
switch to turn it off.  Captured lines go to the log (``-vv`` shows them); the caller decides which
still reach stderr, and ``native_reason`` turns them into the one line that says why something failed.
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
