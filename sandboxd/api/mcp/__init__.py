"""The MCP front door (Streamable HTTP at ``/mcp``): another door to the same service, never a
second code path (see :mod:`.server`). The stdio bridge is :mod:`sandboxd.cli.mcp_bridge`."""
