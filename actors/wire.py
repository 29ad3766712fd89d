"""Frame kinds and limits shared by senders, actor loops and the node service.

Every header is one msgpack array encoded by ``warren.actors.codec``; large bodies follow it as
frames of their own. The ROUTER side sees the DEALER's routing id as an extra first frame.

    data mailbox    [TELL | ASK | BATCH, incarnation, request_id, body]
                    incarnation 0 = whichever incarnation lives at the address;
                    BATCH carries a list of messages in one frame.
    replies         [REPLY_OK | REPLY_ERROR, request_id, value]
                    REPLY_ERROR's value is [type_name, message, traceback_text].
    control         [PING | STOP | STATS | FIGURES | EXIT | DOWN | ALARM, incarnation,
                     request_id, body]
                    EXIT and DOWN come from the node, ALARM from whoever watches the
                    node's resources ([resource, raised]); none expects a reply.
                    FIGURES ([question | None, process]) is a node's metrics' one
                    request: answered [counters, the actor's answer to the question |
                    None, {"cpu_seconds", "rss_bytes"} of its process | None]. The
                    actor also publishes the answer, and answers the question itself
                    from then on, where the node reads it (``warren.actors.figures``).
    node service    [READY | FAILED | MONITOR | DEMONITOR | LINK | WHEREIS | REGISTER
                     | UNREGISTER | STOP_ACTOR | MONITOR_NAMED, request_id, body]
                    MONITOR_NAMED ([watcher, [name, ...]]) looks each name up and
                    monitors the incarnation found: answered [ref | None, ...].
"""

import errno
import logging

TELL = 1
ASK = 2
BATCH = 3
REPLY_OK = 4
REPLY_ERROR = 5

PING = 10
STOP = 11
STATS = 12
EXIT = 13
DOWN = 14
ALARM = 15
FIGURES = 16

READY = 20
FAILED = 21
MONITOR = 22
DEMONITOR = 23
LINK = 24
WHEREIS = 25
REGISTER = 26
UNREGISTER = 27
STOP_ACTOR = 28
MONITOR_NAMED = 29

# Hard limit of one message, all frames together (bytes); both ends enforce it. It leaves
# room for the largest broker message (128 MiB, RabbitMQ's max_message_size) in one
# publish with its envelope, so a message the broker takes is never refused down here.
MAX_MESSAGE_BYTES = 129 * 1024 * 1024
# Messages a mailbox queues per sender connection before the sender is pushed back. The
# sender's own queue holds as many again. ZeroMQ counts messages, not bytes: a batch is
# one message, so this is a safety net, and byte budgets belong to credit flow above it.
DEFAULT_MAILBOX_SIZE = 1000
# A loop pass stops draining once it has received this many bytes (bytes), so a burst of
# large batches is handed to the actor in bounded slices.
MAX_BATCH_BYTES = 8 * 1024 * 1024
# How long a close waits for unsent frames (milliseconds): bounded, never forever.
LINGER_MS = 1000
# How long a tell blocks on a full mailbox before MailboxFull (seconds).
DEFAULT_SEND_TIMEOUT_S = 10.0
# How long an ask waits for its reply before AskTimeout (seconds).
DEFAULT_ASK_TIMEOUT_S = 30.0
# While a caller waits for a reply it re-checks, this often, whether the target is known
# dead (seconds), so an ask to an actor that dies fails with ActorDeadError, not a timeout.
DEATH_CHECK_INTERVAL_S = 0.1


def unroutable_log_level(errno_value: int | None) -> int:
    """How loud an answer that could not be sent is logged: INFO for a caller that has
    gone (EHOSTUNREACH: a client that ended, a process restarted with a request out, an
    everyday event), WARNING for one whose pipe is full (a caller that does not read)."""
    return logging.INFO if errno_value == errno.EHOSTUNREACH else logging.WARNING
