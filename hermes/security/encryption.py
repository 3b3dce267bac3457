"""Encryption at rest: Temporal payloads and Redis copies of message bodies (issue 17).

Conversations are personal data; without this, Temporal's history holds every message in
clear. With keys configured, clients and workers encode every payload with AES-256-GCM
(``cryptography``'s ``AESGCM``, a 96-bit random nonce per payload, the key id as associated
data) through a Temporal payload codec (:class:`EncryptionCodec`,
https://docs.temporal.io/payload-codec), so history, the Web UI and ``temporal workflow
show`` see only ciphertext; the codec server (``hermes codec-server``) decrypts for the Web
UI, with a bearer token, for the UI's origin only. Failures are encoded as well (their
message and stack trace). Every Redis copy of a message, a tool argument or a tool result
is sealed with the same keys (:func:`seal` / :func:`open_sealed`, :func:`open_quietly`):
bodies, turn events, session index rows, the approval audit, the exactly-once ledger, the
transcript archive and snapshots; README "Encryption at rest" lists the keys and what
stays clear. While a key ring is active, :mod:`hermes.security.redaction` keeps tool-call content
out of library log lines too.

Keys (:func:`keyring_from_settings`): ``HERMES_ENCRYPTION_KEYS`` ("id:base64key,..."), or
``HERMES_ENCRYPTION_KEY_FILE`` (one ``id base64key`` per line, ``#`` comments); each key 16,
24 or 32 bytes (32: AES-256, what ``hermes encryption new-key`` makes). The first key
encrypts; every listed key decrypts, so a rotation is: put the new key first, keep the old
ones after it while sessions written with them live. A payload's ``encryption-key-id``
metadata names its key. Payloads written before encryption was switched on (no such
metadata) are read as they are.

What stays clear: search attributes (Temporal indexes them; Hermes puts no message text in
them: user id, channel, status, pending approvals), workflow and activity type names, ids,
timers, failure types; Redis key names, sorted-set members and scores (ids, times),
counters; content references (``m:<hash>``) are hashes of the text, not the text.

Errors: :class:`hermes.errors.ConfigError` for a bad key setting (naming the setting and
what was expected); decoding a payload whose key is not configured raises
:class:`UnknownKeyError` naming the key id.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from temporalio.converter import PayloadCodec

from hermes.errors import HermesError
from hermes.security.keyfiles import key_setting, parse_key_entries

if TYPE_CHECKING:
    from hermes.settings import Settings

log = logging.getLogger("hermes.encryption")

ENCODING = b"binary/encrypted"
"""The ``encoding`` metadata of an encrypted payload (the value Temporal's samples use)."""
KEY_ID_METADATA = "encryption-key-id"
NONCE_BYTES = 12
SEALED_PREFIX = "enc:v1:"
"""A Redis value encrypted by :meth:`KeyRing.seal`: ``enc:v1:<key id>:<base64 nonce+ciphertext>``."""


class UnknownKeyError(HermesError):
    """A payload or value was encrypted with a key that is not configured."""

    def __init__(self, key_id: str, known: Iterable[str]):
        self.key_id = key_id
        super().__init__(
            f"encrypted with key {key_id!r}, which is not configured (configured: {', '.join(known) or 'none'}); "
            "keep old keys after the new one in HERMES_ENCRYPTION_KEYS / HERMES_ENCRYPTION_KEY_FILE"
        )


@dataclass(frozen=True)
class KeyRing:
    """Encryption keys: ``current`` encrypts, every key in ``keys`` decrypts."""

    keys: Mapping[str, bytes]
    current: str

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ValueError(f"the current key {self.current!r} is not among the keys")

    def _aead(self, key_id: str) -> Any:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            return AESGCM(self.keys[key_id])
        except KeyError:
            raise UnknownKeyError(key_id, self.keys) from None

    def encrypt(self, data: bytes) -> tuple[str, bytes]:
        """``(key id, nonce + ciphertext)`` of ``data`` under the current key."""
        nonce = os.urandom(NONCE_BYTES)
        return self.current, nonce + self._aead(self.current).encrypt(nonce, data, self.current.encode())

    def decrypt(self, key_id: str, sealed: bytes) -> bytes:
        """The plaintext of ``sealed`` (nonce + ciphertext) under ``key_id``.

        Raises:
            UnknownKeyError: ``key_id`` is not configured.
            cryptography.exceptions.InvalidTag: the data or its key id was altered.
        """
        return self._aead(key_id).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], key_id.encode())

    def seal(self, text: str) -> str:
        """``text`` encrypted, as text (for Redis): ``enc:v1:<key id>:<base64>``."""
        key_id, sealed = self.encrypt(text.encode("utf-8", "surrogatepass"))
        return f"{SEALED_PREFIX}{key_id}:{base64.b64encode(sealed).decode()}"

    def open(self, value: str) -> str:
        """The text :meth:`seal` sealed; a value that is not sealed (written before
        encryption was on) is returned as it is."""
        if not value.startswith(SEALED_PREFIX):
            return value
        key_id, _, data = value[len(SEALED_PREFIX):].partition(":")
        return self.decrypt(key_id, base64.b64decode(data)).decode("utf-8", "surrogatepass")


class EncryptionCodec(PayloadCodec):
    """A Temporal payload codec encrypting every payload with a :class:`KeyRing`.

    Encoded payloads carry ``encoding: binary/encrypted`` and ``encryption-key-id``; decoding
    passes payloads without that encoding through unchanged (written before encryption),
    unless ``refuse_clear``: then each becomes :data:`REFUSED_CLEAR`, which no command's
    type accepts, so a command sent in clear (by a client without the encryption key) is
    refused where it arrives (a signal refused and noted, an update or query failed)
    instead of being taken. Set it after the cut-over (README 'Encryption at rest'): once
    no open session's current run holds a payload written in clear, since a run replayed
    from such a history could not read it.
    """

    def __init__(self, keyring: KeyRing, *, refuse_clear: bool = False):
        self.keyring = keyring
        self.refuse_clear = refuse_clear

    async def encode(self, payloads: Sequence[Any]) -> list[Any]:
        from temporalio.api.common.v1 import Payload

        out = []
        for payload in payloads:
            key_id, sealed = self.keyring.encrypt(payload.SerializeToString())
            out.append(Payload(metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id.encode()}, data=sealed))
        return out

    async def decode(self, payloads: Sequence[Any]) -> list[Any]:
        from temporalio.api.common.v1 import Payload

        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(_refused_clear() if self.refuse_clear else payload)
                continue
            key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode()
            out.append(Payload.FromString(self.keyring.decrypt(key_id, payload.data)))
        return out


REFUSED_CLEAR = b'{"hermes_refused": "a payload in clear where encryption is required"}'
"""What a clear payload decodes to with ``refuse_clear``: a JSON object no command's type
(a message, a decision, a proof, a session's input) validates as."""


def _refused_clear() -> Any:
    from temporalio.api.common.v1 import Payload

    return Payload(metadata={"encoding": b"json/plain"}, data=REFUSED_CLEAR)


def data_converter(keyring: KeyRing | None, *, refuse_clear: bool = False) -> Any:
    """Hermes' data converter (pydantic), with the encryption codec when ``keyring`` is set.

    With a key ring, failures are encoded too (Temporal's
    ``DefaultFailureConverterWithEncodedAttributes``): a failure's message and stack trace
    move into an encrypted payload, since an error can quote what it failed on (a tool's
    arguments, a URL built from them); history keeps only "Encoded failure".
    """
    import dataclasses

    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.converter import DefaultFailureConverterWithEncodedAttributes

    if keyring is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=EncryptionCodec(keyring, refuse_clear=refuse_clear),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def converter_for(settings: Settings) -> Any:
    """The data converter of a client or worker made with ``settings``: the key ring they
    name (if any) is read, made this process' content-store key ring (:func:`activate`)
    and put in the converter's payload codec (refusing payloads in clear with
    ``HERMES_ENCRYPTION_REFUSE_CLEAR``).

    Raises:
        ConfigError: a bad key setting (see :func:`keyring_from_settings`).
    """
    keyring = keyring_from_settings(settings)
    activate(keyring)
    return data_converter(keyring, refuse_clear=settings.encryption_refuse_clear)


def parse_keys(text: str, *, source: str, separator: str) -> KeyRing:
    """A key ring from ``id:base64`` (or ``id base64``) entries separated by ``separator``
    (:func:`hermes.security.keyfiles.parse_key_entries`).

    Raises:
        ConfigError: an entry is malformed, a key id repeats, a key is not base64 of 16,
            24 or 32 bytes, or there is no key; naming ``source`` and the entry.
    """

    def size_error(key_id: str, size: int) -> str | None:
        if size in (16, 24, 32):
            return None
        return (
            f"the key {key_id!r} is {size} bytes; expected 16, 24 or 32 (AES-128/192/256; "
            "`hermes encryption new-key` makes a 32-byte one)"
        )

    keys = parse_key_entries(text, source=source, separator=separator, size_error=size_error)
    return KeyRing(keys=keys, current=next(iter(keys)))


def keyring_from_settings(settings: Settings) -> KeyRing | None:
    """The key ring the settings name (None: encryption off).

    Raises:
        ConfigError: both ``HERMES_ENCRYPTION_KEYS`` and ``HERMES_ENCRYPTION_KEY_FILE`` are
            set, the file cannot be read, or a key is malformed.
    """
    value = settings.encryption_keys.get_secret_value() if settings.encryption_keys is not None else ""
    found = key_setting(
        value, settings.encryption_key_file, variable="HERMES_ENCRYPTION_KEYS", file_variable="HERMES_ENCRYPTION_KEY_FILE"
    )
    return parse_keys(found[0], source=found[1], separator=found[2]) if found is not None else None


_ACTIVE: KeyRing | None = None


def activate(keyring: KeyRing | None) -> None:
    """Make ``keyring`` the one this process seals Redis copies of content with (the stores
    read :func:`active`), and keep tool-call content out of log lines while one is active
    (:func:`hermes.security.redaction.withhold_content`); called where clients and workers connect."""
    from hermes.security import redaction

    global _ACTIVE
    _ACTIVE = keyring
    redaction.withhold_content(keyring is not None)


def active() -> KeyRing | None:
    """The key ring of this process (None: values are stored in clear)."""
    return _ACTIVE


def seal(text: str) -> str:
    """``text`` sealed with this process' key ring (:meth:`KeyRing.seal`), or as it is
    when encryption is off: what Redis copies of message text go through."""
    return _ACTIVE.seal(text) if _ACTIVE is not None else text


def open_sealed(value: str) -> str:
    """``value`` opened with this process' key ring; a value that is not sealed is
    returned as it is.

    Raises:
        UnknownKeyError: it is sealed and this process has no key ring, or not its key.
        cryptography.exceptions.InvalidTag, ValueError: the value was altered.
    """
    if not value.startswith(SEALED_PREFIX):
        return value
    if _ACTIVE is None:
        raise UnknownKeyError(value[len(SEALED_PREFIX):].split(":", 1)[0], ())
    return _ACTIVE.open(value)


def open_quietly(value: str | bytes | None, *, what: str) -> str | None:
    """``value`` (a Redis value, maybe sealed) opened, or None when there is none or it
    cannot be opened here (no key ring, a key no longer configured, altered data): the
    caller treats it as missing, as the stores do with a miss, and a warning naming
    ``what`` (never the value) is logged.

    Args:
        value: the value as Redis returned it (bytes or text), or None.
        what: what the value is, for the warning (e.g. ``"approval audit entry s-1/e-2"``).
    """
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    try:
        return open_sealed(text)
    except Exception as err:  # noqa: BLE001 - UnknownKeyError, InvalidTag, bad base64: missing
        log.warning("%s cannot be decrypted here (%s: %s); treated as missing", what, type(err).__name__, err)
        return None
