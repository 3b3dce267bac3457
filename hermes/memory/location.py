"""Where memories live, and whether every worker sees the same ones (issue 28, item 1).

The memory store at ``HERMES_MEMORY_URI`` (long-term memories and the durable store beside
them: notes, content kept by reference, transcript archive, snapshots, approval audit) must
be one store for every worker of a Temporal namespace: a session's turns run on any worker.
A local path is one only if every worker mounts the same one (a network filesystem) or if
there is one worker. Before this check, workers on several machines with the default
``.hermes/memory`` each kept their own: a memory written on one worker was not found on the
next, and nothing said so.

A worker connected to a Temporal elsewhere (:func:`temporal_is_remote`) with a local path
therefore refuses to start unless ``HERMES_MEMORY_STORE_SCOPE`` says ``shared`` (every
worker mounts it) or ``local`` (deliberately this machine's alone).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hermes.errors import ConfigError
from hermes.settings import Settings

__all__ = ["MemoryLocation", "check_memory_location", "memory_location", "temporal_is_remote"]

SCOPE_SETTING = "HERMES_MEMORY_STORE_SCOPE"


def _host(address: str) -> str:
    """The host of a ``host:port`` (``[v6]:port`` too)."""
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    if address.count(":") > 1:  # a bare IPv6 address
        return address
    return address.rsplit(":", 1)[0]


def temporal_is_remote(settings: Settings) -> bool:
    """Whether the worker's Temporal may serve workers on other machines: an address that
    is not this machine's loopback (``localhost``, ``127.0.0.0/8``, ``::1``), or TLS or an
    API key (a loopback address behind TLS is a tunnel or a proxy to a shared server).

    Args:
        settings: ``temporal_address`` (unset: the embedded server, local) and the TLS
            settings.
    """
    from hermes.infra.connections import temporal_tls_requested

    if settings.temporal_address is None:
        return False
    if temporal_tls_requested(settings):
        return True
    host = _host(settings.temporal_address.strip()).lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: another machine, as far as one can tell without resolving it


@dataclass(frozen=True)
class MemoryLocation:
    """Where the memory store is, as a worker and ``hermes doctor`` report it."""

    uri: str
    """The store's URI: an absolute path for a local one, else as configured (``s3://...``)."""
    local: bool
    """A path on this machine's filesystem (not an object store or a LanceDB server)."""
    scope: str | None
    """``shared``, ``local`` or None (``HERMES_MEMORY_STORE_SCOPE`` unset)."""

    def describe(self) -> str:
        """One line: the URI, what kind of place it is and who shares it; no credentials."""
        # Credentials before '@' and query values masked (a URI may carry a key there).
        shown = re.sub(r"([?&][^=&#]*)=[^&#]*", r"\1=***", re.sub(r"://[^@/]*@", "://***@", self.uri))
        if not self.local:
            return f"{shown} (object store: one for every worker)"
        if self.scope == "shared":
            return f"{shown} (local path, shared: every worker mounts it, {SCOPE_SETTING}=shared)"
        if self.scope == "local":
            return f"{shown} (local path, this machine's alone, {SCOPE_SETTING}=local)"
        return f"{shown} (local path on this machine)"


def memory_location(settings: Settings) -> MemoryLocation:
    """The :class:`MemoryLocation` of ``settings.resolved_memory_uri``."""
    uri = settings.resolved_memory_uri
    scheme = urlsplit(uri).scheme.lower()
    local = scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/"))  # c:\... is a path
    if local:
        path = uri[len("file://"):] if scheme == "file" else uri
        uri = str(Path(path).expanduser().absolute())
    return MemoryLocation(uri=uri, local=local, scope=settings.memory_store_scope)


def check_memory_location(settings: Settings) -> MemoryLocation:
    """Refuse a local memory store of a worker whose Temporal serves other machines too,
    unless ``HERMES_MEMORY_STORE_SCOPE`` says it is shared or deliberately local.

    Args:
        settings: the worker's settings.

    Returns:
        The store's :class:`MemoryLocation` (for the worker's banner).

    Raises:
        ConfigError: a local path, a remote Temporal and no scope; the message names the
            setting and its choices.
    """
    location = memory_location(settings)
    if location.local and location.scope is None and temporal_is_remote(settings):
        raise ConfigError(
            f"the memory store is a local path ({location.uri}) but Temporal "
            f"({settings.temporal_address}) serves workers on other machines too: each worker would keep "
            f"its own memories. Set HERMES_MEMORY_URI to one store every worker uses (s3://...), or say "
            f"what this path is: {SCOPE_SETTING}=shared (every worker mounts it, e.g. a network "
            f"filesystem) or {SCOPE_SETTING}=local (this one worker's alone, on purpose)",
            source=SCOPE_SETTING,
        )
    return location
