"""A client's retry of a message attaches to the turn it started instead of running it again.

An HTTP client that times out, loses its connection or gets a 5xx sends the same
request again; the ``openai`` Python client does so on its own (twice by default) and
never sends an ``Idempotency-Key``. Each message-sending route (``POST
/v1/chat/completions``, ``POST /v1/sessions/{id}/messages``) therefore names the message
by the request, not by chance, and the session dedupes on that name (its client message
id: a resend of a known id waits for, or returns, the first reply and runs no second turn):

* **With an** ``Idempotency-Key``: ``api-<key>#<16 hex of the request's fingerprint>``. A
  request with the key of an earlier one and another body (or another caller) is refused
  422 (``idempotency-key-reused``), as Stripe and draft-ietf-httpapi-idempotency-key-header
  do; the same key and body attach, however late (while the session holds the id).
* **Without one**: ``fp-<32 hex of the fingerprint>-<n>``, where the fingerprint is the
  SHA-256 of the caller (the key's user), the session and the canonical body (JSON with
  sorted keys; ``stream`` and ``stream_options`` left out, so a retry may ask for the
  other form). A request whose newest generation ``n`` is still running, or was answered
  within ``api_retry_window_seconds`` (on the session route, whose body is only the text,
  at most :data:`SESSION_ROUTE_ANSWERED_WINDOW_SECONDS`), attaches to it; otherwise it is a
  new message (``n + 1``). So the same text sent twice within the window without a key is taken as a
  retry: a client that means it twice sends a distinct ``Idempotency-Key`` each time.

A response to a request that attached carries ``Idempotent-Replayed: true`` (Stripe's
header), so a client can tell a returned reply from a new one.

The session itself is the record (its ``get_taken_messages`` query): nothing is kept in
the API server or in Redis, so every API server process agrees, and a restart or a Redis
outage forgets nothing. Should the query fail (a worker older than it), the request is
sent under a fresh id, as before, and a warning logged; should it not answer in time (a
saturated or absent worker), a keyless request is refused 503 with ``Retry-After`` and
nothing is sent (a fresh id would make a client's retry a second turn once the worker
catches up).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from hermes.api.problems import Problem
from hermes.client import HermesClient
from hermes.errors import HermesError, SessionUnavailableError
from hermes.models import TakenMessage

__all__ = [
    "MAX_IDEMPOTENCY_KEY_CHARS", "REPLAYED_HEADER", "SESSION_ROUTE_ANSWERED_WINDOW_SECONDS", "MessageName",
    "idempotency_key", "message_name", "request_fingerprint",
]

log = logging.getLogger("hermes.api")

MAX_IDEMPOTENCY_KEY_CHARS = 200
UNFINGERPRINTED_FIELDS = frozenset({"stream", "stream_options"})
"""Body fields left out of the fingerprint: how the answer is delivered, not what is asked."""
SESSION_ROUTE_ANSWERED_WINDOW_SECONDS = 10.0
"""On ``POST /v1/sessions/{id}/messages`` a body is the text alone (``{"text": "yes"}``),
so the same body is often a person's new message: after its answer, a keyless repeat is a
retry only this long (a client that gave up just as the answer came); still running, always."""
REPLAYED_HEADER = "Idempotent-Replayed"
"""Set to ``true`` on the response to a request that attached to an earlier one."""
UNAVAILABLE_RETRY_AFTER_SECONDS = 5
"""``Retry-After`` of a request refused because its session did not answer in time."""
_KEYED_HEX = 16
_UNKEYED_HEX = 32


@dataclass(frozen=True)
class MessageName:
    """The client message id a request's message is sent under."""

    client_message_id: str
    retry: bool
    """The session took this message already (a retry): sending it waits for, or returns,
    the first reply."""


def idempotency_key(headers: Any) -> str | None:
    """The request's ``Idempotency-Key`` header, if sent.

    Raises:
        Problem: 400 when it is not 1-200 printable ASCII characters.
    """
    key = headers.get("idempotency-key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS and key.isprintable() and key.isascii()):
        raise Problem("malformed-request", f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters")
    return key


def request_fingerprint(caller: str, session_id: str, body: dict[str, Any]) -> str:
    """The SHA-256 (hex) naming a request: who sends what to which session.

    Args:
        caller: the API key's user.
        session_id: the session the message goes to.
        body: the request body as JSON values; :data:`UNFINGERPRINTED_FIELDS` are left out.

    Returns:
        64 hex characters; equal for bodies equal as JSON (key order and spacing aside).
    """
    kept = {k: v for k, v in body.items() if k not in UNFINGERPRINTED_FIELDS}
    canonical = json.dumps(
        {"caller": caller, "session": session_id, "body": kept}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def message_name(
    hermes: HermesClient,
    session_id: str,
    *,
    fingerprint: str,
    key: str | None,
    window_seconds: float,
    session_exists: bool = True,
    now: datetime | None = None,
) -> MessageName:
    """The client message id to send a request's message under (the module docstring
    says how it is chosen), asking the session which ids it took.

    Args:
        hermes: the client.
        session_id: the session.
        fingerprint: :func:`request_fingerprint` of the request.
        key: its ``Idempotency-Key`` (:func:`idempotency_key`), or None.
        window_seconds: how long after its answer an unkeyed request is still a retry;
            0: never (every unkeyed request is a new message).
        session_exists: False when the session is yet to be started (nothing to ask).
        now: the time (UTC); default: the clock.

    Returns:
        The id, and whether the session took it already.

    Raises:
        Problem: 422 ``idempotency-key-reused``: ``key`` was sent with another request;
            503 ``unavailable`` (``Retry-After``): no key, and the session did not say
            in time which requests it took (nothing sent).
    """
    if key is not None:
        prefix = f"api-{key}#"
        cid = prefix + fingerprint[:_KEYED_HEX]
        taken = await _taken(hermes, session_id, prefix, keyed=True) if session_exists else []
        # Unknown (None): the id alone still dedupes; only the check of the body is skipped.
        ids = {t.client_message_id for t in taken or () if len(t.client_message_id) == len(cid)}
        if ids - {cid}:
            raise Problem(
                "idempotency-key-reused",
                f"Idempotency-Key {key!r} was sent with another request to this session (another body or caller); "
                "a key names one request: send a new key for a new message",
            )
        return MessageName(cid, cid in ids)
    if window_seconds <= 0:
        return MessageName(f"msg-{uuid.uuid4()}", False)
    prefix = f"fp-{fingerprint[:_UNKEYED_HEX]}-"
    taken = await _taken(hermes, session_id, prefix, keyed=False) if session_exists else []
    if taken is None:
        return MessageName(f"msg-{uuid.uuid4()}", False)
    generations = {int(t.client_message_id[len(prefix):]): t for t in taken if t.client_message_id[len(prefix):].isdigit()}
    if not generations:
        return MessageName(prefix + "0", False)
    newest = max(generations)
    if _still_a_retry(generations[newest], window_seconds, now or datetime.now(timezone.utc)):
        return MessageName(prefix + str(newest), True)
    return MessageName(prefix + str(newest + 1), False)


def _still_a_retry(taken: TakenMessage, window_seconds: float, now: datetime) -> bool:
    if taken.running:
        return True
    return taken.answered_at is not None and now - taken.answered_at <= timedelta(seconds=window_seconds)


async def _taken(hermes: HermesClient, session_id: str, prefix: str, *, keyed: bool) -> list[TakenMessage] | None:
    """The session's taken messages under ``prefix``; None (logged) when it does not say.

    Raises:
        Problem: 503 ``unavailable`` with ``Retry-After`` when the session did not answer
            in time (its worker is saturated, or gone) and the request has no
            ``Idempotency-Key``: sent under a fresh id, a client's retry of a request
            whose first attempt is still queued would run a second turn, so under load
            the request is refused and nothing is sent (issue 31: backpressure, not
            amplification). A keyed request's id dedupes alone, so it is sent.
    """
    try:
        return await hermes.taken_messages(session_id, prefix)
    except SessionUnavailableError as err:
        if not keyed:
            raise Problem(
                "unavailable",
                f"session {session_id!r} is too busy to say whether it took this request already ({err.last_error}); "
                f"the message was not sent: send the same request again after {UNAVAILABLE_RETRY_AFTER_SECONDS} s "
                "(or with an Idempotency-Key, which is sent without asking)",
                headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
            ) from err
        log.warning("session %s did not say which messages it took (%s); sent under its Idempotency-Key", session_id, err)
        return None
    except HermesError as err:
        log.warning("session %s did not say which messages it took (%s): a retry may run again", session_id, err)
        return None
