"""Long-term memory (DESIGN.md "Memory"; issue 6).

- :mod:`hermes.memory.models`: the payloads (sandbox-safe: pydantic only).
- :mod:`hermes.memory.rules`: rule-based extraction and write triggers (sandbox-safe).
- :mod:`hermes.memory.embeddings`: offline and OpenAI-compatible embedders.
- :mod:`hermes.memory.store`: the LanceDB store (write path, read path, consolidation), a
  facade over one module per concern (listed in its docstring).

This package imports nothing heavy itself: workflows import its models and rules only.
"""
