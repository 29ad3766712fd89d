"""CURVE keys for remote clients: the node's key pair, the clients it lets in, and the
key files clients connect with.

In the node's data directory:

- ``node.key_secret``: the node's key pair (mode 0600), created at the first start that
  listens; ``node.key`` holds its public key alone.
- ``authorized_keys``: one client a line, ``<public key, Z85> <name>``; ``#`` starts a
  comment. The listener reads it again whenever it changes, so a key added (or a line
  removed) takes effect at the client's next connection.

A client's key file (``warren keys --data-dir D NAME`` writes ``NAME.key``, mode 0600) is
in ZeroMQ's certificate format: its ``curve`` section holds the client's public and
secret keys, its ``metadata`` section the node's public key (``server-key``) and the
client's name. It is a secret: whoever holds it is that client.

Races: every file is written to a temporary name and renamed, so a reader sees the old
file or the new one; ``authorized_keys`` is appended under an exclusive ``flock`` so two
``warren keys`` at once lose neither line.
"""

from __future__ import annotations

import fcntl
import os
import re
import time

import zmq
from zmq.utils import z85

from ..errors import KeyFileError

__all__ = [
    "AUTHORIZED_FILE",
    "ClientKey",
    "KeyFileError",
    "authorized_keys",
    "create_client_key",
    "load_client_key",
    "node_keys",
    "parse_client_key",
]

NODE_SECRET_FILE = "node.key_secret"
NODE_PUBLIC_FILE = "node.key"
AUTHORIZED_FILE = "authorized_keys"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FIELD = re.compile(r'^\s*([a-z-]+)\s*=\s*"([^"]*)"\s*$')


class ClientKey:
    """A client's key pair and the node's public key (Z85, bytes), as a socket takes them."""

    def __init__(self, public: bytes, secret: bytes, server: bytes, name: str = "") -> None:
        self.public, self.secret, self.server, self.name = public, secret, server, name

    def apply(self, socket: zmq.Socket) -> None:
        """Make ``socket`` a CURVE client of the node."""
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        socket.curve_serverkey = self.server


def _certificate(
    comment: str, metadata: dict[str, str], public: bytes, secret: bytes | None
) -> bytes:
    lines = [f"#   {comment}", "", "metadata"]
    lines += [f'    {key} = "{value}"' for key, value in metadata.items()]
    lines += ["curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _read_certificate(path: str) -> dict[str, str]:
    """Every ``key = "value"`` line of a certificate file, sections flattened."""
    try:
        with open(path, "rb") as file:
            return _certificate_fields(file.read(), path)
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.strerror}") from None


def _certificate_fields(text: bytes | str, where: str) -> dict[str, str]:
    """Every ``key = "value"`` line of a certificate's text, sections flattened."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise KeyFileError(
                f"{where} is not a Warren client key file: it is not text (make one with "
                f"`warren keys --data-dir D NAME`)"
            ) from None
    fields = {}
    for line in text.splitlines():
        match = _FIELD.match(line)
        if match:
            fields[match.group(1)] = match.group(2)
    return fields


def _valid_key(value: str | None) -> bool:
    """Whether ``value`` is a CURVE key in Z85 (40 characters for 32 bytes)."""
    try:
        return value is not None and len(value) == 40 and len(z85.decode(value)) == 32
    except (ValueError, KeyError, TypeError):
        return False


def node_keys(data_dir: str | os.PathLike) -> tuple[bytes, bytes]:
    """The node's (public, secret) keys, created on first use."""
    from ..durable_files import write_atomically  # a node's or the CLI's: not a client's

    path = os.path.join(os.fspath(data_dir), NODE_SECRET_FILE)
    if not os.path.exists(path):
        public, secret = zmq.curve_keypair()
        write_atomically(
            path,
            _certificate("Warren node key pair: keep it secret", {"name": "node"}, public, secret),
            0o600,
        )
        write_atomically(
            os.path.join(os.fspath(data_dir), NODE_PUBLIC_FILE),
            _certificate("Warren node public key", {"name": "node"}, public, None),
        )
    fields = _read_certificate(path)
    if not (_valid_key(fields.get("public-key")) and _valid_key(fields.get("secret-key"))):
        raise KeyFileError(
            f"{path} holds no CURVE key pair; remove it to have a new one made "
            f"(every client key must then be made again)"
        )
    return fields["public-key"].encode(), fields["secret-key"].encode()


def authorized_keys(data_dir: str | os.PathLike) -> dict[bytes, str]:
    """The clients let in: public key (Z85) -> name."""
    try:
        with open(os.path.join(os.fspath(data_dir), AUTHORIZED_FILE), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return {}
    keys = {}
    for line in lines:
        words = line.split()
        if words and not words[0].startswith("#") and _valid_key(words[0]):
            keys[words[0].encode()] = words[1] if len(words) > 1 else ""
    return keys


def create_client_key(
    data_dir: str | os.PathLike, name: str, out_dir: str | os.PathLike = "."
) -> str:
    """Make ``NAME.key`` in ``out_dir`` and let its public key in; its path."""
    from ..durable_files import write_atomically  # a node's or the CLI's: not a client's

    if not isinstance(name, str) or not _NAME.match(name):
        raise KeyFileError(
            f"a key name is 1 to 64 letters, digits, '_', '.' or '-', starting "
            f"with a letter or digit; got {name!r}"
        )
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise KeyFileError(f"{data_dir} is not a directory; name the node's data directory")
    if not os.path.isdir(out_dir):
        raise KeyFileError(
            f"{os.fspath(out_dir)} is not a directory; make it first, or give another"
        )
    path = os.path.join(os.fspath(out_dir), f"{name}.key")
    if os.path.exists(path):
        raise KeyFileError(
            f"{path} exists; remove it first (and its line in "
            f"{os.path.join(data_dir, AUTHORIZED_FILE)}) to make a new one"
        )
    server, _ = node_keys(data_dir)
    public, secret = zmq.curve_keypair()
    write_atomically(
        path,
        _certificate(
            "Warren client key: whoever holds this file is this client",
            {
                "name": name,
                "server-key": server.decode(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            public,
            secret,
        ),
        0o600,
    )
    fd = os.open(
        os.path.join(data_dir, AUTHORIZED_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{public.decode()} {name}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_client_key(path: str | os.PathLike) -> ClientKey:
    """A client key file, checked; ``KeyFileError`` says what is wrong with it."""
    path = os.fspath(path)
    return _client_key(_read_certificate(path), path)


def parse_client_key(text: bytes | str, where: str) -> ClientKey:
    """The client key in ``text``, a key file's content (what ``warren keys`` wrote), for
    a program that cannot place the file itself (a Spark executor); ``where`` names it
    in the ``KeyFileError`` that says what is wrong with it."""
    return _client_key(_certificate_fields(text, where), where)


def _client_key(fields: dict[str, str], where: str) -> ClientKey:
    for field in ("public-key", "secret-key", "server-key"):
        if not _valid_key(fields.get(field)):
            raise KeyFileError(
                f"{where} is not a Warren client key file: its {field} is "
                f"missing or malformed (make one with `warren keys --data-dir D "
                f"NAME`)"
            )
    return ClientKey(
        fields["public-key"].encode(),
        fields["secret-key"].encode(),
        fields["server-key"].encode(),
        fields.get("name", ""),
    )
