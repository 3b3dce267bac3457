"""How ``hermes serve`` runs its app under uvicorn: read deadlines and proxy trust from
the settings (one place, used by the command and by the tests that start a server)."""

from __future__ import annotations

from typing import Any

import uvicorn

from hermes.security.http_security import read_deadline_protocol
from hermes.settings import Settings

__all__ = ["uvicorn_config"]


def uvicorn_config(app: Any, settings: Settings, *, host: str, port: int, **options: Any) -> uvicorn.Config:
    """The uvicorn config of ``hermes serve`` for ``app``.

    * HTTP/1.1 through :class:`hermes.security.http_security.ReadDeadlineH11Protocol`, with
      ``api_header_timeout_seconds`` and ``api_body_timeout_seconds``;
    * proxy headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) trusted only from
      ``api_forwarded_allow_ips`` (uvicorn's ``ProxyHeadersMiddleware``); empty: never,
      whatever ``FORWARDED_ALLOW_IPS`` says, so the client address is the TCP peer's.

    Args:
        app: the ASGI app (:func:`hermes.api.create_app`).
        settings: the ``api_*`` settings.
        host: address to listen on.
        port: TCP port (0: any free one).
        **options: other ``uvicorn.Config`` arguments (``log_config``, ``timeout_graceful_shutdown``...).
    """
    trusted = settings.api_forwarded_allow_ips.strip()
    return uvicorn.Config(
        app, host=host, port=port, lifespan="off", ws="none", access_log=False,
        http=read_deadline_protocol(settings.api_header_timeout_seconds, settings.api_body_timeout_seconds),
        proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None,
        **options,
    )
