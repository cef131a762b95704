"""The ``ckpt`` command line: each command parses options, calls ``ckpt_cli.api`` and renders.

``main.py`` holds the group and registers every command; ``commands.py`` and ``compare.py``
define them, ``options.py`` the options they share."""

from __future__ import annotations

from .main import EXIT_BROKEN_PIPE, CkptGroup, main

__all__ = ["main", "CkptGroup", "EXIT_BROKEN_PIPE"]
