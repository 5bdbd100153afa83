"""The MCP tool surface: a table of ``ToolSpec`` values with thin handlers."""
