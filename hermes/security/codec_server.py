"""A Temporal codec server that shows the messages behind content references.

Model calls carry the content hashes of their context's messages in workflow history,
not the messages (:mod:`hermes.content.blobs`), so the Temporal Web UI would show a
``call_model`` input as a list of ``"m:..."`` strings. This server speaks Temporal's
remote codec protocol (https://docs.temporal.io/codec-server): the Web UI (or
``temporal workflow show --codec-endpoint``) posts the payloads it is about to show to
``/decode`` and shows what comes back. Hermes does not encode payloads (no encryption,
no compression), so decoding only *adds* what the references stand for:

* an object with a ``context_ref`` (a model call's: the reference of its list of
  message references) gets that list as ``message_refs`` (when the store has it), then
  as below;
* an object with a non-empty ``message_refs`` list gets ``messages``: the stored
  bodies, in order; a body missing from the store is shown as
  ``{"ref": ..., "missing": "not in the content store"}``;
* an object with a ``tools_ref`` gets ``tools``: the stored tool list (or a marker);
* a large value kept by reference, ``{"truncated": true, "ref": "b:..."}``, gets
  ``content``: the stored text, at most :data:`CONTENT_CAP_BYTES` of it (a cut one
  gets a ``content_note`` saying so), or ``missing`` / ``omitted``.

A ``messages`` or ``tools`` that is already non-empty (sent inline) is left as it is.
Everything else, and every payload that is not ``json/plain`` or whose JSON is nested
too deeply to parse or write back, comes back exactly as it came. ``/encode`` is the
identity. Both are also served under a namespace segment (``/{namespace}/decode``) for
the Temporal CLI's ``{namespace}`` endpoint template; the ``X-Namespace`` header is not
needed, since references are content hashes.

Size limits (a small request may name one large body many times):

* a stored message body or tool list over :data:`CONTENT_CAP_BYTES` is not read, and
  is shown as ``{"ref": ..., "omitted": "the stored value is N bytes, over ..."}``;
* one answer adds at most :data:`ANSWER_CAP_BYTES` of JSON (before base64) across all
  its payloads, in the order the references come: a value (or context list) that no
  longer fits is shown as ``{"ref": ..., "omitted": "the decoded answer reached its
  size limit"}`` (:data:`OMITTED`; a ``context_ref`` one as ``messages``), and a
  payload whose references do not fit even as such markers, or whose JSON would be
  written back longer than the room left (``1E15`` is written ``1000000000000000.0``),
  comes back as it came;
* at most four times that is read from Redis per answer (a value kept by reference
  that does not fit there is read from its first :data:`CONTENT_CAP_BYTES` only);
* a request body over :data:`BODY_CAP_BYTES` (by ``Content-Length``, or as it streams
  in) is refused with 413 and ``{"error": "..."}``.

Protocol: ``POST`` with ``{"payloads": [{"metadata": {"encoding": "<base64>", ...},
"data": "<base64>"}, ...]}`` (the proto3 JSON of ``temporal.api.common.v1.Payloads``),
answered with the same shape. A body that is not that shape (not JSON, nested too
deeply, a payload that is not a ``Payload``) gets 400 with ``{"error":
"..."}`` naming what is wrong. If Redis cannot be reached the payloads come back
undecoded (200, logged): a 500 would blank the Web UI's event history.

The browser calls this server from the Web UI's origin, so CORS allows those origins
(:func:`default_ui_origins`: ``http://localhost:8233`` and ``http://127.0.0.1:8233``)
with the headers the UI sends (``content-type``, ``x-namespace``, ``authorization``),
including credentials (the UI's "include cross-origin credentials" setting). Every
answer also carries ``Content-Security-Policy: default-src 'none'; frame-ancestors
'none'``, ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer`` (:class:`hermes.security.http_security.SecurityHeaders`), and a
client has 10 s to send a request's headers and 60 s its body
(:class:`hermes.security.http_security.ReadDeadlineH11Protocol`).

Run it with ``hermes codec-server`` (``hermes dev`` runs one itself and points its Web
UI at it), then give the endpoint to the UI: ``temporal server start-dev
--ui-codec-endpoint http://127.0.0.1:8081``, or the Web UI's codec server setting.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
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

from hermes.content.blobs import BLOB_KEY, BlobStore
from hermes.errors import ConfigError
from hermes.security import encryption
from hermes.security.encryption import EncryptionCodec, KeyRing
from hermes.security.http_security import (
    CODEC_CSP,
    ReadDeadlineH11Protocol,
    SecurityHeaders,
    bearer_token,
)

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = [
    "ANSWER_CAP_BYTES",
    "BODY_CAP_BYTES",
    "CONTENT_CAP_BYTES",
    "MISSING",
    "OMITTED",
    "codec_keys",
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
OMITTED = "the decoded answer reached its size limit"
"""Why a reference is not shown: what was added to the answer reached :data:`ANSWER_CAP_BYTES`."""
CONTENT_CAP_BYTES = 1_000_000
"""At most this many UTF-8 bytes of one stored value are shown: a value kept by
reference is cut there, and a stored message body, tool list or context list larger
than this is not read (the Web UI renders the whole answer in the page)."""
ANSWER_CAP_BYTES = 4_000_000
"""At most this many bytes of JSON (before base64) are added to one ``/decode`` answer,
across all its payloads: stored values, expanded reference lists and markers."""
BODY_CAP_BYTES = 16_000_000
"""Request bodies larger than this are refused with 413 (read no further than this)."""
ALLOWED_HEADERS = ("content-type", "x-namespace", "authorization")

HEALTH_TIMEOUT_SECONDS = 2.0
"""How long ``GET /health`` waits for Redis to answer a ping (as the API's ``/health``)."""
"""Request headers the Web UI sends to a codec server."""

_MARKER_ROOM_BYTES = 500_000
"""Stored values stop this far below :data:`ANSWER_CAP_BYTES`, so the references after
them can still be shown as :data:`OMITTED` markers."""
_READ_CAP_BYTES = 4 * ANSWER_CAP_BYTES
"""At most this many stored bytes are read from Redis for one answer (a value's JSON
shown can be smaller than its stored text, never much larger)."""
_ENTRY_BYTES = 16
"""Counted for the key and separators each added value or marker is written under."""
_MAX_PAYLOAD_DEPTH = 32
"""A ``Payload``'s proto3 JSON is 3 levels deep; a deeper one is refused (it could not
be written back)."""

_START_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 5.0
_POLL_SECONDS = 0.01


class _BadRequest(ValueError):
    """A request body that is not ``{"payloads": [Payload JSON, ...]}``."""

    status_code = 400


class _TooLarge(_BadRequest):
    """A request body over :data:`BODY_CAP_BYTES`."""

    status_code = 413


class _AnswerFull(Exception):
    """Even markers no longer fit in the answer (:data:`ANSWER_CAP_BYTES`)."""


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


# --------------------------------------------------------------------------- the request


async def _read_body(request: Request) -> bytes:
    """The request body, read no further than :data:`BODY_CAP_BYTES`.

    Raises:
        _TooLarge: its ``Content-Length``, or what was sent, is over the cap.
        _BadRequest: a ``Content-Length`` that is not a number.
    """
    too_large = f"the body is over the {BODY_CAP_BYTES:,}-byte limit"
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise _BadRequest(f"the Content-Length header {declared[:40]!r} is not a number") from None
        if length > BODY_CAP_BYTES:
            raise _TooLarge(too_large)
    body = bytearray()
    async for chunk in request.stream():  # a chunked body has no Content-Length
        body += chunk
        if len(body) > BODY_CAP_BYTES:
            raise _TooLarge(too_large)
    return bytes(body)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) has objects or lists more than ``limit`` levels deep,
    found without recursion (the HTTP API's bodies are checked with it too)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _parse_body(raw: bytes) -> list[dict[str, Any]]:
    """The payloads of a request body, checked against the ``Payload`` proto3 JSON.

    Raises:
        _BadRequest: naming what is wrong (not JSON, nested too deeply to parse, no
            ``payloads`` list, a payload that is not a ``Payload``).
    """
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _BadRequest("the body is nested too deeply to parse as JSON") from None
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
        if nested_deeper_than(payload, _MAX_PAYLOAD_DEPTH):
            raise _BadRequest(f"payloads[{index}] is nested more than {_MAX_PAYLOAD_DEPTH} levels deep")
        try:
            json_format.ParseDict(payload, Payload(), ignore_unknown_fields=True)
        except Exception as err:  # noqa: BLE001 - any parse failure is the client's
            raise _BadRequest(f"payloads[{index}] is not a Temporal Payload: {err}") from None
    return payloads


async def _payloads_of(request: Request) -> list[dict[str, Any]]:
    """The payloads a codec request posts (:func:`_read_body`, :func:`_parse_body`)."""
    return _parse_body(await _read_body(request))


# --------------------------------------------------------------------------- decoding


def _json_value(payload: dict[str, Any]) -> tuple[Any, int]:
    """The JSON value a ``json/plain`` payload carries, and the size of its data in bytes.

    Raises:
        ValueError: another encoding, or data that is not UTF-8 JSON.
        RecursionError: JSON nested too deeply to parse.
    """
    proto = json_format.ParseDict(payload, Payload(), ignore_unknown_fields=True)
    if proto.metadata.get("encoding") != JSON_ENCODING:
        raise ValueError("not json/plain")
    return json.loads(proto.data.decode("utf-8")), len(proto.data)


def _json_bytes(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON; a lone surrogate (from a ``\\ud800`` escape) is
    written as that escape again, so the bytes stay valid UTF-8.

    Raises:
        RecursionError: ``value`` is nested too deeply to write.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``value``, outermost first (no recursion: any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _context_ref(obj: dict[str, Any]) -> str | None:
    ref = obj.get("context_ref")
    return ref if isinstance(ref, str) and ref and not obj.get("message_refs") else None


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


def _ref_list(text: str) -> list[str] | None:
    """The list of references a stored context list holds (``None``: it is not one)."""
    try:
        refs = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return refs if isinstance(refs, list) and all(isinstance(r, str) for r in refs) else None


def _missing(ref: str) -> dict[str, str]:
    return {"ref": ref, "missing": MISSING}


def _omitted(ref: str) -> dict[str, str]:
    return {"ref": ref, "omitted": OMITTED}


def _too_large(ref: str, size: int) -> dict[str, str]:
    return {
        "ref": ref,
        "omitted": (
            f"the stored value is {size:,} bytes, over the {CONTENT_CAP_BYTES:,}-byte limit of one value; "
            f"it is in Redis under {BLOB_KEY.format(ref=ref)}"
        ),
    }


def _parsed(ref: str, text: str) -> tuple[Any, int]:
    """A stored message body or tool list (at most :data:`CONTENT_CAP_BYTES`) as JSON,
    and the size of that JSON in bytes."""
    try:
        value = json.loads(text)
        return value, len(_json_bytes(value))
    except RecursionError:
        value = {"ref": ref, "unreadable": "the stored value is nested too deeply to show"}
    except ValueError:
        value = {"ref": ref, "unreadable": "the stored value is not JSON", "text": text}
    return value, len(_json_bytes(value))


def _content(ref: str, text: str, stored_bytes: int, *, whole: bool) -> dict[str, Any]:
    """``content`` (and a note if cut) of a value kept by reference: the stored text,
    unwrapped if it is a JSON string.

    Args:
        ref: its reference.
        text: the stored text, or (``whole`` false) its first bytes.
        stored_bytes: the size of the stored text.
        whole: whether ``text`` is all of it.
    """
    if whole:
        with contextlib.suppress(ValueError, RecursionError):
            value = json.loads(text)
            if isinstance(value, str):
                text = value
    data = text.encode("utf-8", "surrogatepass")
    size = len(data) if whole else stored_bytes
    if size <= CONTENT_CAP_BYTES:
        return {"content": text}
    return {
        "content": data[:CONTENT_CAP_BYTES].decode("utf-8", "ignore"),
        "content_note": (
            f"only the first {CONTENT_CAP_BYTES:,} of {size:,} bytes are shown; the whole value "
            f"is in Redis under {BLOB_KEY.format(ref=ref)}"
        ),
    }


def _with_value(payload: dict[str, Any], data: bytes) -> dict[str, Any]:
    return {**payload, "data": base64.b64encode(data).decode("ascii")}


def _as_text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


class _Answer:
    """The stored values one ``/decode`` answer reads, and the room it has left.

    At most :data:`_READ_CAP_BYTES` are read from Redis, and at most
    :data:`ANSWER_CAP_BYTES` of JSON added, in the order the references come.

    Args:
        store: the content store.
    """

    def __init__(self, store: BlobStore):
        self.store = store
        self.used = 0
        """Bytes of JSON added to the answer so far."""
        self._read_left = _READ_CAP_BYTES
        self._sizes: dict[str, int] = {}  # every reference looked up -> its stored size (0: none)
        self._texts: dict[str, str] = {}  # read whole
        self._prefixes: dict[str, str] = {}  # the first CONTENT_CAP_BYTES of a larger value kept by reference
        self._bodies: dict[str, tuple[Any, int, bool]] = {}  # ref -> (shown, its JSON size, is a stored value)
        self.lists: dict[str, list[str]] = {}
        """Context references read -> the message references they stand for."""

    async def read(self, refs: list[str], *, content_refs: set[str] | frozenset[str] = frozenset()) -> None:
        """Look up ``refs`` (two Redis round trips) and read, in order, what can be shown:
        a message body, tool list or context list whole if at most
        :data:`CONTENT_CAP_BYTES`; a value kept by reference (in ``content_refs``)
        whole, or its first :data:`CONTENT_CAP_BYTES` if the whole does not fit.

        Raises:
            redis.exceptions.RedisError: Redis cannot be read.
        """
        new = [ref for ref in dict.fromkeys(refs) if ref not in self._sizes]
        redis = self.store.redis
        if not new or redis is None:
            self._sizes.update(dict.fromkeys(new, 0))
            return
        keys = {ref: BLOB_KEY.format(ref=ref) for ref in new}
        pipe = redis.pipeline(transaction=False)
        for ref in new:
            pipe.strlen(keys[ref])
        whole: list[str] = []
        parts: list[str] = []
        for ref, size in zip(new, await pipe.execute()):
            self._sizes[ref] = size
            if size and size <= self._read_left and (size <= CONTENT_CAP_BYTES or ref in content_refs):
                whole.append(ref)
                self._read_left -= size
            elif size and ref in content_refs and CONTENT_CAP_BYTES <= self._read_left:
                parts.append(ref)
                self._read_left -= CONTENT_CAP_BYTES
        if not whole and not parts:
            return
        # One GET per body, not an MGET: bodies are keyed by content hash, so on a Redis
        # Cluster they lie in many slots, and a pipeline routes each GET to its node.
        pipe = redis.pipeline(transaction=False)
        for ref in whole:
            pipe.get(keys[ref])
        for ref in parts:
            pipe.getrange(keys[ref], 0, CONTENT_CAP_BYTES - 1)
        results = await pipe.execute()
        for ref, text in zip(whole, results[: len(whole)]):
            if text is None:  # gone since it was measured
                self._sizes[ref] = 0
            else:
                self._texts[ref] = _as_text(text)
        for ref, prefix in zip(parts, results[len(whole) :]):
            self._prefixes[ref] = prefix.decode("utf-8", "ignore") if isinstance(prefix, bytes) else prefix

    async def read_contexts(self, refs: list[str]) -> None:
        """:meth:`read` context references, and keep the lists they stand for in :attr:`lists`.

        Raises:
            redis.exceptions.RedisError: Redis cannot be read.
        """
        await self.read(refs)
        for ref in dict.fromkeys(refs):
            if ref in self._texts and (listed := _ref_list(self._texts[ref])) is not None:
                self.lists[ref] = listed

    def _fits(self, size: int) -> bool:
        """Take ``size`` bytes for a stored value, if the room for values has them."""
        if self.used + size > ANSWER_CAP_BYTES - _MARKER_ROOM_BYTES:
            return False
        self.used += size
        return True

    def _marker(self, marker: dict[str, str]) -> dict[str, str]:
        """Take the room for ``marker``.

        Raises:
            _AnswerFull: the answer has no room left even for it.
        """
        self.used += len(_json_bytes(marker)) + _ENTRY_BYTES
        if self.used > ANSWER_CAP_BYTES:
            raise _AnswerFull
        return marker

    def _body(self, ref: str) -> Any:
        """What stands for ``ref`` as a message body or tool list."""
        if ref not in self._bodies:
            size = self._sizes.get(ref, 0)
            if size > CONTENT_CAP_BYTES:
                self._bodies[ref] = (_too_large(ref, size), 0, False)
            elif ref in self._texts:
                shown, size = _parsed(ref, self._texts[ref])
                self._bodies[ref] = (shown, size + _ENTRY_BYTES, True)
            else:
                self._bodies[ref] = (_omitted(ref) if size else _missing(ref), 0, False)
        shown, size, stored = self._bodies[ref]
        if stored and self._fits(size):
            return shown
        return self._marker(_omitted(ref) if stored else shown)

    def _content(self, ref: str) -> dict[str, Any]:
        """What is added to a ``{"truncated": true, "ref": ref}`` object."""
        size = self._sizes.get(ref, 0)
        if ref in self._texts or ref in self._prefixes:
            whole = ref in self._texts
            shown = _content(ref, self._texts[ref] if whole else self._prefixes[ref], size, whole=whole)
            if self._fits(len(_json_bytes(shown)) + _ENTRY_BYTES):
                return shown
        return self._marker({"omitted": OMITTED} if size else {"missing": MISSING})

    def wanted(self, value: Any) -> tuple[list[str], set[str]]:
        """The references :meth:`fill` would show in ``value``, and which of them are
        values kept by reference (the context lists already read)."""
        refs: list[str] = []
        content: set[str] = set()
        for obj in _objects(value):
            context_ref = _context_ref(obj)
            if context_ref in self.lists and not obj.get("messages"):
                refs += self.lists[context_ref]
            refs += _message_refs(obj)
            tools_ref = _tools_ref(obj)
            if tools_ref is not None:
                refs.append(tools_ref)
            content_ref = _content_ref(obj)
            if content_ref is not None:
                refs.append(content_ref)
                content.add(content_ref)
        return refs, content

    def fill(self, value: Any) -> bool:
        """Fill in place what the references in ``value`` stand for (see the module
        docstring), within the room left.

        Returns:
            Whether ``value`` has any reference to fill.

        Raises:
            _AnswerFull: even markers no longer fit.
        """
        found = False
        # Listed first, so values filled in here are not searched again.
        for obj in list(_objects(value)):
            context_ref = _context_ref(obj)
            if context_ref in self.lists:
                found = True
                listed = self.lists[context_ref]
                if self._fits(len(_json_bytes(listed)) + _ENTRY_BYTES):
                    obj["message_refs"] = listed
                elif not obj.get("messages"):
                    obj["messages"] = self._marker(_omitted(context_ref))
            refs = _message_refs(obj)
            if refs:
                found = True
                obj["messages"] = [self._body(ref) for ref in refs]
            tools_ref = _tools_ref(obj)
            if tools_ref is not None:
                found = True
                obj["tools"] = self._body(tools_ref)
            content_ref = _content_ref(obj)
            if content_ref is not None:
                found = True
                obj.update(self._content(content_ref))
        return found


async def decode_payloads(store: BlobStore, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode payloads for display: references filled from ``store`` (four Redis round
    trips at most), adding at most :data:`ANSWER_CAP_BYTES` of JSON in all.

    Args:
        store: the content store the workers write to.
        payloads: proto3 JSON of ``temporal.api.common.v1.Payload`` (base64 metadata
            values and data), as the codec protocol sends them.

    Returns:
        One payload per input, in order: ``json/plain`` payloads with references filled
        in, all others exactly as given, as is one whose JSON is too deeply nested to
        walk or write, or whose references do not fit in the answer even as markers.
        If the store cannot be read (Redis down), every payload as given (logged).
    """
    values: dict[int, tuple[Any, int]] = {}
    for index, payload in enumerate(payloads):
        with contextlib.suppress(ValueError, RecursionError, json_format.ParseError):
            values[index] = _json_value(payload)
    answer = _Answer(store)
    try:
        contexts = [ref for value, _ in values.values() for obj in _objects(value) if (ref := _context_ref(obj))]
        await answer.read_contexts(contexts)
        wanted: list[str] = []
        content: set[str] = set()
        for value, _ in values.values():
            refs, content_refs = answer.wanted(value)
            wanted += refs
            content |= content_refs
        await answer.read(wanted, content_refs=content)
    except Exception as err:  # noqa: BLE001 - the UI must still show the history
        log.warning("content store unreadable (%s: %s): %d payload(s) returned undecoded", type(err).__name__, err, len(payloads))
        return list(payloads)
    decoded = list(payloads)
    for index, (value, data_bytes) in values.items():
        start = answer.used
        try:
            if not answer.fill(value):
                continue
            data = _json_bytes(value)
            # Exact, as the value's own JSON may be written back longer than it came (1E9).
            added = len(data) - data_bytes
            if start + added > ANSWER_CAP_BYTES:
                raise _AnswerFull
        except _AnswerFull:
            answer.used = start
            log.warning("payload %d left undecoded: the answer reached its %d-byte limit", index, ANSWER_CAP_BYTES)
            continue
        except Exception:  # noqa: BLE001 - one odd payload (e.g. too deep to write) must not blank the others
            answer.used = start
            log.exception("payload %d left undecoded", index)
            continue
        answer.used = start + max(added, 0)
        decoded[index] = _with_value(payloads[index], data)
    return decoded


# --------------------------------------------------------------------------- the app


def create_app(
    store: BlobStore, *, ui_origins: list[str], keyring: KeyRing | None = None, token: str | None = None
) -> Starlette:
    """The codec server's ASGI app.

    Args:
        store: where the bodies are (a :class:`hermes.content.blobs.BlobStore` on the workers' Redis).
        ui_origins: origins of the Temporal Web UI(s) allowed to call it from a browser,
            e.g. ``["http://localhost:8233"]``; others get no CORS headers (a preflight
            from them is answered 400), and a request naming another ``Origin`` is 403.
        keyring: with payload encryption on (:mod:`hermes.security.encryption`), the keys: ``/decode``
            decrypts, ``/encode`` encrypts.
        token: when set, every request needs ``Authorization: Bearer <token>`` (401 without;
            the scheme in any case, :func:`hermes.security.http_security.bearer_token`).

    Returns:
        A Starlette app serving ``POST /decode``, ``POST /encode`` and both under
        ``/{namespace}/``, and ``GET /health`` (no token: ``{"status", "redis"}``, 200
        when Redis answers within :data:`HEALTH_TIMEOUT_SECONDS`, else 503).

    Raises:
        ValueError: a ``keyring`` without a ``token`` (decrypted conversations for anyone).
    """
    if keyring is not None and not token:
        raise ValueError("a codec server that decrypts needs a bearer token (HERMES_CODEC_TOKEN)")
    codec = EncryptionCodec(keyring) if keyring is not None else None

    def refused(request: Request) -> JSONResponse | None:
        origin = request.headers.get("origin")
        if origin is not None and origin not in ui_origins:
            return JSONResponse({"error": f"origin {origin!r} is not a Web UI this codec server serves"}, status_code=403)
        presented = bearer_token(request.headers.get("authorization")) or ""
        if token and not hmac.compare_digest(presented.encode(), token.encode()):
            return JSONResponse(
                {"error": "missing or wrong bearer token (Authorization: Bearer <HERMES_CODEC_TOKEN>)"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return None

    async def decode(request: Request) -> JSONResponse:
        if (answer := refused(request)) is not None:
            return answer
        try:
            payloads = await _payloads_of(request)
        except _BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=err.status_code)
        if codec is not None:
            try:
                payloads = await _coded(codec.decode, payloads)
            except Exception as err:  # noqa: BLE001 - an unknown key or altered data: say so, show nothing
                log.warning("payloads not decrypted: %s", err)
                return JSONResponse({"error": f"cannot decrypt: {err}"}, status_code=400)
        try:
            decoded = await decode_payloads(store, payloads)
        except Exception:  # noqa: BLE001 - a 500 would blank the Web UI
            log.exception("decoding failed: %d payload(s) returned undecoded", len(payloads))
            decoded = payloads
        return JSONResponse({"payloads": decoded})

    async def encode(request: Request) -> JSONResponse:
        if (answer := refused(request)) is not None:
            return answer
        try:
            payloads = await _payloads_of(request)
        except _BadRequest as err:
            return JSONResponse({"error": str(err)}, status_code=err.status_code)
        if codec is not None:
            payloads = await _coded(codec.encode, payloads)
        # Without encryption Hermes writes plain JSON payloads: what is sent is what is stored.
        return JSONResponse({"payloads": payloads})

    async def health(request: Request) -> JSONResponse:
        # For a container's health check: no key, no CORS, nothing but whether Redis answers.
        try:
            redis_ok = bool(await asyncio.wait_for(store.redis.ping(), HEALTH_TIMEOUT_SECONDS))
        except Exception as err:  # noqa: BLE001 - any failure is "does not answer"
            log.debug("redis health check failed: %s", err)
            redis_ok = False
        return JSONResponse({"status": "ok" if redis_ok else "unavailable", "redis": redis_ok}, status_code=200 if redis_ok else 503)

    routes = [
        Route("/health", health, methods=["GET"]),
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
    # Security headers outermost, so CORS answers (preflights) carry them too.
    return Starlette(routes=routes, middleware=[Middleware(SecurityHeaders, csp=CODEC_CSP), cors])


async def _coded(step: Callable[[list[Payload]], Any], payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payloads`` (proto3 JSON) through a codec's ``encode`` or ``decode``."""
    protos = [json_format.ParseDict(p, Payload()) for p in payloads]
    return [json_format.MessageToDict(p) for p in await step(protos)]


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
    store: BlobStore,
    *,
    host: str = "127.0.0.1",
    port: int = 8081,
    ui_origins: list[str] | None = None,
    keyring: KeyRing | None = None,
    token: str | None = None,
) -> AsyncIterator[str]:
    """Serve the codec server in this event loop while the block runs.

    Args:
        store: the content store.
        host: address to listen on.
        port: TCP port (0: any free one).
        ui_origins: Web UI origins allowed by CORS; default :func:`default_ui_origins`.
        keyring: payload encryption keys (see :func:`create_app`).
        token: the bearer token every request needs (required with ``keyring``).

    Yields:
        The endpoint URL, e.g. ``http://127.0.0.1:8081`` (it accepts connections already).

    Raises:
        OSError: the address cannot be bound (e.g. the port is in use).
        RuntimeError: the server did not start.
    """
    sock = _listening_socket(host, port)
    url = endpoint_url(host, sock.getsockname()[1])
    config = uvicorn.Config(
        create_app(
            store, ui_origins=ui_origins if ui_origins is not None else default_ui_origins(), keyring=keyring, token=token
        ),
        lifespan="off",
        ws="none",
        # Slow clients cannot hold connections (hermes.security.http_security: 10 s for headers, 60 s for a body).
        http=ReadDeadlineH11Protocol,
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


def codec_keys(settings: Settings) -> tuple[KeyRing | None, str | None]:
    """The key ring (None: payloads in clear) and the bearer token a codec server of
    ``settings`` runs with.

    Raises:
        ConfigError: a bad key setting, or keys without ``HERMES_CODEC_TOKEN`` (the server
            would decrypt conversations for anyone).
    """
    keyring = encryption.keyring_from_settings(settings)
    token = settings.codec_token.get_secret_value() if settings.codec_token is not None else None
    if keyring is not None and not token:
        raise ConfigError(
            "payloads are encrypted, so the codec server decrypts conversations: set a bearer token for it",
            source="HERMES_CODEC_TOKEN",
        )
    return keyring, token


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
        settings: where Redis is (``settings.resolved_redis_url``, TLS for ``rediss://``).
        host: address to listen on.
        port: TCP port.
        ui_origins: Web UI origins allowed by CORS; default
            :func:`default_ui_origins` of ``settings.ui_port``.
        on_ready: called with the endpoint URL once it accepts connections.

    Raises:
        OSError: the address cannot be bound.
        ConfigError: payloads are encrypted and no ``HERMES_CODEC_TOKEN`` is set, or a key setting is bad.
        redis.exceptions.ConnectionError: Redis does not answer at start.
    """
    from hermes.infra.process import wait_until_interrupted
    from worker import connect_redis

    keyring, token = codec_keys(settings)
    encryption.activate(keyring)  # the content store's Redis copies are sealed with the same keys
    redis = connect_redis(settings=settings)
    try:
        await redis.ping()
        origins = ui_origins if ui_origins else default_ui_origins(settings.ui_port)
        async with running_codec_server(
            BlobStore(redis), host=host, port=port, ui_origins=origins, keyring=keyring, token=token
        ) as url:
            if on_ready is not None:
                on_ready(url)
            await wait_until_interrupted()
    finally:
        await redis.aclose()
