"""The parent's bookkeeping of its workers (homeserver.process.workers.Workers), without forking:
which exits restart a worker, which stop the server, and the exit code each leaves."""

from __future__ import annotations

import signal

import pytest

from homeserver.process import workers
from homeserver.process.workers import EXIT_CONFIG, MAX_RESTARTS, Workers


class Recorded(Workers):
    """Workers whose spawns and signals are recorded instead of made."""

    def __init__(self, count: int) -> None:
        super().__init__(lambda index: 0)
        self.spawned: list[int] = []
        self.signalled: list[int] = []
        self.children = {1000 + i: i for i in range(count)}

    def spawn(self, index: int) -> None:
        self.spawned.append(index)
        self.children[2000 + len(self.spawned)] = index

    def signal_all(self, signum: int) -> None:
        self.signalled.append(signum)


def test_a_crashed_worker_is_restarted_with_its_index():
    w = Recorded(2)
    w.exited(1001, -9)
    assert w.spawned == [1] and not w.stopping and w.exit_code == 0
    assert sorted(w.children.values()) == [0, 1]


def test_a_configuration_failure_stops_everything_with_exit_1():
    w = Recorded(2)
    w.exited(1000, EXIT_CONFIG)
    assert w.spawned == [] and w.stopping and w.signalled == [signal.SIGTERM] and w.exit_code == 1


def test_too_many_crashes_in_the_window_stop_the_server(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: now[0])
    w = Recorded(1)
    pid = 1000
    for _ in range(MAX_RESTARTS):
        w.exited(pid, 1)
        pid = max(w.children)
        now[0] += 1.0
    assert len(w.spawned) == MAX_RESTARTS and not w.stopping
    w.exited(pid, 1)
    assert len(w.spawned) == MAX_RESTARTS and w.stopping and w.exit_code == 1


def test_crashes_spread_past_the_window_keep_restarting(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(workers.time, "monotonic", lambda: now[0])
    w = Recorded(1)
    pid = 1000
    for _ in range(3 * MAX_RESTARTS):
        w.exited(pid, 1)
        pid = max(w.children)
        now[0] += workers.RESTART_WINDOW / MAX_RESTARTS + 1
    assert len(w.spawned) == 3 * MAX_RESTARTS and not w.stopping


@pytest.mark.parametrize("code, exit_code", [(0, 0), (1, 1), (-15, 1)])
def test_while_stopping_exits_are_counted_not_restarted(code, exit_code):
    w = Recorded(2)
    w.on_signal(signal.SIGTERM, None)
    assert w.stopping and w.signalled == [signal.SIGTERM]
    w.exited(1000, 0)
    w.exited(1001, code)
    assert w.spawned == [] and w.children == {} and w.exit_code == exit_code


def test_sighup_is_forwarded_and_stops_nothing():
    w = Recorded(2)
    w.on_signal(signal.SIGHUP, None)
    assert w.signalled == [signal.SIGHUP] and not w.stopping


def test_an_unknown_child_is_ignored():
    w = Recorded(1)
    w.exited(4242, 1)
    assert w.spawned == [] and w.children == {1000: 0}


def test_the_stop_lets_go_of_the_port_once():
    """The parent closes its listening sockets when the stop begins (on_stop), once: the
    draining workers alone hold the port, so a new server can bind it (kill; start)."""
    closed = []
    w = Recorded(2)
    w.on_stop = lambda: closed.append(True)
    w.on_signal(signal.SIGTERM, None)
    w.on_signal(signal.SIGINT, None)
    w.exited(1000, 0)
    assert closed == [True] and w.signalled == [signal.SIGTERM, signal.SIGTERM]


def test_a_crash_while_running_keeps_the_port():
    closed = []
    w = Recorded(2)
    w.on_stop = lambda: closed.append(True)
    w.exited(1001, -9)
    assert closed == [] and w.spawned == [1]


def test_a_stop_while_the_workers_are_forked_starts_no_more(monkeypatch):
    """A SIGTERM that lands between two forks (the signals are unblocked between spawns)
    stops the workers started so far and starts none of the rest: before, the rest were
    forked after the stop had been sent, never got it and served on."""
    made: list[Recorded] = []

    class StopAfterFirst(Recorded):
        def __init__(self, target, early, on_stop) -> None:
            super().__init__(0)
            made.append(self)

        def spawn(self, index: int) -> None:
            super().spawn(index)
            if index == 0:
                self.on_signal(signal.SIGTERM, None)

    monkeypatch.setattr(workers, "Workers", StopAfterFirst)

    def no_children() -> tuple[int, int]:  # the recorded children are no processes of ours
        raise ChildProcessError

    monkeypatch.setattr(workers.os, "wait", no_children)  # not the test run's own (its servers)
    previous = {sig: signal.getsignal(sig) for sig in workers.FORWARDED}
    try:
        assert workers.run_workers(3, lambda index: 0, early=workers.EarlySignals()) == 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert made[0].spawned == [0] and made[0].signalled == [signal.SIGTERM]
