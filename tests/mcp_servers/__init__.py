"""Small MCP servers of our own for the connection-manager tests (``tests/test_mcp_manager.py``).

Each is a script run as its own process, over stdio unless said otherwise:

- ``normal.py``: echo (text back byte-identical), a failing tool, a tool list that grows
  (with ``notifications/tools/list_changed``), a resource and a prompt; ``--http PORT``
  serves it over streamable HTTP instead.
- ``crashy.py``: a tool that kills the server mid-call (``os._exit``).
- ``hang.py``: a tool that blocks the server's whole event loop forever.
- ``slow_start.py``: sleeps ``argv[1]`` seconds before it serves (a slow start).
- ``stubborn.py``: ignores SIGTERM and spawns a grandchild that ignores it too.
- ``owner.py``: a process that owns an ``McpManager`` (killed with SIGKILL by a test).
- ``misbehave.py``: misbehaves as public bug reports describe (a call that never ends,
  HTTP 4xx answers with a body, a list cursor that never advances), for
  ``tests/test_mcp_failures.py``.
- ``outputs.py``: answers off the tool's listed output schema (text only, or structured
  content that does not match) and a tool that kills the server on its first call, each
  run counted in a file, for ``tests/test_mcp_outputs.py``.
"""
