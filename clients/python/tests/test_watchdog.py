"""The watch watchdog: one thread for every watch of the process, which a
watch whose check fails must not stop."""

import time

from latchkey import watch as watch_module


class _Failing:
    def _cancel_if_silent(self, now: float) -> None:
        raise RuntimeError("planted failure")


class _Counting:
    def __init__(self) -> None:
        self.checks = 0

    def _cancel_if_silent(self, now: float) -> None:
        self.checks += 1


def test_a_failing_watch_does_not_stop_the_watchdog(monkeypatch):
    monkeypatch.setattr(watch_module, "_WATCHDOG_TICK", 0.01)
    dog = watch_module._Watchdog()
    failing, counting = _Failing(), _Counting()
    dog.add(failing)
    dog.add(counting)
    try:
        deadline = time.monotonic() + 5
        while counting.checks < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        # A watchdog thread that died at the first failure checks the other
        # watch once at most.
        assert counting.checks >= 3, f"the other watch was checked {counting.checks} times"
    finally:
        dog.remove(failing)
        dog.remove(counting)
