"""The MCP front door (Streamable HTTP at ``/mcp``) and the stdio bridge (``sandboxd mcp``):
another door to the same service, never a second code path (see :mod:`.server`)."""
