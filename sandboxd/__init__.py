"""sandboxd: a hardened sandboxed execution service for AI-agent tools.

Kept import-light on purpose: ``import sandboxd.client`` must not pull in the server stack.
"""

__version__ = "0.1.0"
