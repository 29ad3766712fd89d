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

__all__ = [
    "EXCHANGE_KINDS",
    "PARTITION_SEED",
    "SUPER_STREAM",
    "murmur3_32",
    "partition_of",
    "route",
    "topic_matches",
]

EXCHANGE_KINDS = ("direct", "fanout", "topic")  # what an application declares
SUPER_STREAM = "super-stream"  # the kind of a super stream's exchange, declared with it
PARTITION_SEED = 104729  # the seed RabbitMQ's stream clients hash routing keys with
_MASK = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593


def route(kind: str, bindings: list[list[str]], routing_key: str) -> list[str]:
    """The queues, in binding order and each once, that a message goes to."""
    if kind == "fanout":
        matched = [queue for queue, _ in bindings]
    elif kind == "direct":
        matched = [queue for queue, key in bindings if key == routing_key]
    elif kind == "topic":
        matched = [queue for queue, key in bindings if topic_matches(key, routing_key)]
    elif kind == SUPER_STREAM:
        partition = str(partition_of(routing_key, len(bindings)))
        matched = [queue for queue, key in bindings if key == partition]
    else:
        raise ValueError(f"exchange kind must be one of {EXCHANGE_KINDS}, got {kind!r}")
    return list(dict.fromkeys(matched))


@lru_cache(maxsize=65536)  # a publisher's keys repeat: the hash is pure Python
def partition_of(routing_key: str | bytes, partitions: int) -> int:
    """The partition (0 .. ``partitions`` - 1) a super stream sends ``routing_key`` to."""
    data = routing_key.encode() if isinstance(routing_key, str) else routing_key
    return murmur3_32(data) % partitions if partitions else 0


def murmur3_32(data: bytes, seed: int = PARTITION_SEED) -> int:
    """MurmurHash3's x86 32-bit hash of ``data``, unsigned."""
    hash_ = seed & _MASK
    whole = len(data) & ~3
    for start in range(0, whole, 4):
        hash_ ^= _scrambled(int.from_bytes(data[start : start + 4], "little"))
        hash_ = ((_rotl(hash_, 13) * 5) + 0xE6546B64) & _MASK
    if len(data) > whole:
        hash_ ^= _scrambled(int.from_bytes(data[whole:], "little"))
    hash_ ^= len(data)
    hash_ ^= hash_ >> 16
    hash_ = (hash_ * 0x85EBCA6B) & _MASK
    hash_ ^= hash_ >> 13
    hash_ = (hash_ * 0xC2B2AE35) & _MASK
    return hash_ ^ (hash_ >> 16)


def _scrambled(block: int) -> int:
    return (_rotl((block * _C1) & _MASK, 15) * _C2) & _MASK


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


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
