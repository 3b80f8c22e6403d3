"""sandboxd: a hardened sandboxed execution service for AI-agent tools.

Kept import-light on purpose: ``import sandboxd.client`` must not pull in the server stack.
"""

__version__ = "0.1.0"
#: where a client (the client package, the CLI, the stdio MCP bridge) finds a local daemon
DEFAULT_URL = "http://127.0.0.1:8765"
