"""Warren's version, written once: ``warren.__version__``, ``warren --version``, the node's
``/api/overview`` and the distribution's metadata (``setup.py`` reads this file as text,
since nothing of Warren is importable while it is being installed) all take it from here."""

__version__ = "0.1.0"
