"""The thin client under its older name: everything :mod:`sandboxd_client` exports (the client
is a distribution of its own, ``client/``; the daemon's wheel carries it too)."""

from sandboxd_client import *  # noqa: F403
from sandboxd_client import __all__ as __all__
