"""``python -m warren.supervisor.cli``: the ``warren`` command without its script.

A node's forkserver imports the main script by its path, as ``__mp_main__`` and outside
its package (so actor classes defined there unpickle): the guard keeps it from running the
command a second time there, and the relative import from failing.
"""

import sys

if __name__ == "__main__":
    from .main import main

    sys.exit(main())
