"""An AMQP client of any node of a cluster reaches the leader: a follower's AMQP port
forwards its clients to the leader's (pika, unmodified), and once the leader's machine
is lost, the client connecting again to the same address reaches the new leader, which
holds every message confirmed before."""

import socket
import threading

import pika
import pika.exceptions

from warren.supervisor.cluster.tcp_proxy import TcpProxy
from warren.supervisor.node.node import amqp_reached_at

from ...queues.client.node_process import NodeProcess, free_port
from ...waiting import wait_for
from .test_cluster_nodes import ALL_THREE, agreed_leader, cluster_node, cluster_status, lose_machine


def amqp_port(node: NodeProcess) -> int:
    return int(node.options[node.options.index("--amqp") + 1].rpartition(":")[2])


def opened_at(port: int, into: list) -> bool:
    """Whether an AMQP connection to ``port`` opened (appended to ``into``)."""
    parameters = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    try:
        into.append(pika.BlockingConnection(parameters))
    except pika.exceptions.AMQPConnectionError:
        return False  # no port yet, or no leader known to forward to
    return True


def test_an_amqp_client_of_a_follower_reaches_the_leader_and_follows_a_failover(etcd, tmp_path):
    nodes: list[NodeProcess] = []
    connections: list[pika.BlockingConnection] = []
    try:
        for index in range(3):
            amqp = ("--amqp", f"127.0.0.1:{free_port()}")
            nodes.append(cluster_node(etcd, tmp_path, "amqp", index, ttl_s=5, extra=amqp))
        wait_for(lambda: agreed_leader(nodes), timeout=60)
        leader, epoch = agreed_leader(nodes)
        wait_for(lambda: all(cluster_status(n)["isr"] == ALL_THREE for n in nodes), timeout=60)
        first = nodes[int(leader[-1])]
        follower = next(node for node in nodes if node is not first)
        wait_for(lambda: opened_at(amqp_port(follower), connections), timeout=60)
        channel = connections[-1].channel()
        channel.confirm_delivery()  # each publish below waits for its confirm
        channel.queue_declare("orders", durable=True)
        orders = [b"order %d" % n for n in range(20)]
        for order in orders:
            channel.basic_publish("", "orders", order, pika.BasicProperties(delivery_mode=2))
        assert cluster_status(follower)["role"] == "follower"  # it forwarded all of that
        connections.pop().close()

        lose_machine(first)
        others = [node for node in nodes if node is not first]
        wait_for(lambda: (agreed := agreed_leader(others)) and agreed[1] > epoch, timeout=60)
        # the same address again: the follower leads now, or forwards to the one that does
        wait_for(lambda: opened_at(amqp_port(follower), connections), timeout=60)
        channel = connections[-1].channel()
        got = []
        while (answer := channel.basic_get("orders", auto_ack=True))[0] is not None:
            got.append(answer[2])
        assert got == orders
    finally:
        for connection in connections:
            if connection.is_open:
                connection.close()
        for node in nodes:
            node.stop()


def test_a_leader_tells_an_amqp_address_its_followers_reach_or_none():
    assert amqp_reached_at(("127.0.0.1", 5672), "tcp://127.0.0.1:7000") == "127.0.0.1:5672"
    assert amqp_reached_at(("0.0.0.0", 5672), "tcp://10.0.0.1:7000") == "10.0.0.1:5672"
    assert amqp_reached_at(("::", 5672), "tcp://[fd00::1]:7000") == "[fd00::1]:5672"
    # on loopback, while the peers are on other machines: no follower can reach it
    assert amqp_reached_at(("127.0.0.1", 5672), "tcp://10.0.0.1:7000") is None


def test_a_proxy_told_to_forward_to_itself_drops_the_client_instead_of_looping():
    port = free_port()
    proxy = TcpProxy(("127.0.0.1", port), "itself", listen=("127.0.0.1", port))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            assert client.recv(1) == b""  # closed: no chain of connections to itself
        # a loop would keep opening connections, each with its threads; here all but the
        # listener's end (other tests' threads in this process are not counted)
        wait_for(lambda: proxy_threads("itself") == 1, timeout=30)
    finally:
        proxy.close()


def proxy_threads(name: str) -> int:
    return sum(thread.name == f"proxy {name}" for thread in threading.enumerate())
