"""sandboxd: a hardened sandboxed execution service for AI-agent tools.

Kept import-light on purpose: ``import sandboxd.client`` must not pull in the server stack, and
the mount helper imports this package with nothing else on its path (no site-packages).
"""

__version__ = "0.1.0"


def __getattr__(name: str) -> str:
    """``DEFAULT_URL``, where a client finds a local daemon: the thin client's (its one
    definition, :data:`sandboxd_client.DEFAULT_URL`), imported only when asked for."""
    if name == "DEFAULT_URL":
        from sandboxd_client import DEFAULT_URL

        return DEFAULT_URL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
