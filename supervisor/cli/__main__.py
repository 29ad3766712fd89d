"""``python -m warren.supervisor.cli``: the ``warren`` command without its script."""

import sys

from .main import main

sys.exit(main())
