"""Who the AMQP port lets in, and over what: the users ``warren users`` keeps (hashed, read
again at each login of a running node), and TLS with the operator's certificate, used by
pika as an application on RabbitMQ would."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from warren.queues.amqp import frames
from warren.queues.amqp.server import check_amqp_address
from warren.queues.amqp.session import Session
from warren.queues.amqp.users import USERS_FILE, Users, hash_password
from warren.supervisor import InvalidSpec, Node

from ...supervisor.node.test_node import warren_node
from ...waiting import wait_for
from .sessions import start_ok

WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def _warren(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*WARREN, *args], input=stdin, capture_output=True, text=True, timeout=60)


def _connect(node: Node, user: str, password: str, **options: object) -> pika.BlockingConnection:
    assert node.amqp_endpoint is not None
    host, port = node.amqp_endpoint.rsplit(":", 1)
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(
        pika.ConnectionParameters(host, int(port), credentials=credentials, **options)
    )


def _refused(node: Node, user: str, password: str) -> bool:
    try:
        _connect(node, user, password).close()
    except pika.exceptions.ProbableAuthenticationError:
        return True
    return False


def test_a_user_added_while_the_node_runs_logs_in_from_the_next_connection(tmp_path):
    data = str(tmp_path / "data")
    with Node(data, amqp="127.0.0.1:0") as node:
        assert _refused(node, "alice", "s3cret")
        added = _warren("users", "add", "alice", "--data-dir", data, stdin="s3cret\n")
        assert added.returncode == 0, added.stderr
        connection = _connect(node, "alice", "s3cret")
        channel = connection.channel()
        channel.queue_declare("alices", durable=True)
        channel.basic_publish("", "alices", b"hello")
        assert channel.basic_get("alices", auto_ack=True)[2] == b"hello"
        connection.close()
        assert _refused(node, "alice", "wrong")
        assert _refused(node, "alice", "wrong")  # remembered as wrong: refused alike
        changed = _warren("users", "password", "alice", "--data-dir", data, stdin="n3w\n")
        assert changed.returncode == 0, changed.stderr
        assert _refused(node, "alice", "s3cret")
        _connect(node, "alice", "n3w").close()
        _connect(node, "guest", "guest").close()  # RabbitMQ's first user stays
        deleted = _warren("users", "delete", "alice", "--data-dir", data)
        assert deleted.returncode == 0, deleted.stderr
        assert _refused(node, "alice", "n3w")


def test_the_users_file_keeps_no_password_and_only_its_owner_reads_it(tmp_path):
    data = str(tmp_path / "data")
    assert _warren("users", "add", "bob", "--data-dir", data, stdin="hunter2\n").returncode == 0
    path = os.path.join(data, USERS_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as file:
        text = file.read()
    assert "hunter2" not in text and "bob scrypt$" in text and "guest scrypt$" in text
    assert _warren("users", "list", "--data-dir", data).stdout.split() == ["bob", "guest"]
    # a node starts on the directory the command made
    with Node(data, amqp="127.0.0.1:0") as node:
        _connect(node, "bob", "hunter2").close()


@pytest.mark.parametrize(
    ("args", "stdin", "says"),
    [
        (("users", "add", "guest"), "x\n", "there is a user 'guest' already"),
        (("users", "add", "carol"), "\n", "a password may not be empty"),
        (("users", "add", "no spaces"), "x\n", "a user's name is"),
        (("users", "delete", "dave"), "", "there is no user 'dave' (known: guest)"),
        (("users", "password", "dave"), "x\n", "there is no user 'dave'"),
    ],
)
def test_a_users_mistake_is_one_line_and_changes_nothing(tmp_path, args, stdin, says):
    data = tmp_path / "data"
    ran = _warren(*args, "--data-dir", str(data), stdin=stdin)
    assert ran.returncode == 2 and says in ran.stderr and "Traceback" not in ran.stderr
    assert not data.exists()  # not even the directory it would have made
    data.mkdir()
    again = _warren(*args, "--data-dir", str(data), stdin=stdin)
    assert again.returncode == 2 and os.listdir(data) == []  # the node may start there


def test_guest_deleted_may_not_log_in_and_a_users_file_that_does_not_read_lets_nobody_in(
    tmp_path,
):
    data = str(tmp_path / "data")
    assert _warren("users", "add", "erin", "--data-dir", data, stdin="pw\n").returncode == 0
    assert _warren("users", "delete", "guest", "--data-dir", data).returncode == 0
    with Node(data, amqp="127.0.0.1:0") as node:
        assert _refused(node, "guest", "guest")
        _connect(node, "erin", "pw").close()
        path = os.path.join(data, USERS_FILE)
        with open(path, "a") as file:
            file.write("this line is not a user\n")
        assert _refused(node, "erin", "pw")
        assert _warren("users", "list", "--data-dir", data).returncode == 2
        with open(path) as file:
            good = [line for line in file if line.startswith("erin ")]
        with open(path, "w") as file:
            file.writelines(good)
        _connect(node, "erin", "pw").close()


def test_a_password_is_checked_with_scrypt_once_and_then_from_memory(tmp_path):
    """The port's thread answers what it remembers; the scrypt check runs elsewhere, and
    only its outcome for the password the file still has is remembered. A rewrite of the
    file that keeps its size and time is seen too."""
    path = tmp_path / USERS_FILE
    path.write_text(f"frank {hash_password('pw')}\n")
    users = Users(tmp_path)
    for password, matches in (("pw", True), ("pW", False)):
        assert users.answer("frank", password) is None  # not known yet: scrypt decides
        check = users.slow_check("frank", password)
        assert check.run() is matches
        users.remember(check, matches)
        assert users.answer("frank", password) is matches
    unknown = users.slow_check("nobody", "pw")
    assert users.answer("nobody", "pw") is None and unknown.run() is False  # a decoy's time
    stale = users.slow_check("frank", "other")
    stat = path.stat()
    path.write_text(f"frank {hash_password('other')}\n")  # as long as the file before
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert users.answer("frank", "pw") is None  # forgotten with the file that changed
    users.remember(stale, False)  # checked against the old hash: not kept
    assert users.answer("frank", "other") is None
    path.unlink()
    assert users.answer("guest", "guest") is True  # the default user, without scrypt
    assert users.answer("guest", "nope") is False and users.answer("frank", "other") is False


def test_a_login_the_port_checks_later_tunes_or_refuses_the_connection_then():
    pending: list[tuple[str, str]] = []

    def later(user: str, password: str) -> None:
        pending.append((user, password))

    for let_in in (True, False):
        session = Session("127.0.0.1", later)
        session.receive(frames.PROTOCOL_HEADER)
        session.take_output()
        session.receive(start_ok("PLAIN", b"\x00erin\x00pw"))
        assert pending.pop() == ("erin", "pw") and session.take_output() == b""
        session.login_checked(let_in)
        said = session.take_output()
        assert (session.user == "erin") is let_in
        assert (b"ACCESS_REFUSED" in said) is not let_in and said
    session.login_checked(True)  # the client went meanwhile: nothing happens
    assert session.user is None


def test_an_encrypted_key_is_refused_in_one_line_and_never_asks_for_its_pass_phrase(
    tmp_path, certificate
):
    cert, key = certificate
    encrypted = str(tmp_path / "encrypted.key")
    subprocess.run(
        ["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", encrypted],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with pytest.raises(InvalidSpec, match="is encrypted: give the key without a pass phrase"):
        Node(tmp_path / "data", amqp="127.0.0.1:0", amqp_certfile=cert, amqp_keyfile=encrypted)
    with pytest.raises(InvalidSpec, match="cannot read"):
        Node(tmp_path / "data", amqp="127.0.0.1:0", amqp_certfile=str(tmp_path), amqp_keyfile=key)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_warren_users_run_as_another_user_than_the_directorys_owner_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 65534, 65534)  # nobody's
    ran = _warren("users", "add", "app", "--data-dir", str(data), stdin="pw\n")
    assert ran.returncode == 2 and "run warren as" in ran.stderr
    assert os.listdir(data) == []


# ----------------------------------------------------------------------------- TLS


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1 and its key, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl (Debian's openssl package) makes the test certificate")
    cert, key = tmp_path / "amqp.pem", tmp_path / "amqp.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


def _tls_options(cert: str) -> dict[str, object]:
    context = ssl.create_default_context(cafile=cert)
    return {"ssl_options": pika.SSLOptions(context, "127.0.0.1")}


def test_a_tls_port_serves_a_client_that_trusts_its_certificate(tmp_path, certificate):
    cert, key = certificate
    with Node(tmp_path / "data", amqp="127.0.0.1:0", amqp_certfile=cert, amqp_keyfile=key) as node:
        host, port = node.amqp_endpoint.rsplit(":", 1)
        stalled = socket.create_connection((host, int(port)))  # never says hello
        plain = socket.create_connection((host, int(port)))
        plain.sendall(b"AMQP\x00\x00\x09\x01")  # AMQP in clear is not TLS: dropped
        plain.settimeout(30)
        try:
            assert plain.recv(100) == b""
        except ConnectionResetError:
            pass  # closed with its hello unread: a reset, as the kernel says it
        connection = _connect(node, "guest", "guest", **_tls_options(cert))
        channel = connection.channel()
        channel.queue_declare("sealed", durable=True)
        channel.confirm_delivery()
        big = os.urandom(3 * 2**20)  # many TLS records, more than one write takes
        channel.basic_publish("", "sealed", big, pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", "sealed", b"small")
        assert channel.basic_get("sealed", auto_ack=True)[2] == big
        assert channel.basic_get("sealed", auto_ack=True)[2] == b"small"
        connection.close()
        stalled.close()
        plain.close()


def test_a_client_that_does_not_trust_the_certificate_is_not_served(tmp_path, certificate):
    cert, key = certificate
    with Node(tmp_path / "data", amqp="127.0.0.1:0", amqp_certfile=cert, amqp_keyfile=key) as node:
        system_trust = pika.SSLOptions(ssl.create_default_context())
        with pytest.raises((pika.exceptions.AMQPConnectionError, ssl.SSLError)):
            _connect(node, "guest", "guest", ssl_options=system_trust)
        _connect(node, "guest", "guest", **_tls_options(cert)).close()


def test_an_address_beyond_loopback_needs_tls_or_insecure(tmp_path, certificate):
    cert, key = certificate
    with pytest.raises(InvalidSpec, match="over TLS"):
        Node(tmp_path / "data", amqp="0.0.0.0:5672")
    assert not (tmp_path / "data").exists()
    from warren.queues.amqp.server import TlsFiles

    assert check_amqp_address("0.0.0.0:5671", tls=TlsFiles(cert, key)) == ("0.0.0.0", 5671)
    assert check_amqp_address("0.0.0.0:5672", insecure=True) == ("0.0.0.0", 5672)


def test_a_certificate_that_does_not_load_is_refused_before_anything_starts(tmp_path, certificate):
    cert, key = certificate
    for certfile, keyfile, says in (
        (str(tmp_path / "missing.pem"), key, "no such file"),
        (key, cert, "not a PEM certificate chain"),
        (cert, None, "both a certificate file and a key file"),
    ):
        with pytest.raises(InvalidSpec, match=says):
            Node(
                tmp_path / "data", amqp="127.0.0.1:0", amqp_certfile=certfile, amqp_keyfile=keyfile
            )
    assert not (tmp_path / "data").exists()
    ran = subprocess.run(
        [*WARREN, "node", "--data-dir", str(tmp_path / "data"), "--amqp", "127.0.0.1:0",
         "--amqp-certfile", str(tmp_path / "missing.pem"), "--amqp-keyfile", key],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2 and "no such file" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_a_node_configured_for_tls_says_so_and_serves_tls(tmp_path, certificate):
    cert, key = certificate
    data = str(tmp_path / "data")
    config = tmp_path / "warren.toml"
    config.write_text(f'[amqp]\nlisten = "127.0.0.1:0"\ncertfile = "{cert}"\nkeyfile = "{key}"\n')
    with warren_node(data, "--config", str(config)) as node:
        assert node.stdout.readline().startswith("node warren")
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        shown = _warren("status", "--data-dir", data).stdout
        status = json.loads(_warren("status", "--data-dir", data, "--json").stdout)
        assert status["amqp_tls"] is True
        assert f"amqp: {status['amqp_endpoint']} over TLS" in shown
        host, port = status["amqp_endpoint"].rsplit(":", 1)
        parameters = pika.ConnectionParameters(host, int(port), **_tls_options(cert))
        pika.BlockingConnection(parameters).close()
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0


def test_a_users_file_the_disk_refuses_is_one_line_and_changes_nothing(tmp_path):
    data = tmp_path / "data"
    (data / USERS_FILE).mkdir(parents=True)  # in the file's place: every write fails
    ran = _warren("users", "add", "gail", "--data-dir", str(data), stdin="pw\n")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "nothing changed" in ran.stderr and os.listdir(data) == [USERS_FILE]
