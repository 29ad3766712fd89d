"""Requests to an etcd cluster through the HTTP/JSON gateway of any of its members
(etcd3gw: no gRPC), and the parsing of the endpoints a user names.

``Etcd.call`` sends one request to the member that answered last and, when that member
refuses the connection or times out, to each other member in turn: a lease, a key and a
transaction live in the etcd cluster, not in a member, so any member serves them. Only
when every member failed does it raise ``EtcdUnavailable``, naming each member's error.

Races it guards against:
- A member killed or cut mid-request: the request times out (``REQUEST_TIMEOUT_S``) and
  goes to the next member. A transaction that timed out may have been applied all the
  same; every write the cluster's election makes is a compare-and-set whose retry finds
  what the first attempt did (see ``warren.supervisor.cluster.election``).
- An endpoint that answers but is not etcd's gateway (a web server, a Warren port): its
  answer fails to parse and counts as that member's error, never as an answer.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import EtcdRefused, EtcdUnavailable

__all__ = ["Etcd", "EtcdMember", "decoded", "encoded", "parse_endpoints"]

REQUEST_TIMEOUT_S = 1.5  # one request to one member, then the next member is asked
HEALTH_TIMEOUT_S = 1.0  # a member's /health, for the cluster's status
API_PATH = "/v3/"  # etcd 3.4 and later; named, so that no request asks /version first

T = TypeVar("T")


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``http://127.0.0.1:2379[,http://HOST:PORT…]`` as a tuple of base URLs; ValueError
    with the reason for anything else."""
    endpoints = tuple(part.strip() for part in text.split(",") if part.strip())
    if not endpoints:
        raise ValueError("name at least one etcd endpoint, e.g. http://127.0.0.1:2379")
    for endpoint in endpoints:
        parsed = urllib.parse.urlsplit(endpoint)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port is None:
            raise ValueError(
                f"{endpoint!r} is not an etcd endpoint: expected http://HOST:PORT or "
                "https://HOST:PORT"
            )
        if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
            raise ValueError(f"{endpoint!r}: an etcd endpoint has no path, query or fragment")
    if len(set(endpoints)) != len(endpoints):
        raise ValueError(f"an etcd endpoint is named twice in {text!r}")
    return endpoints


def encoded(text: str | bytes) -> str:
    """A key or value as the gateway's JSON carries it (base64)."""
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def decoded(field: str) -> bytes:
    return base64.b64decode(field)


@dataclass
class EtcdMember:
    """One endpoint and its gateway client (made at the first request)."""

    endpoint: str
    client: Any = None

    def connected(self) -> Any:
        if self.client is None:
            from etcd3gw.client import Etcd3Client  # an optional part: the cluster extra

            parsed = urllib.parse.urlsplit(self.endpoint)
            self.client = Etcd3Client(
                host=parsed.hostname or "",
                port=parsed.port or 0,
                protocol=parsed.scheme,
                timeout=REQUEST_TIMEOUT_S,
                api_path=API_PATH,
            )
        return self.client


class Etcd:
    """An etcd cluster reached through ``endpoints``; see the module docstring. Used by
    one thread at a time."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.members = [EtcdMember(endpoint) for endpoint in endpoints]
        self._preferred = 0

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(member.endpoint for member in self.members)

    def call(self, request: Callable[[Any], T]) -> T:
        """``request(client)`` on the member that answered last, else on each other in
        turn; ``EtcdUnavailable`` when none answered, ``EtcdRefused`` at once when one
        answered with an error of etcd's own (4xx: asking another would change nothing)."""
        import requests
        from etcd3gw.exceptions import (
            ConnectionFailedError,
            ConnectionTimeoutError,
            Etcd3Exception,
            InternalServerError,
        )

        errors = []
        count = len(self.members)
        for step in range(count):
            index = (self._preferred + step) % count
            member = self.members[index]
            try:
                answer = request(member.connected())
            except (ConnectionFailedError, ConnectionTimeoutError, InternalServerError) as exc:
                errors.append(f"{member.endpoint}: {_reason(exc)}")  # down, or no quorum
                continue
            except Etcd3Exception as exc:
                raise EtcdRefused(f"etcd at {member.endpoint} refused: {_reason(exc)}") from None
            except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
                errors.append(f"{member.endpoint}: {_reason(exc)}")  # cut mid-answer, or not etcd
                continue
            self._preferred = index
            return answer
        raise EtcdUnavailable(f"no etcd member answered ({'; '.join(errors)})")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request of etcd's v3 API (``kv/txn``, ``lease/grant`` …); its JSON answer."""

        def send(client: Any) -> dict[str, Any]:
            answer = client.post(client.get_url(path), data=json.dumps(body))
            if not isinstance(answer, dict) or not ("header" in answer or "result" in answer):
                raise ValueError(f"not an etcd answer: {str(answer)[:80]!r}")
            return answer

        return self.call(send)

    def health(self) -> list[dict[str, Any]]:
        """Each member's ``/health``: ``{"endpoint", "healthy", "error"}``."""
        report = []
        for member in self.members:
            client = member.connected()
            try:
                answer = client.session.get(
                    f"{client.base_url}/health", timeout=HEALTH_TIMEOUT_S
                ).json()
                healthy = str(answer.get("health")) == "true"
                error = None if healthy else f"answered {json.dumps(answer)[:80]}"
            except Exception as exc:  # any failure of an endpoint is that endpoint's state
                healthy, error = False, _reason(exc)
            report.append({"endpoint": member.endpoint, "healthy": healthy, "error": error})
        return report

    def close(self) -> None:
        for member in self.members:
            if member.client is not None:
                member.client.session.close()
                member.client = None


def _reason(exc: BaseException) -> str:
    """The first line of an error, short enough for a status line."""
    detail = getattr(exc, "detail_text", None)  # etcd3gw's errors keep their text there
    if isinstance(detail, str) and detail.startswith("{"):
        try:  # etcd's own error: {"error": ..., "message": ..., "code": ...}
            detail = json.loads(detail).get("message") or detail
        except ValueError:
            pass
    text = str(detail if detail else exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    if "Connection refused" in line or "NewConnectionError" in line:
        return "connection refused"
    if "timed out" in line.lower() or "Timeout" in type(exc).__name__:
        return "timed out"
    return line[:120]
