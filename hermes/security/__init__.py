"""Security: who may do what, and what stays secret.

Encryption at rest of Temporal payloads and Redis copies, the key rings that hold its keys
and the command keys, the proof each command carries of who sent it, secrets kept out of
log lines, the edge both HTTP servers share (bearer tokens, security headers, read
deadlines), and the codec server that shows the Web UI the messages behind content
references. The modules are imported by name (``from hermes.security import encryption``),
this package re-exports nothing.
"""
