"""A reference-count source for the node tests: the ids listed in a file, one reference
each (what a walker over queue indexes would yield)."""

import os


def listed_ids():
    with open(os.environ["WARREN_TEST_REF_COUNTS"]) as f:
        return [(bytes.fromhex(line.strip()), 1) for line in f if line.strip()]
