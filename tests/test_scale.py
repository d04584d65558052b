"""Opening at scale: the collector pause, and large headers read exactly."""

from __future__ import annotations

import gc
import threading

from weightio._gc import collector_paused


def test_collector_paused_restores_the_collector_state():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_collector_paused_comes_back_after_an_error_and_across_threads():
    try:
        with collector_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def hold():
        with collector_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert gc.isenabled()
