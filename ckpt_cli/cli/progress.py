"""What a long command is doing, on stderr: a live line with the stage and the elapsed time
on a terminal; plain lines in a log (CI) for stages that last a while. Never on stdout."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Callable, TextIO

# A log gets a stage's line once the stage has lasted this long, and again every HEARTBEAT_S
# while it lasts: a quick command (or one that fails at once) prints no progress at all.
LINE_AFTER_S = 5.0
HEARTBEAT_S = 30.0
POLL_S = 0.25


def elapsed_text(seconds: float) -> str:
    """12 s, 2 min 05 s."""
    whole = int(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60:02d} s"


class Progress:
    """Stages (``stage``) and the news within one (``detail``: plans evaluated so far),
    shown live on a terminal or as lines in a log; does nothing when ``mode`` is None."""

    def __init__(self, first: str, mode: str | None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.mode, self.stream, self.clock = mode, stream or sys.stderr, clock
        self.started = clock()
        self.text, self.detail_text = first, ""
        self.stage_started, self.said, self.last_line, self.lines = self.started, False, 0.0, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._live: _LiveLine | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Progress":
        if self.mode == "live":
            live = self._live = _LiveLine(self.text, self.stream)
            live.start()
        elif self.mode == "lines":
            thread = self._thread = threading.Thread(target=self._watch, name="ckpt-progress", daemon=True)
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._live is not None:
            self._live.stop()
        if kind is None and self.lines:
            self._say(f"done in {elapsed_text(self.clock() - self.started)}")

    def stage(self, text: str) -> None:
        with self._lock:
            self.text, self.detail_text = text, ""
            self.stage_started, self.said = self.clock(), False
        if self._live is not None:
            self._live.show(text)

    def detail(self, text: str) -> None:
        with self._lock:
            self.detail_text = text
        if self._live is not None:
            self._live.show(text)

    def tick(self, now: float) -> None:
        """A log's line, when the stage has lasted LINE_AFTER_S, then every HEARTBEAT_S."""
        with self._lock:
            if not self.said and now - self.stage_started >= LINE_AFTER_S:
                self.said, self.last_line = True, now
                self._say(f"{elapsed_text(now - self.started)}: {self.detail_text or self.text}")
            elif self.said and now - self.last_line >= HEARTBEAT_S:
                self.last_line = now
                self._say(f"{elapsed_text(now - self.started)}: still {self.detail_text or self.text}")

    def _say(self, text: str) -> None:
        from ..report.text import plain

        self.lines += 1
        print(plain(f"ckpt: {text}"), file=self.stream, flush=True)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            self.tick(self.clock())


def progress(first: str, quiet: bool, lines: bool = True) -> Progress:
    """The display for a command: live on a terminal, plain lines in a log when ``lines``,
    none under -q."""
    if quiet:
        return Progress(first, None)
    if sys.stderr.isatty():
        return Progress(first, "live")
    return Progress(first, "lines" if lines else None)


class _LiveLine:
    """rich's spinner, the stage and the elapsed time, redrawn in place and cleared at the end."""

    def __init__(self, first: str, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=Console(file=stream), transient=True,
                                 redirect_stdout=False)  # stdout is the report's alone
        self.task = self.rich.add_task(self._markup(first), total=None)

    @staticmethod
    def _markup(text: str) -> str:
        from ..report.text import safe

        return safe(text)

    def show(self, text: str) -> None:
        # drawn at once: a stage shorter than rich's refresh period would otherwise never show
        self.rich.update(self.task, description=self._markup(text), refresh=True)

    def start(self) -> None:
        self.rich.start()

    def stop(self) -> None:
        self.rich.stop()

