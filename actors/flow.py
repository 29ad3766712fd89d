"""Credit-based flow control for a client of an actor: the one window that both the
message store's client (``warren.store.client.StoreClient``) and a queue connection
(``warren.queues.client.connection.Connection``) keep.

A client sends requests (a batch of writes, a publish) and keeps each in the window until
its answer is taken, oldest first. Before a new request goes, the client settles the oldest
until it fits: at most ``max_messages`` messages and ``max_bytes`` bytes unanswered
(RabbitMQ's credit: 4000 messages, and 32 MiB so that large messages are bounded too), and
at most ``max_requests`` requests. An empty window always admits the next request, so one
request larger than the whole window still goes, alone.

Why a request cap below the message cap: answers travel back to the client's socket,
which queues at most its high-water mark for one peer; an answer beyond that is dropped
by the answering actor (unroutable) and waited for in vain. 256 stays well below the
mailbox bound (1000) whatever the batch sizes.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = [
    "MAX_IN_FLIGHT",
    "MAX_IN_FLIGHT_BYTES",
    "MAX_IN_FLIGHT_REQUESTS",
    "CreditWindow",
]

MAX_IN_FLIGHT = 4000  # messages unanswered: RabbitMQ's msg_store_credit_disc_bound
MAX_IN_FLIGHT_BYTES = 32 * 2**20  # bytes unanswered
MAX_IN_FLIGHT_REQUESTS = 256  # requests unanswered (see above)

Request = TypeVar("Request")


class CreditWindow(Generic[Request]):
    """The requests a client has sent and not settled, oldest first, with the messages
    and bytes each one carries."""

    def __init__(
        self,
        max_messages: int = MAX_IN_FLIGHT,
        max_bytes: int = MAX_IN_FLIGHT_BYTES,
        max_requests: int = MAX_IN_FLIGHT_REQUESTS,
    ) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.max_requests = max_requests
        self.messages = 0  # carried by the requests in the window
        self.bytes = 0
        self._requests: collections.deque[tuple[Request, int, int]] = collections.deque()

    def full_for(self, messages: int, size: int) -> bool:
        """Whether a request of ``messages`` and ``size`` bytes must wait for the oldest
        to settle first (never when the window is empty)."""
        return bool(self._requests) and (
            self.messages + messages > self.max_messages
            or self.bytes + size > self.max_bytes
            or len(self._requests) >= self.max_requests
        )

    def add(self, request: Request, messages: int, size: int) -> None:
        self._requests.append((request, messages, size))
        self.messages += messages
        self.bytes += size

    def oldest(self) -> Request:
        return self._requests[0][0]

    def pop_oldest(self) -> Request:
        request, messages, size = self._requests.popleft()
        self.messages -= messages
        self.bytes -= size
        return request

    def clear(self) -> None:
        self._requests.clear()
        self.messages = self.bytes = 0

    def __iter__(self) -> Iterator[Request]:
        return (request for request, _, _ in self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)
