"""A Temporal codec server that shows the messages behind content references.

Model calls carry the content hashes of their context's messages in workflow history,
not the messages (:mod:`hermes.blobs`), so the Temporal Web UI would show a
``call_model`` input as a list of ``"m:..."`` strings. This server speaks Temporal's
remote codec protocol (https://docs.temporal.io/codec-server): the Web UI (or
``temporal workflow show --codec-endpoint``) posts the payloads it is about to show to
``/decode`` and shows what comes back. Hermes does not encode payloads (no encryption,
no compression), so decoding only *adds* what the references stand for:

* an object with a ``context_ref`` (a model call's: the reference of its list of
  message references) gets that list as ``message_refs``, then as below;
* an object with a non-empty ``message_refs`` list gets ``messages``: the stored
  bodies, in order; a body missing from the store is shown as
  ``{"ref": ..., "missing": "not in the content store"}``;
* an object with a ``tools_ref`` gets ``tools``: the stored tool list (or that marker);
* a large value kept by reference, ``{"truncated": true, "ref": "b:..."}``, gets
  ``content``: the stored text, at most :data:`CONTENT_CAP_BYTES` of it (a cut one
  gets a ``content_note`` saying so).

A ``messages`` or ``tools`` that is already non-empty (sent inline) is left as it is.
Everything else, and every payload that is not ``json/plain``, comes back exactly as it
came. ``/encode`` is the identity. Both are also served under a namespace segment
(``/{namespace}/decode``) for the Temporal CLI's ``{namespace}`` endpoint template; the
``X-Namespace`` header is not needed, since references are content hashes.

Protocol: ``POST`` with ``{"payloads": [{"metadata": {"encoding": "<base64>", ...},
"data": "<base64>"}, ...]}`` (the proto3 JSON of ``temporal.api.common.v1.Payloads``),
answered with the same shape. A body that is not that shape gets 400 with
``{"error": "..."}``. If Redis cannot be reached the payloads come back undecoded (200,
logged): a 500 would blank the Web UI's event history.

The browser calls this server from the Web UI's origin, so CORS allows those origins
(:func:`default_ui_origins`: ``http://localhost:8233`` and ``http://127.0.0.1:8233``)
with the headers the UI sends (``content-type``, ``x-namespace``, ``authorization``),
including credentials (the UI's "include cross-origin credentials" setting).

Run it with ``hermes codec-server`` (``hermes dev`` runs one itself and points its Web
UI at it), then give the endpoint to the UI: ``temporal server start-dev
--ui-codec-endpoint http://127.0.0.1:8081``, or the Web UI's codec server setting.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.api.common.v1 import Payload

from hermes.blobs import BLOB_KEY, BlobStore

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = [
    "CONTENT_CAP_BYTES",
    "MISSING",
    "create_app",
    "decode_payloads",
    "default_ui_origins",
    "endpoint_url",
    "running_codec_server",
    "serve",
]

log = logging.getLogger("hermes.codec_server")

JSON_ENCODING = b"json/plain"
"""The metadata ``encoding`` of the payloads Hermes writes (``pydantic_data_converter``)."""
MISSING = "not in the content store"
"""Why a reference could not be shown (expired, written to another Redis, never stored)."""
CONTENT_CAP_BYTES = 1_000_000
"""At most this many UTF-8 bytes of one value kept by reference are returned: the Web
UI renders the whole answer in the page."""
ALLOWED_HEADERS = ("content-type", "x-namespace", "authorization")
"""Request headers the Web UI sends to a codec server."""

_START_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 5.0
_POLL_SECONDS = 0.01


class _BadRequest(ValueError):
    """A request body that is not ``{"payloads": [Payload JSON, ...]}``."""


def default_ui_origins(ui_port: int = 8233) -> list[str]:
    """The origins of a local Temporal Web UI on ``ui_port`` (a browser may use either name).

    Args:
        ui_port: the Web UI's port (``temporal server start-dev``: 8233).

    Returns:
        ``["http://localhost:<port>", "http://127.0.0.1:<port>"]``.
    """
    return [f"http://localhost:{ui_port}", f"http://127.0.0.1:{ui_port}"]


def endpoint_url(host: str, port: int) -> str:
    """The URL to give the Web UI for a codec server listening on ``host:port``."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# --------------------------------------------------------------------------- decoding


def _parse_body(raw: bytes) -> list[dict[str, Any]]:
    """The payloads of a request body, checked against the ``Payload`` proto3 JSON.

    Raises:
        _BadRequest: naming what is wrong (not JSON, no ``payloads`` list, a payload
            that is not a ``Payload``).
    """
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise _BadRequest(f"the body is not JSON ({err})") from None
    if not isinstance(body, dict) or "payloads" not in body:
        raise _BadRequest('the body must be a JSON object with a "payloads" list')
    payloads = body["payloads"]
    if not isinstance(payloads, list):
        raise _BadRequest(f'"payloads" must be a list, not {type(payloads).__name__}')
    for index, payload in enumerate(payloads):
        if not isinstance(payload, dict):
            raise _BadRequest(f"payloads[{index}] must be an object, not {type(payload).__name__}")
        try:
            json_format.ParseDict(payload, Payload(), ignore_unknown_fields=True)
        except json_format.ParseError as err:
            raise _BadRequest(f"payloads[{index}] is not a Temporal Payload: {err}") from None
    return payloads


def _json_value(payload: dict[str, Any]) -> Any:
    """The JSON value a ``json/plain`` payload carries.

    Raises:
        ValueError: another encoding, or data that is not UTF-8 JSON.
    """
    proto = json_format.ParseDict(payload, Payload(), ignore_unknown_fields=True)
    if proto.metadata.get("encoding") != JSON_ENCODING:
        raise ValueError("not json/plain")
    return json.loads(proto.data.decode("utf-8"))


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``value``, outermost first."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _message_refs(obj: dict[str, Any]) -> list[str]:
    refs = obj.get("message_refs")
    if isinstance(refs, list) and refs and all(isinstance(r, str) for r in refs) and not obj.get("messages"):
        return refs
    return []


def _tools_ref(obj: dict[str, Any]) -> str | None:
    ref = obj.get("tools_ref")
    return ref if isinstance(ref, str) and ref and not obj.get("tools") else None


def _content_ref(obj: dict[str, Any]) -> str | None:
    ref = obj.get("ref")
    return ref if obj.get("truncated") is True and isinstance(ref, str) and ref else None


def _wanted_refs(value: Any) -> list[str]:
    """The references :func:`_resolve` would fill in ``value``."""
    refs: list[str] = []
    for obj in _objects(value):
        refs += _message_refs(obj)
        for ref in (_tools_ref(obj), _content_ref(obj)):
            if ref is not None:
                refs.append(ref)
    return refs


def _missing(ref: str) -> dict[str, str]:
    return {"ref": ref, "missing": MISSING}


def _parsed(ref: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"ref": ref, "unreadable": "the stored value is not JSON", "text": text[:CONTENT_CAP_BYTES]}


def _content(ref: str, text: str) -> dict[str, Any]:
    """``content`` (and a note if cut) of a value kept by reference: the stored text,
    unwrapped if it is a JSON string."""
    with contextlib.suppress(ValueError):
        value = json.loads(text)
        if isinstance(value, str):
            text = value
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= CONTENT_CAP_BYTES:
        return {"content": text}
    shown = data[:CONTENT_CAP_BYTES].decode("utf-8", "ignore")
    return {
        "content": shown,
        "content_note": (
            f"only the first {CONTENT_CAP_BYTES:,} of {len(data):,} bytes are shown; the whole value "
            f"is in Redis under {BLOB_KEY.format(ref=ref)}"
        ),
    }


def _resolve(value: Any, found: dict[str, str]) -> None:
    """Fill in place what the references in ``value`` stand for (see the module docstring)."""
    # Listed first, so values filled in here are not searched again.
    for obj in list(_objects(value)):
        refs = _message_refs(obj)
        if refs:
            obj["messages"] = [_parsed(r, found[r]) if r in found else _missing(r) for r in refs]
        tools_ref = _tools_ref(obj)
        if tools_ref is not None:
            obj["tools"] = _parsed(tools_ref, found[tools_ref]) if tools_ref in found else _missing(tools_ref)
        content_ref = _content_ref(obj)
        if content_ref is not None:
            if content_ref in found:
                obj.update(_content(content_ref, found[content_ref]))
            else:
                obj["missing"] = MISSING


def _with_value(payload: dict[str, Any], value: Any) -> dict[str, Any]:
    try:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (from a \ud800 escape): keep it valid UTF-8
        data = json.dumps(value, separators=(",", ":")).encode("ascii")
    return {**payload, "data": base64.b64encode(data).decode("ascii")}


async def _expand_context_refs(store: BlobStore, values: dict[int, Any]) -> None:
    """Replace, in copies of ``values``, each ``context_ref`` by the ``message_refs`` list
    it stands for (when the store has it)."""
    wanted = [
        obj["context_ref"]
        for value in values.values()
        for obj in _objects(value)
        if isinstance(obj.get("context_ref"), str) and not obj.get("message_refs")
    ]
    if not wanted:
        return
    lists = await store.get_many(wanted)
    for index, value in list(values.items()):
        if not any(isinstance(o.get("context_ref"), str) and o["context_ref"] in lists for o in _objects(value)):
            continue
        value = copy.deepcopy(value)
        for obj in list(_objects(value)):
            ref = obj.get("context_ref")
            if isinstance(ref, str) and ref in lists and not obj.get("message_refs"):
                with contextlib.suppress(ValueError):
                    refs = json.loads(lists[ref])
                    if isinstance(refs, list) and all(isinstance(r, str) for r in refs):
                        obj["message_refs"] = refs
        values[index] = value


async def decode_payloads(store: BlobStore, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode payloads for display: references filled from ``store``, one Redis round trip.

    Args:
        store: the content store the workers write to.
        payloads: proto3 JSON of ``temporal.api.common.v1.Payload`` (base64 metadata
            values and data), as the codec protocol sends them.

    Returns:
        One payload per input, in order: ``json/plain`` payloads with references filled
        in, all others exactly as given. If the store cannot be read (Redis down), every
        payload as given (logged).
    """
    values: dict[int, Any] = {}
    for index, payload in enumerate(payloads):
        with contextlib.suppress(ValueError, UnicodeDecodeError, json_format.ParseError):
            values[index] = _json_value(payload)
    try:
        await _expand_context_refs(store, values)
        wanted = [ref for value in values.values() for ref in _wanted_refs(value)]
        if not wanted:
            return list(payloads)
        found = await store.get_many(wanted)
    except Exception as err:  # noqa: BLE001 - the UI must still show the history
        log.warning("content store unreadable (%s: %s): %d payload(s) returned undecoded", type(err).__name__, err, len(payloads))
        return list(payloads)
    decoded = list(payloads)
    for index, value in values.items():
        if not _wanted_refs(value):
            continue
        try:
            filled = copy.deepcopy(value)
            _resolve(filled, found)
            decoded[index] = _with_value(payloads[index], filled)
        except Exception:  # noqa: BLE001 - one odd payload must not blank the others
            log.exception("payload %d left undecoded", index)
    return decoded


# --------------------------------------------------------------------------- the app


def create_app(store: BlobStore, *, ui_origins: list[str]) -> Starlette:
    """The codec server's ASGI app.

    Args:
        store: where the bodies are (a :class:`hermes.blobs.BlobStore` on the workers' Redis).
        ui_origins: origins of the Temporal Web UI(s) allowed to call it from a browser,
            e.g. ``["http://localhost:8233"]``; others get no CORS headers (a preflight
            from them is answered 400).

    Returns:
        A Starlette app serving ``POST /decode``, ``POST /encode`` and both under
        ``/{namespace}/``.
    """

    async def decode(request: Request) -> JSONResponse:
        try:
            payloads = _parse_body(await request.body())
        except _BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        try:
            decoded = await decode_payloads(store, payloads)
        except Exception:  # noqa: BLE001 - a 500 would blank the Web UI
            log.exception("decoding failed: %d payload(s) returned undecoded", len(payloads))
            decoded = payloads
        return JSONResponse({"payloads": decoded})

    async def encode(request: Request) -> JSONResponse:
        # Hermes writes plain JSON payloads: what the UI or CLI sends is what the server stores.
        try:
            payloads = _parse_body(await request.body())
        except _BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({"payloads": payloads})

    routes = [
        Route("/decode", decode, methods=["POST"]),
        Route("/encode", encode, methods=["POST"]),
        Route("/{namespace}/decode", decode, methods=["POST"]),
        Route("/{namespace}/encode", encode, methods=["POST"]),
    ]
    cors = Middleware(
        CORSMiddleware,
        allow_origins=list(ui_origins),
        allow_methods=["POST"],
        allow_headers=list(ALLOWED_HEADERS),
        allow_credentials=True,
        # A hosted Web UI calling a codec server on localhost (Chrome's Private Network Access).
        allow_private_network=True,
    )
    return Starlette(routes=routes, middleware=[cors])


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host (the CLI cancels its
    main task on Ctrl-C; uvicorn would otherwise take SIGINT/SIGTERM for itself)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listening_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.asynccontextmanager
async def running_codec_server(
    store: BlobStore, *, host: str = "127.0.0.1", port: int = 8081, ui_origins: list[str] | None = None
) -> AsyncIterator[str]:
    """Serve the codec server in this event loop while the block runs.

    Args:
        store: the content store.
        host: address to listen on.
        port: TCP port (0: any free one).
        ui_origins: Web UI origins allowed by CORS; default :func:`default_ui_origins`.

    Yields:
        The endpoint URL, e.g. ``http://127.0.0.1:8081`` (it accepts connections already).

    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
        RuntimeError: the server did not start.
    """
    sock = _listening_socket(host, port)
    url = endpoint_url(host, sock.getsockname()[1])
    config = uvicorn.Config(
        create_app(store, ui_origins=ui_origins if ui_origins is not None else default_ui_origins()),
        lifespan="off",
        ws="none",
        log_config=None,  # leave the process's logging as the host configured it
        access_log=False,
        timeout_graceful_shutdown=int(_STOP_TIMEOUT_SECONDS),
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"codec-server {url}")
    try:
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT_SECONDS
        while not server.started:
            if task.done():
                task.result()  # its error, if any
                raise RuntimeError(f"the codec server on {url} stopped during start-up")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the codec server on {url} did not start in {_START_TIMEOUT_SECONDS:.0f} s")
            await asyncio.sleep(_POLL_SECONDS)
        log.info("codec server listening on %s", url)
        yield url
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), _STOP_TIMEOUT_SECONDS * 2)
        except asyncio.TimeoutError:
            task.cancel()
        except Exception:  # noqa: BLE001 - already stopping
            log.debug("codec server stopped with an error", exc_info=True)
        sock.close()


async def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8081,
    ui_origins: list[str] | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run a codec server on the configured Redis until this task is cancelled.

    Cancellation (Ctrl-C in ``hermes codec-server``) is its normal stop: it returns.

    Args:
        settings: where Redis is (``settings.resolved_redis_url``).
        host: address to listen on.
        port: TCP port.
        ui_origins: Web UI origins allowed by CORS; default
            :func:`default_ui_origins` of ``settings.ui_port``.
        on_ready: called with the endpoint URL once it accepts connections.

    Raises:
        OSError: the address cannot be bound.
        redis.exceptions.ConnectionError: Redis does not answer at start.
    """
    from hermes.demo import wait_until_interrupted
    from worker import connect_redis

    redis = connect_redis(settings.resolved_redis_url)
    try:
        await redis.ping()
        origins = ui_origins if ui_origins else default_ui_origins(settings.ui_port)
        async with running_codec_server(BlobStore(redis), host=host, port=port, ui_origins=origins) as url:
            if on_ready is not None:
                on_ready(url)
            await wait_until_interrupted()
    finally:
        await redis.aclose()
