"""The stages of long work (planning, the ORT check's child runs), told to whoever listens:
the CLI's progress display. Without a listener a stage costs one context-variable read."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("ckpt_stage_listener", default=None)


def stage(text: str) -> None:
    """A new stage of the work begins: ``text`` says what it does, in a few words."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(text)


@contextmanager
def listening(listener: Callable[[str], None] | None) -> Iterator[None]:
    """Within the block, every ``stage`` goes to ``listener`` (None: nowhere, as for work done
    beside the command's own)."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)

