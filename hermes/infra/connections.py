"""How Hermes reaches its servers: the arguments of every Temporal connection and every
Redis client, TLS included.

Every place that connects to Temporal (the worker, :class:`hermes.client.HermesClient`,
``hermes dev`` and the demo, their probes) spreads :func:`temporal_connect_args` into
``Client.connect``; every place that makes a Redis client calls :func:`redis_client`. So a
TLS cluster or Temporal Cloud works everywhere once the settings say so:

- **mTLS** (a self-hosted cluster, Temporal Cloud with certificates):
  ``HERMES_TEMPORAL_TLS_CERT_FILE`` + ``_KEY_FILE`` (the client's), optionally
  ``HERMES_TEMPORAL_TLS_CA_FILE`` (the server's CA; unset: the system's roots) and
  ``HERMES_TEMPORAL_TLS_SERVER_NAME`` (SNI and the name checked in the server's
  certificate, when it is not the host dialled).
- **API key** (Temporal Cloud): ``HERMES_TEMPORAL_API_KEY``, sent as
  ``authorization: Bearer <key>`` gRPC metadata; TLS is then on unless
  ``HERMES_TEMPORAL_TLS=false``.
- **Redis over TLS**: a ``rediss://`` URL, with ``HERMES_REDIS_TLS_CA_FILE`` (unset: the
  system's roots) and optionally a client certificate and key.
- **Redis Cluster and Sentinel**: ``HERMES_REDIS_MODE=cluster`` (``REDIS_URL`` names any
  node) or ``sentinel`` (``HERMES_REDIS_SENTINELS``, ``HERMES_REDIS_SENTINEL_MASTER``);
  the keys that one command touches together share a hash tag (:mod:`hermes.infra.redis_keys`).

Files are read when a connection is made (each start-up); a missing or unreadable one, a
key without its certificate, TLS files for the embedded plain servers, are a
:class:`~hermes.errors.ConfigError` naming the setting and the file. Secrets are
``SecretStr`` in the settings and never logged.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hermes.errors import ConfigError
from hermes.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "TemporalTlsError",
    "check_connection_settings",
    "describe_temporal_security",
    "connect_temporal",
    "redis_client",
    "sync_twin",
    "temporal_connect_args",
    "temporal_tls_requested",
]

REDIS_CONNECT_TIMEOUT_SECONDS = 2.0
REDIS_SOCKET_TIMEOUT_SECONDS = 5.0
"""A Redis that does not answer fails a call within seconds instead of hanging it."""


def _pem(path: Path | None, setting: str) -> bytes | None:
    """The bytes of a PEM file named by ``setting``, or None when it is unset.

    Raises:
        ConfigError: the file does not exist, cannot be read or holds no PEM block.
    """
    if path is None:
        return None
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as err:
        raise ConfigError(
            f"cannot read {str(path)!r}: {err.strerror or type(err).__name__}; expected a PEM file",
            source=setting,
        ) from err
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{str(path)!r} is not a PEM file (no '-----BEGIN' line)", source=setting)
    return data


def _pair(cert: Path | None, key: Path | None, cert_setting: str, key_setting: str) -> None:
    if (cert is None) != (key is None):
        given, missing = (cert_setting, key_setting) if cert is not None else (key_setting, cert_setting)
        raise ConfigError(
            f"is set ({str(cert or key)!r}) but {missing} is not: a client certificate needs its private key",
            source=given,
        )


def temporal_tls_requested(settings: Settings) -> bool:
    """True if the settings ask for TLS (or an API key) on the Temporal connection."""
    return bool(
        settings.temporal_tls
        or settings.temporal_api_key is not None
        or settings.temporal_tls_ca_file
        or settings.temporal_tls_cert_file
        or settings.temporal_tls_key_file
        or settings.temporal_tls_server_name
    )


def temporal_connect_args(settings: Settings, *, address: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``temporalio.client.Client.connect`` that say where and how
    to connect: ``target_host``, ``namespace``, ``tls`` and ``api_key``.

    Args:
        settings: ``temporal_address``, ``temporal_namespace`` and the ``temporal_tls*`` /
            ``temporal_api_key`` settings.
        address: ``host:port`` to dial instead of ``settings.resolved_temporal_address``
            (e.g. a server ``hermes dev`` found); the TLS settings apply to it.

    Returns:
        ``{"target_host": str, "namespace": str, "tls": bool | TLSConfig, "api_key": str | None}``:
        ``tls`` is a ``TLSConfig`` when a certificate, CA or server name is set, ``True``
        for TLS with the system's roots (``temporal_tls``, or an API key), else ``False``.

    Raises:
        ConfigError: a TLS file that cannot be read or is not PEM; a client certificate
            without its key or a key without its certificate; TLS settings with
            ``HERMES_TEMPORAL_TLS=false``; TLS settings and no ``TEMPORAL_ADDRESS`` (the
            embedded server speaks plain gRPC).
    """
    from temporalio.service import TLSConfig

    s = settings
    files = (s.temporal_tls_ca_file, s.temporal_tls_cert_file, s.temporal_tls_key_file, s.temporal_tls_server_name)
    if s.temporal_tls is False and any(f is not None for f in files):
        raise ConfigError(
            "is false but a HERMES_TEMPORAL_TLS_* certificate, key, CA or server name is set", source="HERMES_TEMPORAL_TLS"
        )
    if address is None and s.temporal_address is None and temporal_tls_requested(s):
        raise ConfigError(
            "TLS or an API key is configured but TEMPORAL_ADDRESS is unset: the embedded Temporal server "
            "of `hermes dev` speaks plain gRPC; set TEMPORAL_ADDRESS to your TLS server",
            source="HERMES_TEMPORAL_TLS",
        )
    _pair(s.temporal_tls_cert_file, s.temporal_tls_key_file, "HERMES_TEMPORAL_TLS_CERT_FILE", "HERMES_TEMPORAL_TLS_KEY_FILE")
    tls: bool | TLSConfig
    if any(f is not None for f in files):
        tls = TLSConfig(
            server_root_ca_cert=_pem(s.temporal_tls_ca_file, "HERMES_TEMPORAL_TLS_CA_FILE"),
            client_cert=_pem(s.temporal_tls_cert_file, "HERMES_TEMPORAL_TLS_CERT_FILE"),
            client_private_key=_pem(s.temporal_tls_key_file, "HERMES_TEMPORAL_TLS_KEY_FILE"),
            domain=s.temporal_tls_server_name,
        )
    else:
        tls = s.temporal_tls if s.temporal_tls is not None else s.temporal_api_key is not None
    return {
        "target_host": address or s.resolved_temporal_address,
        "namespace": s.temporal_namespace,
        "tls": tls,
        "api_key": s.temporal_api_key.get_secret_value() if s.temporal_api_key is not None else None,
    }


def describe_temporal_security(settings: Settings) -> str:
    """How the Temporal connection is secured, for a start-up banner: ``mTLS``, ``TLS``,
    ``+ API key`` after either, or ``plain``; never the key or a file's content."""
    s = settings
    if s.temporal_tls is False:
        kind = "plain"
    elif s.temporal_tls_cert_file is not None:
        kind = "mTLS"
    else:
        kind = "TLS" if temporal_tls_requested(s) else "plain"
    return kind + (" + API key" if s.temporal_api_key is not None else "")


class TemporalTlsError(RuntimeError):
    """A TLS connection to Temporal that failed, with what was tried and the likely
    cause. Its message starts ``Failed client connect:`` like the SDK's own."""


def _tls_failure(text: str, settings: Settings, target: str) -> str | None:
    """What went wrong in words a user acts on, from the SDK's connect error; None when
    it is no TLS failure Hermes recognises."""
    s = settings
    ca = f"HERMES_TEMPORAL_TLS_CA_FILE ({s.temporal_tls_ca_file})" if s.temporal_tls_ca_file else "the system's root CAs"
    if "UnknownIssuer" in text or "BadSignature" in text:
        return f"the certificate of {target} is not signed by {ca}"
    if "NotValidForName" in text:
        return (
            f"the certificate of {target} is not for the name dialled "
            f"({s.temporal_tls_server_name or target.rsplit(':', 1)[0]}); set HERMES_TEMPORAL_TLS_SERVER_NAME"
        )
    if "Expired" in text or "NotValidYet" in text:
        return f"the certificate of {target} is expired or not yet valid"
    if "CorruptMessage" in text or "InvalidContentType" in text or "InvalidMessage" in text:
        return f"{target} does not speak TLS (set HERMES_TEMPORAL_TLS=false for a plain server)"
    # Under TLS 1.3 the server checks the client certificate after the client has finished
    # its handshake: the refusal then reaches the client as an alert, an EOF, or (loaded
    # machines) a broken pipe, a reset, or a connection closed under the first call.
    refused = ("close_notify", "CertificateRequired", "UnexpectedEof", "BadCertificate", "UnknownCA", "BrokenPipe",
               "broken pipe", "ConnectionReset", "connection reset", "connection closed", "hyper::Error(Canceled")
    if any(m in text for m in refused):
        given = (
            f"HERMES_TEMPORAL_TLS_CERT_FILE ({s.temporal_tls_cert_file})"
            if s.temporal_tls_cert_file
            else "no client certificate (HERMES_TEMPORAL_TLS_CERT_FILE / _KEY_FILE unset)"
        )
        return f"{target} refused the TLS connection; it may require a client certificate of a CA it trusts, and got {given}"
    return None


async def connect_temporal(settings: Settings, *, address: str | None = None, **kwargs: Any) -> Any:
    """``temporalio.client.Client.connect`` with :func:`temporal_connect_args`.

    Args:
        settings: the connection settings.
        address: as in :func:`temporal_connect_args`.
        **kwargs: the other arguments of ``Client.connect`` (``data_converter``,
            ``plugins``, ``runtime``, ...).

    Returns:
        A connected ``temporalio.client.Client``.

    Raises:
        ConfigError: a bad TLS setting, before anything is dialled.
        TemporalTlsError: TLS is configured and the handshake (or the server's check of
            the client certificate) failed; the message says which side and which setting.
        RuntimeError: the SDK's ``Failed client connect: ...`` for any other failure.
    """
    from temporalio.client import Client

    args = temporal_connect_args(settings, address=address)
    try:
        return await Client.connect(**args, **kwargs)
    except RuntimeError as err:
        reason = _tls_failure(str(err), settings, args["target_host"]) if args["tls"] else None
        if reason is None:
            raise
        detail = str(err).removeprefix("Failed client connect: ")
        raise TemporalTlsError(f"Failed client connect: {reason} ({detail})") from err


def _redis_tls_args(settings: Settings, url: str) -> dict[str, Any]:
    s = settings
    files = (s.redis_tls_ca_file, s.redis_tls_cert_file, s.redis_tls_key_file)
    if urlsplit(url).scheme != "rediss":
        if any(f is not None for f in files):
            raise ConfigError(
                "is set but the Redis URL is not rediss:// (TLS); use a rediss:// REDIS_URL "
                "(the embedded Redis of `hermes dev` speaks plain)",
                source="HERMES_REDIS_TLS_CA_FILE" if s.redis_tls_ca_file else "HERMES_REDIS_TLS_CERT_FILE",
            )
        return {}
    _pair(s.redis_tls_cert_file, s.redis_tls_key_file, "HERMES_REDIS_TLS_CERT_FILE", "HERMES_REDIS_TLS_KEY_FILE")
    for path, setting in (
        (s.redis_tls_ca_file, "HERMES_REDIS_TLS_CA_FILE"),
        (s.redis_tls_cert_file, "HERMES_REDIS_TLS_CERT_FILE"),
        (s.redis_tls_key_file, "HERMES_REDIS_TLS_KEY_FILE"),
    ):
        _pem(path, setting)  # checked now: redis-py would only fail at the first command
    args: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if s.redis_tls_ca_file is not None:
        args["ssl_ca_certs"] = str(Path(s.redis_tls_ca_file).expanduser())
    if s.redis_tls_cert_file is not None and s.redis_tls_key_file is not None:
        args["ssl_certfile"] = str(Path(s.redis_tls_cert_file).expanduser())
        args["ssl_keyfile"] = str(Path(s.redis_tls_key_file).expanduser())
    return args


def check_connection_settings(settings: Settings) -> None:
    """Check the Temporal and Redis connection settings without connecting (the files
    are read), so a command fails before it starts anything.

    Raises:
        ConfigError: as :func:`temporal_connect_args` and :func:`redis_client` would.
    """
    temporal_connect_args(settings)
    _redis_tls_args(settings, settings.resolved_redis_url)
    _check_mode(settings)


def redis_client(settings: Settings, url: str | None = None) -> Any:
    """A ``redis.asyncio.Redis`` for the settings' Redis, with timeouts (an unreachable
    Redis fails within seconds) and, for a ``rediss://`` URL, TLS verified against
    ``HERMES_REDIS_TLS_CA_FILE`` (unset: the system's roots) with the client certificate
    of ``HERMES_REDIS_TLS_CERT_FILE`` / ``_KEY_FILE`` when set. Its pool is bounded
    (``redis_max_connections``) and a command that finds every connection in use waits
    for one up to ``redis_pool_timeout_seconds`` (``redis.asyncio.BlockingConnectionPool``).
    With ``redis_mode`` ``cluster`` a ``redis.asyncio.RedisCluster`` (pools per node, that
    fail at once when full), with ``sentinel`` the master the Sentinels report.

    Args:
        settings: ``redis_url``, ``redis_mode``, ``redis_sentinel*``, ``redis_max_connections``,
            ``redis_pool_timeout_seconds`` and the ``redis_tls_*`` settings.
        url: the URL to use instead of ``settings.resolved_redis_url`` (e.g. the embedded
            Redis ``hermes dev`` started).

    Returns:
        A client; nothing is connected until its first command.

    Raises:
        ConfigError: a TLS file that cannot be read or is not PEM, a client certificate
            without its key (or the reverse), TLS files with a plain ``redis://`` URL, or
            ``sentinel`` mode without ``host:port`` sentinels.
    """
    import redis.asyncio as aioredis

    url = url or settings.resolved_redis_url
    _check_mode(settings)
    if settings.redis_mode == "cluster":
        return _cluster_client(settings, url)
    if settings.redis_mode == "sentinel":
        return _sentinel_client(settings, url)
    # A bounded pool whose callers wait for a free connection: redis-py's default pool
    # either grows without bound or, bounded, raises "Too many connections" at once.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_seconds,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_SECONDS,
        socket_timeout=REDIS_SOCKET_TIMEOUT_SECONDS,
        **_redis_tls_args(settings, url),
    )
    return aioredis.Redis.from_pool(pool)


def cancel_requests() -> int:
    """The current task's pending cancel requests (``Task.cancelling()``, Python 3.11; 0
    outside a task): taken before a Redis call, for :func:`raise_if_cancelled`."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def raise_if_cancelled(before: int = 0) -> None:
    """Raise the cancellation a Redis command lost, in a loop of Redis calls.

    redis-py can lose a cancel that lands as a reply arrives: the command returns its
    reply and the task runs on as if it had never been cancelled (redis/redis-py#2028;
    here about 1 cancel in 30 of a loop of 10 ms ``XREAD BLOCK`` reads, with either
    parser). A loop that only a cancel ends then never ends: ``hermes send`` hung after
    its reply, waiting for its event follower (seen in CI). Every loop of Redis calls
    calls this after each call.

    Args:
        before: :func:`cancel_requests` taken just before the call. 0 (the default) is
            right only in a task of the loop's own; a loop that may run in a caller's task
            (a generator) passes the count, so a cancel that task handled earlier without
            ``uncancel()`` (a Python 3.11 ``TaskGroup`` does) is not raised again.

    Raises:
        asyncio.CancelledError: the current task was asked to stop during the call.
    """
    if cancel_requests() > before:
        raise asyncio.CancelledError


async def stop_task(task: asyncio.Task[Any], *, wait_seconds: float, what: str) -> bool:
    """Cancel ``task`` (a loop of Redis calls) and wait for it at most ``wait_seconds``;
    a task still running then is left, with a warning naming ``what``. The caller's own
    cancel is not suppressed.

    Returns:
        Whether the task ended.
    """
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=wait_seconds)
    if not done:
        log.warning("%s did not stop within %.0f s; going on without it", what, wait_seconds)
    elif not task.cancelled() and task.exception() is not None:
        log.debug("%s ended with %r", what, task.exception())
    return bool(done)


def _common_redis_args(settings: Settings, url: str) -> dict[str, Any]:
    return {
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
        **_redis_tls_args(settings, url),
    }


def _cluster_client(settings: Settings, url: str) -> Any:
    """A ``redis.asyncio.RedisCluster`` from any node's URL. redis-py keeps one pool per
    node, bounded by ``max_connections``; a node whose connections are all in use fails
    the command at once (``MaxConnectionsError``) rather than waiting, so a cluster needs
    ``redis_max_connections`` sized for the process' peak concurrency per node."""
    from redis.asyncio.cluster import RedisCluster

    return RedisCluster.from_url(url, max_connections=settings.redis_max_connections, **_common_redis_args(settings, url))


def _sentinel_client(settings: Settings, url: str) -> Any:
    """The master that the Sentinels report for ``redis_sentinel_master``, found again
    after a failover; ``url`` gives its password, database and scheme."""
    from redis.asyncio.sentinel import Sentinel

    sentinels = _sentinel_addresses(settings)
    parts = urlsplit(url)
    password = settings.redis_sentinel_password
    sentinel_kwargs = {
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS,
        "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
        **({"password": password.get_secret_value()} if password is not None else {}),
    }
    db = parts.path.lstrip("/")
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(
        settings.redis_sentinel_master,
        max_connections=settings.redis_max_connections,
        username=parts.username or None,
        password=parts.password or None,
        db=int(db) if db.isdigit() else 0,
        **({"ssl": True} if parts.scheme == "rediss" else {}),
        **_common_redis_args(settings, url),
    )


def _sentinel_addresses(settings: Settings) -> list[tuple[str, int]]:
    """``redis_sentinels`` as ``(host, port)`` pairs.

    Raises:
        ConfigError: none set, or one that is not ``host:port``.
    """
    if not settings.redis_sentinels:
        raise ConfigError(
            "HERMES_REDIS_MODE=sentinel needs HERMES_REDIS_SENTINELS (host:port,...)", source="HERMES_REDIS_SENTINELS"
        )
    sentinels = []
    for item in settings.redis_sentinels:
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"a Sentinel must be host:port, got {item!r}", source="HERMES_REDIS_SENTINELS")
        sentinels.append((host.strip("[]"), int(port)))
    return sentinels


def _check_mode(settings: Settings) -> None:
    """Refuse a cluster or Sentinel mode without ``REDIS_URL`` (the embedded Redis of
    ``hermes dev`` is one server) and Sentinel mode without its sentinels."""
    if settings.redis_mode != "standalone" and settings.redis_url is None:
        raise ConfigError(
            f"HERMES_REDIS_MODE={settings.redis_mode} needs REDIS_URL (the embedded Redis is one server)",
            source="HERMES_REDIS_MODE",
        )
    if settings.redis_mode == "sentinel":
        _sentinel_addresses(settings)


_SYNC_TWIN_KWARGS = frozenset(
    {
        "host", "port", "path", "db", "username", "password", "client_name",
        "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
        "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path",
        "ssl_check_hostname", "ssl_min_version", "ssl_ciphers", "ssl_password",
    }
)


def sync_twin(client: Any, *, max_connections: int = 8, timeout_seconds: float | None = None) -> Any:
    """A blocking ``redis.Redis`` to the same server as ``client``, for plain OS threads
    (a ``redis.asyncio`` client belongs to its event loop); same address, database,
    credentials, timeouts and TLS, a pool of at most 8 connections (its users are
    threads: the default executor has at most 32, on a small machine 5-8).

    Args:
        client: a standalone ``redis.asyncio.Redis`` (TCP, TLS or a Unix socket).
        max_connections: the pool's size (a thread waits for a free connection).
        timeout_seconds: the longest a command, a connect or the wait for a free
            connection takes (default: ``client``'s socket timeouts, and
            :data:`REDIS_SOCKET_TIMEOUT_SECONDS` for the wait).

    Returns:
        The twin; None for anything else (None, a Redis Cluster or Sentinel client, a
        connection class of its own), whose callers then go without.
    """
    import redis
    import redis.asyncio as aioredis

    if not isinstance(client, aioredis.Redis):
        return None
    pool = client.connection_pool
    name = getattr(pool, "connection_class", type(None)).__name__
    if name not in ("Connection", "SSLConnection", "UnixDomainSocketConnection") or pool.connection_class.__module__ != (
        "redis.asyncio.connection"
    ):
        return None
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _SYNC_TWIN_KWARGS}
    if timeout_seconds is not None:
        kwargs.update(socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds)
    return redis.Redis(connection_pool=redis.BlockingConnectionPool(
        connection_class=getattr(redis.connection, name), max_connections=max_connections,
        timeout=REDIS_SOCKET_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds, **kwargs
    ))
