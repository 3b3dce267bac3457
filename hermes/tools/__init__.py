"""The tool layer: registration, validation, built-in tools."""

from hermes.tools.registry import Tool, ToolContext, ToolRegistry, default_registry, tool

__all__ = ["Tool", "ToolContext", "ToolRegistry", "default_registry", "tool"]
