"""The AMQP port's users: names and hashed passwords in the node's data directory.

File ``amqp_users`` (mode 0600), one user a line, ``#`` starting a comment::

    NAME scrypt$LOG2_N$R$P$SALT$HASH        (salt and hash in base64)

A data directory without the file has one user, ``guest`` with password ``guest``, as a
RabbitMQ node has at its first start; ``warren users add`` writes the file with guest's
line in it, and ``warren users delete guest`` takes it out. ``guest`` may log in from
loopback only wherever it is defined (the session checks that).

Passwords are hashed with scrypt (2**14, 8, 1: some 16 MiB and tens of milliseconds a
check, so a stolen file is slow to guess from). The port (``Users``) reads the file at
each login and parses it again when its bytes changed, so a user added or deleted counts
from the next login. It remembers the last password that checked out for each user, and
the last wrong ones, as HMACs under a key of its process's own, so that a client
reconnecting, or retrying a stale password in a loop (a worker restarting), costs no
scrypt; the scrypt checks left (``SlowCheck``) run off the thread that serves clients,
and a name the file does not have is checked against a decoy, so that a login's time
does not tell which names exist.

Races: the file is written to a temporary name and renamed, so the port reads the old
file or the new one; changes go under an exclusive ``flock`` of the data directory, so
two ``warren users`` at once lose neither change. A change refused (a name taken or
unknown) leaves nothing behind, not even a data directory it would have made.
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
from ..errors import UsersFileError

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
DEFAULT_USERS = {"guest": "guest"}  # a node without the file: RabbitMQ's first user
SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P = 14, 8, 1
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_MAXMEM = 64 * 2**20
MAX_PASSWORD_BYTES = 1024
WRONG_PASSWORDS_KEPT = 16  # a user's last wrong passwords remembered (as HMACs)
# What a password is checked against for a user the file does not have: no password
# matches 32 zero bytes of scrypt (the salt is any).
_DECOY = f"scrypt${SCRYPT_LOG2_N}${SCRYPT_R}${SCRYPT_P}${'A' * 22}==${'A' * 43}="
_NAME = re.compile(r"^[A-Za-z0-9_.@+-][A-Za-z0-9_.@+=-]{0,127}$")


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
        with open(path, "rb") as file:
            return parse_users(file.read(), path)
    except FileNotFoundError:
        return None


def parse_users(data: bytes, path: str) -> dict[str, str]:
    """Each user's hashed password in ``data``, the text of the users file ``path``."""
    try:
        text = data.decode()
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
    """Apply ``change`` to the users and write them, under the data directory's lock. A
    change refused (``UsersFileError``) leaves everything as it was: a data directory
    that does not exist yet is made only for a change that goes through."""
    directory = os.fspath(data_dir)
    if not os.path.isdir(directory):
        change(dict.fromkeys(DEFAULT_USERS, ""))  # refused here, before anything is made
        os.makedirs(directory, exist_ok=True)
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
    """An exclusive flock of the directory itself (a lock file would be one more file
    in a data directory that may hold nothing else yet)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class SlowCheck:
    """A password to check against a user's hash (scrypt: run it on any thread but the
    one serving clients): ``run()`` says whether it matches. A user the file does not
    have is checked against a decoy all the same, so that the time taken does not tell
    which names exist."""

    def __init__(self, name: str, password: str, hashed: str | None) -> None:
        self.name, self.password, self.hashed = name, password, hashed

    def run(self) -> bool:
        matches = password_matches(self.password, self.hashed or _DECOY)
        return matches and self.hashed is not None


class Users:
    """The port's view of the users file (see the module docstring): ``answer`` says at
    once whether a login goes through when it can (a password remembered, the default
    users, a file that does not read), else leaves a ``SlowCheck`` to run elsewhere and
    ``remember`` its outcome. Used by one thread (but ``SlowCheck.run``)."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        self.path = os.path.join(os.fspath(data_dir), USERS_FILE)
        self._read: bytes | None = None  # the file as last read (None: there was none)
        self._hashed: dict[str, str] | None = None  # None: no file, the default users
        self._unreadable = False  # the file as last read does not parse: nobody logs in
        self._remembered: dict[str, bytes] = {}  # name -> HMAC of its last good password
        self._wrong: dict[str, collections.deque[bytes]] = {}  # name -> HMACs of wrong ones
        self._key = os.urandom(32)

    def answer(self, name: str, password: str) -> bool | None:
        """Whether ``name`` may log in with ``password``, when that needs no scrypt; None:
        ``slow_check`` tells."""
        self._reload()
        if self._unreadable:
            return False
        if self._hashed is None:
            expected = DEFAULT_USERS.get(name)
            return expected is not None and hmac.compare_digest(
                password.encode(), expected.encode()
            )
        if name not in self._hashed:
            return None  # the decoy's time, as a known user's
        mac = self._mac(password)
        remembered = self._remembered.get(name)
        if remembered is not None and hmac.compare_digest(mac, remembered):
            return True
        if mac in self._wrong.get(name, ()):
            return False
        return None

    def slow_check(self, name: str, password: str) -> SlowCheck:
        """The check ``answer`` left to do."""
        return SlowCheck(name, password, (self._hashed or {}).get(name))

    def remember(self, check: SlowCheck, matched: bool) -> None:
        """Keep the outcome of ``check`` for the next login, unless the user's password
        changed meanwhile."""
        if check.hashed is None or (self._hashed or {}).get(check.name) != check.hashed:
            return
        mac = self._mac(check.password)
        if matched:
            self._remembered[check.name] = mac
        else:
            wrong = self._wrong.setdefault(
                check.name, collections.deque(maxlen=WRONG_PASSWORDS_KEPT)
            )
            wrong.append(mac)

    def _mac(self, password: str) -> bytes:
        return hmac.digest(self._key, password.encode(), "sha256")

    def _reload(self) -> None:
        """Read the file; parse it again if its bytes changed (it is small: comparing
        them misses no change, as a size and a time could)."""
        try:
            with open(self.path, "rb") as file:
                data: bytes | None = file.read()
        except FileNotFoundError:
            data = None
        except OSError as exc:
            if not self._unreadable:
                log.warning("amqp: nobody may log in until the users file reads: %s", exc)
            self._unreadable, self._read = True, None
            return
        if data == self._read and not (self._unreadable and data is None):
            return
        self._read, self._remembered, self._wrong = data, {}, {}
        try:
            self._hashed = None if data is None else parse_users(data, self.path)
            self._unreadable = False
        except UsersFileError as exc:
            log.warning("amqp: nobody may log in until the users file reads: %s", exc)
            self._unreadable = True
