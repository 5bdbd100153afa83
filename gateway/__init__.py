"""vSphere MCP Gateway: one guarded MCP endpoint for many vSphere environments."""

__version__ = "0.1.0"
