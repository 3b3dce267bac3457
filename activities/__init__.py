"""Activities: the only code of a session that touches the outside world.

They connect to nothing at import time; the worker builds them with their clients.
"""
