"""Routing: which queues an exchange sends a message to, from its kind, its bindings and
the message's routing key (AMQP 0-9-1's rules, as RabbitMQ applies them).

- the default exchange (``""``): the queue the routing key names;
- ``direct``: the queues bound with exactly the routing key;
- ``fanout``: every bound queue, whatever the key;
- ``topic``: the queues whose binding pattern matches the key, both split into words at
  ``.``; in a pattern ``*`` stands for exactly one word and ``#`` for zero or more.

Routing runs in the publisher's process, from the exchange's bindings as the node gave
them (``Definitions.exchange``), so a publish still goes straight to each queue's process.
A queue bound more than once is sent the message once.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["EXCHANGE_KINDS", "route", "topic_matches"]

EXCHANGE_KINDS = ("direct", "fanout", "topic")


def route(kind: str, bindings: list[list[str]], routing_key: str) -> list[str]:
    """The queues, in binding order and each once, that a message goes to."""
    if kind == "fanout":
        matched = [queue for queue, _ in bindings]
    elif kind == "direct":
        matched = [queue for queue, key in bindings if key == routing_key]
    elif kind == "topic":
        matched = [queue for queue, key in bindings if topic_matches(key, routing_key)]
    else:
        raise ValueError(f"exchange kind must be one of {EXCHANGE_KINDS}, got {kind!r}")
    return list(dict.fromkeys(matched))


@lru_cache(maxsize=4096)
def topic_matches(pattern: str, routing_key: str) -> bool:
    return _match(tuple(pattern.split(".")), tuple(routing_key.split(".")))


def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(rest, words[1:])
