"""Every store client call ends: an answer, StoreRestarted, or StoreTimeout; and the
client's credit is exact: no more than its window is ever unanswered."""

import contextlib
import os
import signal
import threading

import pytest

from warren.store import StoreTimeout, StoreUnavailable
from warren.store.client import StoreClient

from ..waiting import wait_for
from .helpers import body, msg_id


@contextlib.contextmanager
def stopped(pid: int):
    """SIGSTOP ``pid`` for the block; SIGCONT however the block ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def in_thread(call):
    """Run ``call`` in a thread; return a function that joins it and gives its outcome."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test, which asserts on it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result(timeout=60):
        thread.join(timeout)
        assert not thread.is_alive(), "the call never ended"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return result


CALLS = {
    "read": lambda c: c.read(msg_id(1)),
    "read_many": lambda c: c.read_many([msg_id(1), msg_id(2)]),
    "contains": lambda c: c.contains(msg_id(1)),
    "contains_many": lambda c: c.contains_many([msg_id(1), msg_id(2)]),
    "terminate": lambda c: c.terminate(),
}
ANSWERS = {
    "read": body(1),
    "read_many": [body(1), body(2)],
    "contains": True,
    "contains_many": [True, True],
    "terminate": None,
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_in_flight_when_the_store_restarts_is_answered_by_the_new_one(node, call):
    writer = StoreClient(node.store())
    writer.write(msg_id(1), body(1))
    writer.write(msg_id(2), body(2))
    writer.settle()
    writer.terminate()
    client = StoreClient(node.store(), restart_check_s=0.2)  # knows no location: asks
    store = node.store()
    with stopped(store.pid):
        outcome = in_thread(lambda: CALLS[call](client))
        os.kill(store.pid, signal.SIGKILL)
    wait_for(
        lambda: getattr(node.actors.whereis("msg_store_persistent"), "pid", store.pid) != store.pid
    )
    assert outcome() == ANSWERS[call]
    if call != "terminate":
        client.terminate()


def test_a_call_to_a_silent_store_ends_with_a_timeout_and_loses_nothing(node):
    client = StoreClient(node.store(), restart_check_s=0.2, call_timeout_s=1.5)
    client.write(msg_id(1), body(1))
    client.settle()
    fresh = StoreClient(node.store(), restart_check_s=0.2, call_timeout_s=1.5)
    with stopped(node.store().pid):
        with pytest.raises(StoreTimeout, match="alive but silent"):
            fresh.read(msg_id(1))
        with pytest.raises(StoreTimeout):
            fresh.contains(msg_id(1))
    assert fresh.read(msg_id(1)) == body(1)
    fresh.terminate()
    client.terminate()


def test_a_client_made_while_its_store_is_silent_gets_a_timeout_not_a_long_wait(node):
    # A queue restarting beside a frozen store waited the runtime's 30 s for its
    # registration, and held its whole supervision tree up meanwhile.
    with stopped(node.store().pid):
        made = in_thread(lambda: StoreClient(node.store(), call_timeout_s=1.5))
        with pytest.raises(StoreTimeout, match="alive but silent"):
            made(timeout=10)
    client = StoreClient(node.store(), call_timeout_s=1.5)
    client.write(msg_id(1), body(1))
    client.settle()
    assert client.read(msg_id(1)) == body(1)
    client.terminate()


def test_clients_registering_together_each_fail_only_where_their_answer_is_taken(node):
    # A queue starting registers with both stores in one round trip: each client sends
    # its Register when made, and its answer (or its timeout) comes where it is taken.
    transient_store = node.store("msg_store_transient")
    with stopped(transient_store.pid):
        made = in_thread(
            lambda: (
                StoreClient(node.store(), register_now=False, call_timeout_s=1.5),
                StoreClient(transient_store, register_now=False, call_timeout_s=1.5),
            )
        )
        persistent, transient = made(timeout=10)  # neither waited for an answer
        persistent.registered()  # its store answers
        assert persistent.incarnation == node.store().incarnation
        with pytest.raises(StoreTimeout, match="alive but silent"):
            transient.registered()
    # done with, as a client whose constructor raised: the store answers a new one
    transient = StoreClient(transient_store, register_now=False, call_timeout_s=10)
    for client in (persistent, transient):
        client.write(msg_id(1), body(1))
        client.settle()
        assert client.read(msg_id(1)) == body(1)
        client.terminate()


def test_no_more_than_the_window_is_ever_unanswered(node):
    window = 1000
    client = StoreClient(node.store(), batch_messages=300, max_in_flight=window)
    seen = []
    with stopped(node.store().pid):
        writes = in_thread(lambda: [client.write(msg_id(n), body(n, 50)) for n in range(5000)])
        # Blocked: a full batch waits because it would not fit beside what is unanswered.
        wait_for(lambda: client.batched == 300 and client.in_flight + client.batched > window)
        seen.append(client.in_flight)
    writes()
    client.settle()
    assert seen[0] <= window
    assert seen[0] == 900  # three batches of 300; a fourth would not fit
    assert client.in_flight == 0
    assert client.contains_many([msg_id(n) for n in (0, 2500, 4999)]) == [True] * 3
    client.terminate()


@pytest.mark.parametrize("unavailable_once_dead", [False, True])
def test_a_client_restarted_after_its_store_gives_up_on_a_dead_one_at_once(
    node, unavailable_once_dead
):
    """A queue is restarted after its store (rest_for_one), so its client must not wait in
    a call for the next store: the supervisor stops the queue before starting one. An
    application's client waits, and is answered by the successor."""
    store = node.store("msg_store_persistent")
    client = StoreClient(store, unavailable_once_dead=unavailable_once_dead)
    with stopped(store.pid):
        result = in_thread(lambda: client.contains(msg_id(1)))
        os.kill(store.pid, signal.SIGKILL)
    if unavailable_once_dead:
        with pytest.raises(StoreUnavailable):
            result()
    else:
        assert result() is False
