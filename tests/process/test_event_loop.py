"""[server] event_loop: auto, asyncio or uvloop; the server's coroutine runs on the chosen loop."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from homeserver.errors import ConfigError
from homeserver.process.server import run_event_loop


def in_thread(choice: str, main) -> None:
    """Run in a fresh thread: asyncio.run would replace this thread's current loop."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_event_loop(main, choice)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def loop_module(choice: str) -> str:
    seen: list[str] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    in_thread(choice, main())
    return seen[0]


def test_asyncio_choice_runs_on_asyncio():
    assert loop_module("asyncio").startswith("asyncio")


def test_auto_prefers_uvloop_when_installed():
    pytest.importorskip("uvloop")
    assert loop_module("auto").startswith("uvloop")


def test_uvloop_choice_without_uvloop_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import now fails

    async def main() -> None:
        raise AssertionError("must not run")

    with pytest.raises(ConfigError, match="uvloop is not installed"):
        in_thread("uvloop", main())
    assert loop_module("auto").startswith("asyncio")


def test_bad_event_loop_value_is_refused(make_config):
    with pytest.raises(ConfigError, match=r"server\.event_loop"):
        make_config({"server": {"event_loop": "trio"}})


def test_a_started_server_keeps_the_collector_off_start_up_and_still_collects_cycles():
    """settle_gc(): start-up's objects frozen, the young generation collected less often."""
    import gc
    import weakref

    from homeserver.process.server import GC_YOUNG_THRESHOLD, settle_gc

    saved = gc.get_threshold()
    try:
        settle_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *saved[1:])
        assert gc.get_freeze_count() > 0

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle only the collector can free
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
