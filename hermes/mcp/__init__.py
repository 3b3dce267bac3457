"""MCP servers as a source of tools: configuration (:mod:`hermes.mcp.config`), connections, discovery and calls."""
