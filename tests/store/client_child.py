"""A client process for the store-actor tests: reads through its own StoreClient.

python -m tests.store.client_child REF_JSON IDS_FILE SECONDS
    REF_JSON: the store's ActorRef fields; IDS_FILE: lines "id_hex sha_hex".
    Reads every id again and again for SECONDS, then prints "direct fallback wrong".
"""

import hashlib
import json
import sys
import time

from warren.actors import ActorRef
from warren.store.client import StoreClient

if __name__ == "__main__":
    ref = ActorRef(**json.loads(sys.argv[1]))
    expected = [line.split() for line in open(sys.argv[2])]
    client = StoreClient(ref)
    wrong = 0
    deadline = time.monotonic() + float(sys.argv[3])
    print("started", flush=True)
    while time.monotonic() < deadline:
        for id_hex, sha in expected:
            body = client.read(bytes.fromhex(id_hex))
            if body is None or hashlib.sha256(body).hexdigest() != sha:
                wrong += 1
    print(client.direct_reads, client.fallback_reads, wrong, flush=True)
    client.terminate()
