"""Work beside a command (``ckpt_cli/background.py``): a forked child gives what the work
returns, and wherever no child gives it the work runs in the process that asks."""

from __future__ import annotations

import os
import time
from unittest import mock

import pytest

from ckpt_cli import background
from ckpt_cli.background import Background, can_fork
from ckpt_cli.errors import ModelError

forks = pytest.mark.skipif(not can_fork(), reason="a forked child runs on Linux with more than one core")


@forks
def test_the_child_does_the_work_and_gives_its_result():
    parent = os.getpid()
    work = Background(lambda: (os.getpid(), [1, {"a": 2}]))
    pid, value = work.result()
    assert pid != parent and value == [1, {"a": 2}]


@forks
def test_the_child_works_while_the_command_does(tmp_path):
    """The work starts when the child does, not when its result is asked for: the command
    sees its mark before it asks."""
    mark = tmp_path / "started"

    def work() -> str:
        mark.write_text("1")
        return "done"

    started = Background(work)
    deadline = time.monotonic() + 20
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.exists()
    assert started.result() == "done"


def test_serial_runs_the_work_where_the_result_is_asked_for():
    calls: list[int] = []
    with mock.patch.dict(os.environ, {"CKPT_SERIAL": "1"}):
        assert not can_fork()
        work = Background(lambda: calls.append(os.getpid()) or len(calls))
        assert calls == []  # not started yet
        assert work.result() == 1
    assert calls == [os.getpid()]


@forks
def test_an_error_in_the_child_is_raised_where_the_result_is_asked_for():
    here = os.getpid()

    def fails() -> None:
        raise ModelError(f"raised in {os.getpid()}")

    with pytest.raises(ModelError, match=f"raised in {here}"):
        Background(fails).result()


@forks
def test_a_result_that_cannot_be_pickled_is_made_again_here():
    here = os.getpid()
    pid, _ = Background(lambda: (os.getpid(), lambda: None)).result()
    assert pid == here


@forks
def test_a_child_that_dies_leaves_the_work_to_the_command():
    here = os.getpid()
    work = Background(lambda: os._exit(3) if os.getpid() != here else "done here")
    assert work.result() == "done here"


@forks
def test_a_child_past_its_time_is_stopped_and_the_work_done_here(monkeypatch):
    here = os.getpid()
    monkeypatch.setattr(background, "MIN_WAIT_S", 0.2)
    work = Background(lambda: time.sleep(30) if os.getpid() != here else "done here")
    start = time.monotonic()
    assert work.result() == "done here"
    assert time.monotonic() - start < 5


@forks
def test_the_child_writes_nothing_where_the_command_writes(capfd):
    def noisy() -> int:
        print("from the child")
        os.write(2, b"raw from the child\n")
        return 7

    assert Background(noisy).result() == 7
    out, err = capfd.readouterr()
    assert "child" not in out + err


@forks
def test_a_child_whose_result_nobody_asks_for_is_stopped():
    work = Background(lambda: time.sleep(30))
    pid = work._child[0]
    del work
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already


def test_calls_side_by_side_give_their_results_in_order():
    assert background.side_by_side(lambda: 1, lambda: "two", lambda: [3]) == [1, "two", [3]]


@pytest.mark.skipif(not background.side_by_side_allowed(), reason="one core")
def test_calls_side_by_side_run_at_once(tmp_path):
    """Each call waits for the other's mark: one after the other, the first would wait alone."""

    def meet(mine: str, theirs: str) -> bool:
        (tmp_path / mine).write_text("1")
        deadline = time.monotonic() + 20
        while not (tmp_path / theirs).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return (tmp_path / theirs).exists()

    assert background.side_by_side(lambda: meet("a", "b"), lambda: meet("b", "a")) == [True, True]


def test_serial_makes_the_calls_one_after_the_other_here():
    import threading

    with mock.patch.dict(os.environ, {"CKPT_SERIAL": "1"}):
        threads = background.side_by_side(threading.get_ident, threading.get_ident)
    assert threads == [threading.get_ident()] * 2


def test_of_calls_side_by_side_the_first_error_is_raised():
    def fails(what: str):
        def call() -> None:
            raise ModelError(what)
        return call

    with pytest.raises(ModelError, match="first"):
        background.side_by_side(lambda: 1, fails("first"), fails("second"))


@forks
def test_where_no_child_can_be_made_the_work_is_done_here(monkeypatch):
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    assert Background(os.getpid).result() == os.getpid()
