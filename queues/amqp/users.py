"""The AMQP port's users: names and hashed passwords in the node's data directory.

File ``amqp_users`` (mode 0600), one user a line, ``#`` starting a comment::

    NAME scrypt$LOG2_N$R$P$SALT$HASH        (salt and hash in base64)

A data directory without the file has one user, ``guest`` with password ``guest``, as a
RabbitMQ node has at its first start; ``warren users add`` writes the file with guest's
line in it, and ``warren users delete guest`` takes it out. ``guest`` may log in from
loopback only wherever it is defined (the session checks that).

Passwords are hashed with scrypt (2**14, 8, 1: some 16 MiB and tens of milliseconds a
check, so a stolen file is slow to guess from). The port (``Users``) reads the file again
whenever it changes (its inode, size or mtime), so a user added or deleted counts from
the next login, and remembers the last password that checked out for each user as an
HMAC under a key of its process's own, so that a client reconnecting costs no scrypt; and,
the same way, the last wrong passwords tried for each user, so that a client retrying a
stale password (a worker restarting in a loop) costs one scrypt, not one a login.

Races: the file is written to a temporary name and renamed, so the port reads the old
file or the new one; changes go under an exclusive ``flock`` of ``amqp_users.lock`` so two
``warren users`` at once lose neither change.
"""

from __future__ import annotations

import base64
import collections
import fcntl
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..durable_files import write_atomically

log = logging.getLogger("warren.amqp")

__all__ = [
    "USERS_FILE",
    "UsersFileError",
    "Users",
    "add_user",
    "delete_user",
    "hash_password",
    "list_users",
    "set_password",
]

USERS_FILE = "amqp_users"
LOCK_SUFFIX = ".lock"
DEFAULT_USERS = {"guest": "guest"}  # a node without the file: RabbitMQ's first user
SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P = 14, 8, 1
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_MAXMEM = 64 * 2**20
MAX_PASSWORD_BYTES = 1024
WRONG_PASSWORDS_KEPT = 16  # a user's last wrong passwords remembered (as HMACs)
_NAME = re.compile(r"^[A-Za-z0-9_.@+-][A-Za-z0-9_.@+=-]{0,127}$")


class UsersFileError(ValueError):
    """A users file that does not read, a name or password refused, a user missing or
    already there: the message says which."""


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``password`` as the users file keeps it: ``scrypt$14$8$1$SALT$HASH``."""
    check_password(password)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _scrypt(password, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    return "$".join(
        (
            "scrypt",
            str(SCRYPT_LOG2_N),
            str(SCRYPT_R),
            str(SCRYPT_P),
            base64.b64encode(salt).decode(),
            base64.b64encode(digest).decode(),
        )
    )


def password_matches(password: str, hashed: str) -> bool:
    """Whether ``password`` is the one ``hashed`` (``hash_password``'s form) was made of."""
    try:
        kind, log2_n, r, p, salt, digest = hashed.split("$")
        if kind != "scrypt":
            return False
        expected = base64.b64decode(digest, validate=True)
        got = _scrypt(password, base64.b64decode(salt, validate=True), int(log2_n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(got, expected)


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(),
        salt=salt,
        n=2**log2_n,
        r=r,
        p=p,
        maxmem=SCRYPT_MAXMEM,
        dklen=HASH_BYTES,
    )


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise UsersFileError(
            f"a user's name is 1 to 128 letters, digits and _ . @ + = - "
            f"(not starting with =), got {name!r}"
        )


def check_password(password: str) -> None:
    if not password:
        raise UsersFileError("a password may not be empty")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise UsersFileError(f"a password is at most {MAX_PASSWORD_BYTES} bytes")
    if any(c in password for c in "\n\r\x00"):
        raise UsersFileError("a password may not hold a line break or a NUL")


def read_users(data_dir: str | os.PathLike) -> dict[str, str] | None:
    """Each user's hashed password, from the file; None if there is no file."""
    path = os.path.join(os.fspath(data_dir), USERS_FILE)
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise UsersFileError(f"{path} is not text") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not _NAME.match(fields[0]) or not fields[1].startswith("scrypt$"):
            raise UsersFileError(f"{path}:{number}: not a line 'NAME scrypt$...'")
        users[fields[0]] = fields[1]
    return users


def list_users(data_dir: str | os.PathLike) -> list[str]:
    """The names of the users who may log in, sorted."""
    users = read_users(data_dir)
    return sorted(DEFAULT_USERS if users is None else users)


def add_user(data_dir: str | os.PathLike, name: str, password: str) -> None:
    """Add ``name``; ``UsersFileError`` if there is one already."""
    check_name(name)
    hashed = hash_password(password)

    def change(users: dict[str, str]) -> None:
        if name in users:
            raise UsersFileError(f"there is a user {name!r} already (warren users password)")
        users[name] = hashed

    _change(data_dir, change)


def set_password(data_dir: str | os.PathLike, name: str, password: str) -> None:
    """Give ``name`` a new password; ``UsersFileError`` if there is no such user."""
    hashed = hash_password(password)

    def change(users: dict[str, str]) -> None:
        _must_have(users, name)
        users[name] = hashed

    _change(data_dir, change)


def delete_user(data_dir: str | os.PathLike, name: str) -> None:
    """Take ``name`` out; ``UsersFileError`` if there is no such user."""

    def change(users: dict[str, str]) -> None:
        _must_have(users, name)
        del users[name]

    _change(data_dir, change)


def _must_have(users: dict[str, str], name: str) -> None:
    if name not in users:
        raise UsersFileError(f"there is no user {name!r} (known: {', '.join(sorted(users))})")


def _change(data_dir: str | os.PathLike, change: Callable[[dict[str, str]], None]) -> None:
    """Apply ``change`` to the users and write them, under the file's lock."""
    directory = os.fspath(data_dir)
    with _locked(directory):
        users = read_users(directory)
        if users is None:
            users = {name: hash_password(pw) for name, pw in DEFAULT_USERS.items()}
        change(users)
        lines = ["# warren's AMQP users: NAME HASHED-PASSWORD (warren users ...)"]
        lines += [f"{name} {hashed}" for name, hashed in sorted(users.items())]
        data = "".join(f"{line}\n" for line in lines).encode()
        write_atomically(os.path.join(directory, USERS_FILE), data, mode=0o600)


@contextmanager
def _locked(directory: str) -> Iterator[None]:
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, USERS_FILE + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Users:
    """The port's view of the users file: ``check(name, password)``, reading the file
    again whenever it changed (see the module docstring)."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.path = os.path.join(os.fspath(data_dir), USERS_FILE)
        self._data_dir = os.fspath(data_dir)
        self._seen: tuple[int, int, int] | None = None  # inode, size, mtime of the file read
        self._hashed: dict[str, str] = {}
        self._remembered: dict[str, bytes] = {}  # name -> HMAC of its last good password
        self._wrong: dict[str, collections.deque[bytes]] = {}  # name -> HMACs of wrong ones
        self._key = os.urandom(32)

    def check(self, name: str, password: str) -> bool:
        """Whether ``name`` may log in with ``password`` (a users file that does not read
        lets nobody in, and the log says why, once a change of the file)."""
        self._reload()
        hashed = self._hashed.get(name)
        if hashed is None:
            return False
        mac = hmac.digest(self._key, password.encode(), "sha256")
        remembered = self._remembered.get(name)
        if remembered is not None and hmac.compare_digest(mac, remembered):
            return True
        wrong = self._wrong.setdefault(name, collections.deque(maxlen=WRONG_PASSWORDS_KEPT))
        if mac in wrong:
            return False
        if not password_matches(password, hashed):
            wrong.append(mac)
            return False
        self._remembered[name] = mac
        return True

    def _reload(self) -> None:
        try:
            stat = os.stat(self.path)
            seen: tuple[int, int, int] | None = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            seen = None
        if seen == self._seen and (seen is not None or self._hashed):
            return
        self._hashed, self._remembered, self._wrong, self._seen = {}, {}, {}, seen
        try:
            users = read_users(self._data_dir)
        except (OSError, UsersFileError) as exc:
            log.warning("amqp: nobody may log in until the users file reads: %s", exc)
            return
        if users is None:
            users = {name: hash_password(pw) for name, pw in DEFAULT_USERS.items()}
        self._hashed = users
