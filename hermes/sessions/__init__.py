"""Sessions seen from outside the workflow: what clients and commands do with them.

A session's config checked where it is started, the Redis session index and its rebuild,
deciding a pending approval, and following a running turn for a view (``hermes chat``,
``hermes send``). The session workflow itself is ``workflows/session/``. The modules are
imported by name (``from hermes.sessions.approvals import decide``), this package
re-exports nothing.
"""
