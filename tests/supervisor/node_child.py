"""A process running a Warren node with two application actors, for the tests that kill
the node's process itself.

    python -m tests.supervisor.node_child DATA_DIR
        prints the pids of the node's actors and forkserver on one line, then waits.
"""

import sys
import time

from warren.supervisor import ChildSpec, Node

from tests.supervisor.sample_actors import Worker

if __name__ == "__main__":
    node = Node(sys.argv[1], children=(ChildSpec("one", Worker), ChildSpec("two", Worker)))
    print(*node._pids()[1:], flush=True)
    while True:
        time.sleep(60)
