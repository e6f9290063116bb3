"""The writer's request-id window: one held-up write keeps new ids within
the window of it, so its resend is never forgotten by the session."""

import threading

from latchkey.writer import WINDOW, RequestWindow


def test_a_held_up_write_holds_the_window_not_the_others():
    window = RequestWindow()
    stuck = window.take()
    for _ in range(1, WINDOW):
        rid = window.take()
        assert rid - stuck < WINDOW
        window.done(rid)
    got = []
    waiter = threading.Thread(target=lambda: got.append(window.take()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), f"an id {WINDOW} past a write in flight was handed out"
    window.done(stuck)
    waiter.join(5)
    assert not waiter.is_alive() and got == [WINDOW + 1]
