"""A client restarted after a crash claims the references its predecessor held, and no
other client's: what the store answers a queue's recovery (``MessageStore.claim``)."""

from warren.store import MessageStore

from .helpers import msg_id

QUEUE_A, QUEUE_A_AGAIN, QUEUE_B, QUEUE_B_AGAIN = b"a", b"a again", b"b", b"b again"
STRANGER = b"nobody"


def test_a_restarted_client_claims_its_predecessors_references_and_not_another_clients(tmp_path):
    with MessageStore(tmp_path) as store:
        shared, only_b, only_a = msg_id(1), msg_id(2), msg_id(3)
        store.write(shared, b"fanout", holder=QUEUE_A)
        store.write(shared, b"fanout", holder=QUEUE_B)
        store.write(only_b, b"b's", holder=QUEUE_B)
        store.write(only_a, b"a's", holder=QUEUE_A)
        store.sync()
        claimed = store.claim([shared, only_b, only_a, msg_id(4)], QUEUE_A_AGAIN, [QUEUE_A])
        assert claimed == [True, False, True, False]
        assert store.claim([shared, only_a], STRANGER, [QUEUE_A]) == [False, False]
        # B's references are still B's: its own successor gets them
        assert store.claim([shared, only_b], QUEUE_B_AGAIN, [QUEUE_B]) == [True, True]


def test_asked_again_a_claim_answers_the_same(tmp_path):
    with MessageStore(tmp_path) as store:
        store.write(msg_id(1), b"twice in one queue", holder=QUEUE_A)
        store.write(msg_id(1), b"twice in one queue", holder=QUEUE_A)
        ids = [msg_id(1), msg_id(1), msg_id(1)]  # a third entry was never written
        first = store.claim(ids, QUEUE_A_AGAIN, [QUEUE_A])
        assert first == [True, True, False]
        assert store.claim(ids, QUEUE_A_AGAIN, [QUEUE_A]) == first


def test_references_recovered_at_the_stores_start_are_claimed_once_each(tmp_path):
    with MessageStore(tmp_path) as store:
        store.write(msg_id(1), b"fanout", holder=QUEUE_A)
        store.write(msg_id(1), b"fanout", holder=QUEUE_B)
        store.sync()
    with MessageStore(tmp_path) as reopened:  # the holders are not kept: two references
        assert reopened.claim([msg_id(1)], QUEUE_A_AGAIN, [QUEUE_A]) == [True]
        assert reopened.claim([msg_id(1)], QUEUE_B_AGAIN, []) == [True]
        assert reopened.claim([msg_id(1)], STRANGER, []) == [False]


def test_an_entry_newer_than_the_stores_start_cannot_claim_a_reference_recovered_then(tmp_path):
    """B's reference predates the start; A's entry of the same id came after it, and A's
    write never arrived: A may not take B's reference for it."""
    with MessageStore(tmp_path) as store:
        store.write(msg_id(1), b"fanout", holder=QUEUE_B)
    with MessageStore(tmp_path) as reopened:
        since_its_start = reopened.start_token
        assert reopened.claim([msg_id(1)], QUEUE_A_AGAIN, [QUEUE_A], since_its_start) == [False]
        assert reopened.claim([msg_id(1)], QUEUE_B_AGAIN, [QUEUE_B]) == [True]


def test_entries_written_since_an_earlier_start_are_older_than_this_one(tmp_path):
    """A queue's entries written since the store's previous start, claimed of the store
    that restarted meanwhile: that store recovered their references at its own start."""
    with MessageStore(tmp_path) as store:
        before_the_restart = store.start_token
        store.write(msg_id(1), b"the queue's", holder=QUEUE_A)
    with MessageStore(tmp_path) as reopened:
        assert reopened.start_token != before_the_restart
        claimed = reopened.claim([msg_id(1)], QUEUE_A_AGAIN, [QUEUE_A], before_the_restart)
        assert claimed == [True]


def test_a_remove_by_a_client_that_holds_none_takes_no_other_clients_reference(tmp_path):
    with MessageStore(tmp_path) as store:
        store.write(msg_id(1), b"fanout", holder=QUEUE_A)
    with MessageStore(tmp_path) as reopened:  # one reference, its holder unknown
        reopened.write(msg_id(1), b"fanout", holder=QUEUE_B)
        assert reopened.remove(msg_id(1), STRANGER)  # the recovered one goes
        assert reopened.claim([msg_id(1)], QUEUE_A_AGAIN, [QUEUE_A]) == [False]
        assert not reopened.remove(msg_id(1), STRANGER)  # B's is not the stranger's
        assert reopened.stats()["message_count"] == 1
        assert reopened.claim([msg_id(1)], QUEUE_B_AGAIN, [QUEUE_B]) == [True]
        assert reopened.remove(msg_id(1), QUEUE_B_AGAIN)
        assert not reopened.contains(msg_id(1))
