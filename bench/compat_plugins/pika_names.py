"""A pytest plugin for pika's acceptance tests, loaded with ``-p pika_names`` by the compat
runner (``bench/compat.py``) in the clients' virtualenv, never by Warren's own tests.

The tests were exported from a pika commit newer than the release installed (1.4.4): that
commit renamed the module of small helpers (``time_now``, ``as_bytes``, ``ON_WINDOWS`` ...)
from ``pika.compat`` to ``pika._utils``. The release's module answers to the new name
here, so the tests of the broker can run against the released client."""

import sys

import pika
import pika.compat

sys.modules.setdefault("pika._utils", pika.compat)
if not hasattr(pika, "_utils"):
    pika._utils = pika.compat  # the tests also reach it as an attribute of ``pika``
