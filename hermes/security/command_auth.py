"""Commands authenticated in the workflow: a proof of who sent each command (issue 26).

Anyone who reaches the Temporal frontend can start a workflow, send a signal or an update;
an identity checked only at the HTTP door is no identity. So every command that acts on a
session (the start of a session, a message, an approval decision, a cancel, a close, a
system-prompt change) carries a :class:`hermes.models.CommandProof`: an HMAC-SHA256
(RFC 2104) by a **command key** that the API, the CLI and the Python client hold, over the
command's name, the session id, the sender and roles the key holder vouches for, the time
it was issued and a SHA-256 digest of the command's payload. The session workflow checks
it against the worker's key ring (:func:`active`) in workflow code: a client that reaches
Temporal without a command key can act as nobody. A forged, altered, stale or replayed
command is refused and recorded (the state's ``notices``, a decision record, the worker
log, the ``hermes.commands.refused`` metric); it never fails a workflow task.

Keys (:func:`ring_from_settings`): ``HERMES_COMMAND_KEYS`` ("id:base64key,..."), or
``HERMES_COMMAND_KEY_FILE`` (one ``id base64key`` per line, ``#`` comments), each at least
16 bytes; unset, ``<data_dir>/command-keys`` (made on first use, mode 0600), which is what
``hermes dev`` and ``hermes demo`` share with the clients on the same machine. The first
key signs, every listed key verifies: a rotation puts the new key first and keeps the old
ones after it while sessions whose histories hold commands signed with them are open (a
worker replaying such a history verifies those commands again, as the encryption codec
decrypts old payloads again).

The payload digest is over :func:`canonical`: the payload's JSON with fields at their
default left out and keys sorted, so a client and a worker one release apart (a new field
with a default) agree on it.

Plain Python (``hmac``, ``hashlib``, ``json``): workflow code calls :func:`verify`.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from hermes.errors import ConfigError
from hermes.security.keyfiles import key_setting, new_key, parse_key_entries
from hermes.security.proof import CommandProof

if TYPE_CHECKING:
    from hermes.settings import Settings

VERSION = "hermes-command-v1"
"""The first line of every MAC'd message; a new format gets a new version."""
MAX_AGE = timedelta(hours=6)
"""By default a proof older than this (by the workflow's clock when the command is handled)
is stale: long enough for a command queued while every worker was down for hours, short
enough that a proof read from an old history cannot be sent again
(``HERMES_COMMAND_MAX_AGE_SECONDS``)."""
MAX_SKEW = timedelta(minutes=5)
"""A proof issued this far in the future of the workflow's clock is still taken (clients'
clocks drift)."""
MIN_KEY_BYTES = 16
DEFAULT_KEY_FILE = "command-keys"
"""The key file made in ``data_dir`` when no key is configured."""
ADMIN = "admin"
"""The role that acts for any user (posts into another's session, starts a consolidation)."""


@dataclass(frozen=True)
class CommandKeyRing:
    """Command keys: ``current`` signs, every key in ``keys`` verifies."""

    keys: Mapping[str, bytes]
    current: str
    source: str = ""
    """Where the keys came from (a setting or a file), for messages."""
    max_age: timedelta | None = MAX_AGE
    """How old a proof this ring verifies may be (``HERMES_COMMAND_MAX_AGE_SECONDS``; None:
    any age, for Temporal's time-skipping test server, whose workflow clock runs ahead of
    the clients')."""

    def __post_init__(self) -> None:
        if self.current not in self.keys:
            raise ValueError(f"the current key {self.current!r} is not among the keys")


def canonical(payload: Any) -> bytes:
    """The bytes a proof's payload digest is over.

    Args:
        payload: a pydantic model (its JSON without fields at their default and without
            ``proof``, keys sorted), or any JSON value (``None`` for a command without
            one).
    """
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json", exclude_defaults=True, exclude={"proof"})
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _message(command: str, session_id: str, key_id: str, sender: str, roles: Iterable[str], issued_at: datetime, payload: Any) -> bytes:
    digest = hashlib.sha256(canonical(payload)).hexdigest()
    stamp = issued_at.isoformat(timespec="microseconds")
    return "\n".join((VERSION, key_id, command, session_id, sender, ",".join(sorted(roles)), stamp, digest)).encode(
        "utf-8", "surrogatepass"
    )


def sign(
    ring: CommandKeyRing,
    command: str,
    session_id: str,
    payload: Any,
    *,
    sender: str,
    roles: Iterable[str] = (),
    now: datetime,
) -> CommandProof:
    """A proof that the holder of ``ring``'s current key sends ``command`` as ``sender``.

    Args:
        ring: the signer's key ring.
        command: the wire name (``hermes.names``: ``send_message``, ``approve_tool_call``...;
            ``start_session`` for a session's start input).
        session_id: the session it is for.
        payload: the command's payload (see :func:`canonical`).
        sender: the user id the key holder vouches sent it (it authenticated them).
        roles: the sender's roles as the key holder knows them (``admin`` lets a sender
            post into another user's session).
        now: when it is issued (UTC).
    """
    roles = sorted(set(roles))
    key = ring.keys[ring.current]
    mac = hmac.new(key, _message(command, session_id, ring.current, sender, roles, now, payload), hashlib.sha256)
    return CommandProof(key_id=ring.current, sender=sender, roles=roles, issued_at=now, mac=mac.hexdigest())


def verify(
    ring: CommandKeyRing | None, command: str, session_id: str, payload: Any, proof: CommandProof | None, *, now: datetime,
    any_age: bool = False,
) -> str | None:
    """Whether ``proof`` proves ``command`` on ``session_id`` with ``payload``.

    Deterministic for a given ring: workflow code calls it (a worker replaying a history
    checks its commands again with the same keys).

    Args:
        ring: the worker's key ring (None: no key, so nothing is proven).
        now: the workflow's clock.
        any_age: take a proof of any age (an input a Temporal Schedule starts runs with
            again and again); else at most the ring's ``max_age``.

    Returns:
        None when it holds, else why not (one line, for a notice and the log).
    """
    if proof is None:
        return "it carries no proof of its sender (sent by a client without a Hermes command key)"
    if ring is None:
        return "this worker has no command key to check its proof with"
    key = ring.keys.get(proof.key_id)
    if key is None:
        return f"its proof names key {proof.key_id!r}, which this worker does not hold"
    expected = hmac.new(
        key, _message(command, session_id, proof.key_id, proof.sender, proof.roles, proof.issued_at, payload), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, proof.mac):
        return "its proof does not match the command (forged or altered)"
    if proof.issued_at > now + MAX_SKEW:
        return f"its proof was issued in the future ({proof.issued_at.isoformat(timespec='seconds')})"
    max_age = None if any_age else ring.max_age
    if max_age is not None and now - proof.issued_at > max_age:
        return f"its proof is stale (issued {proof.issued_at.isoformat(timespec='seconds')}, more than {max_age} ago)"
    return None


def acts_for(proof: CommandProof, owner: str | None) -> bool:
    """Whether ``proof``'s sender may act for ``owner`` (a session's or a memory writer's
    user): it is them, or it has the ``admin`` role. ``owner`` None: only an admin."""
    return (owner is not None and proof.sender == owner) or ADMIN in proof.roles


def proof_now(
    command: str, target: str, payload: Any, *, sender: str, roles: Iterable[str] = (), ring: CommandKeyRing | None = None
) -> CommandProof:
    """:func:`sign` by ``ring`` (default: this process', :func:`active`), issued now: the
    proof a client sends along with a command.

    Args:
        target: the workflow the command is for (a session id, a memory writer's id).
    """
    return sign(ring or active(), command, target, payload, sender=sender, roles=roles, now=datetime.now(timezone.utc))


M = TypeVar("M", bound=BaseModel)


def signed(
    payload: M, command: str, target: str, *, sender: str, roles: Iterable[str] = (), ring: CommandKeyRing | None = None
) -> M:
    """``payload`` with its ``proof`` field set (:func:`proof_now`)."""
    proof = proof_now(command, target, payload, sender=sender, roles=roles, ring=ring)
    return payload.model_copy(update={"proof": proof})


def parse_args(args: Sequence[Any], shape: Sequence[Any]) -> list[Any] | str:
    """A signal's raw arguments as ``shape`` says (a type each; trailing optional ones may be
    left out), or why they are not (another type, more of them): what a workflow's signal
    handler taking ``*args`` checks, so whatever a client sends is refused, never a failed
    workflow task. Deterministic: the same arguments parse the same on replay."""
    if len(args) > len(shape) or any(not _optional(kind) for kind in shape[len(args):]):
        return f"{len(args)} arguments where {len(shape)} are expected"
    try:
        return [_adapter(kind).validate_python(value) for kind, value in zip(shape, args)] + [None] * (len(shape) - len(args))
    except ValidationError as err:
        return f"malformed arguments ({err.error_count()} errors: {err.errors()[0]['msg']})"


def _optional(kind: Any) -> bool:
    return type(None) in getattr(kind, "__args__", ())


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


# ----------------------------------------------------------------------------- keys


def parse_keys(text: str, *, source: str, separator: str) -> CommandKeyRing:
    """A key ring from ``id:base64`` (``separator`` ",") or ``id base64`` lines ("\n")
    (:func:`hermes.security.keyfiles.parse_key_entries`).

    Raises:
        ConfigError: an entry is malformed, a key id repeats, a key is not base64 of at
            least 16 bytes, or there is no key; naming ``source`` and the entry.
    """

    def size_error(key_id: str, size: int) -> str | None:
        if size >= MIN_KEY_BYTES:
            return None
        return f"the command key {key_id!r} is {size} bytes; at least {MIN_KEY_BYTES} expected (`hermes command-key` makes a 32-byte one)"

    keys = parse_key_entries(text, source=source, separator=separator, size_error=size_error)
    return CommandKeyRing(keys=keys, current=next(iter(keys)), source=source)


def format_keys(ring: CommandKeyRing) -> str:
    """``ring`` as ``HERMES_COMMAND_KEYS`` takes it (the signing key first): what to give a
    process that must share this one's ring (a worker, an API server)."""
    order = [ring.current] + [k for k in ring.keys if k != ring.current]
    return ",".join(f"{k}:{base64.b64encode(ring.keys[k]).decode()}" for k in order)


def default_key_file(path: Path) -> CommandKeyRing:
    """The key ring in ``path``, made first (one new key, mode 0600) when it does not exist.

    Several processes starting at once make it once: the file is written aside and linked
    into place, and a process that loses the race reads the winner's.

    Raises:
        ConfigError: it cannot be made or read.
    """
    path = Path(path).expanduser()
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            aside = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(
                    "# Hermes command keys (made by the first process that needed one): the first signs, all verify.\n"
                    f"local-{os.urandom(3).hex()} {new_key()}\n"
                )
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            finally:
                aside.unlink(missing_ok=True)
        except OSError as err:
            raise ConfigError(f"cannot make the command key file: {err.strerror or err}", source=str(path)) from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read the command key file: {err.strerror or err}", source=str(path)) from None
    return parse_keys(text, source=str(path), separator="\n")


def ring_from_settings(settings: Settings) -> CommandKeyRing:
    """The command key ring the settings name: ``HERMES_COMMAND_KEYS``, else
    ``HERMES_COMMAND_KEY_FILE``, else ``<data_dir>/command-keys`` (made when missing).

    Raises:
        ConfigError: both settings are set, the file cannot be read or made, or a key is
            malformed.
    """
    value = settings.command_keys.get_secret_value() if settings.command_keys is not None else ""
    found = key_setting(value, settings.command_key_file, variable="HERMES_COMMAND_KEYS", file_variable="HERMES_COMMAND_KEY_FILE")
    if found is not None:
        ring = parse_keys(found[0], source=found[1], separator=found[2])
    else:
        ring = default_key_file(settings.data_dir / DEFAULT_KEY_FILE)
    seconds = settings.command_max_age_seconds
    return dataclasses.replace(ring, max_age=timedelta(seconds=seconds) if seconds > 0 else None)


_ACTIVE: CommandKeyRing | None = None


def activate(ring: CommandKeyRing | None) -> None:
    """Make ``ring`` the one this process signs and verifies commands with (called where
    clients and workers connect, from their settings)."""
    global _ACTIVE
    _ACTIVE = ring


def activate_from(settings: Settings) -> CommandKeyRing:
    """:func:`ring_from_settings`, made this process' ring.

    Raises:
        ConfigError: as :func:`ring_from_settings`.
    """
    ring = ring_from_settings(settings)
    activate(ring)
    return ring


def ensure(settings: Settings) -> CommandKeyRing:
    """This process' ring, activated from ``settings`` when none is yet (what clients and
    workers call when they connect or are built; a process keeps one ring, as it keeps one
    encryption key ring).

    Raises:
        ConfigError: as :func:`ring_from_settings`.
    """
    return _ACTIVE if _ACTIVE is not None else activate_from(settings)


def active() -> CommandKeyRing:
    """This process' ring; the settings' (:func:`hermes.settings.get_settings`) when none
    was activated.

    Raises:
        ConfigError: as :func:`ring_from_settings`.
    """
    if _ACTIVE is None:
        from hermes.settings import get_settings

        return activate_from(get_settings())
    return _ACTIVE


def worker_ring() -> CommandKeyRing | None:
    """The ring workflow code verifies with: the activated one (never reads settings or
    files: workflow code does no I/O; a worker activates its ring when it is built)."""
    return _ACTIVE
