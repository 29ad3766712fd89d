"""Supervision trees, resource alarms and the node; also the ``warren`` command line."""
