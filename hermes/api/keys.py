"""API keys of ``hermes serve``: who a request is, from ``Authorization: Bearer <key>``.

The key file (``HERMES_API_KEYS_FILE``, default ``.hermes/api_keys.yaml``; YAML, so JSON
too) holds one entry per key, never the key itself::

    keys:
      - key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        user_id: alice
        roles: [user]
      - key_sha256: ...
        user_id: ops
        roles: [user, approver]

Roles: ``user`` reaches the sessions and memories of its ``user_id``; ``approver`` may
also decide any session's pending approvals; ``admin`` reaches every session.
``hermes keys add --user U --role R`` makes a random key, prints it once and stores
only its SHA-256. A key is a random 256-bit token, so an unsalted SHA-256 cannot be
reversed by guessing; it is compared with :func:`hmac.compare_digest` against every
entry, so the time taken does not say which entry nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from hermes.errors import ConfigError

__all__ = ["ApiKeyEntry", "Identity", "KeyFile", "KeyRing", "Role", "add_key", "hash_key", "KEY_PREFIX"]

Role = Literal["user", "approver", "admin"]

KEY_PREFIX = "hk_"
"""Start of every generated key, so a leaked one is recognisable (secret scanners)."""


def hash_key(key: str) -> str:
    """The hex SHA-256 of ``key`` (UTF-8): what the key file stores."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiKeyEntry(BaseModel):
    """One key of the key file."""

    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex SHA-256 of the key (lower case)."""
    user_id: str = Field(min_length=1, max_length=512)
    """The identity the key acts as: owner of the sessions it creates, approver of record."""
    roles: list[Role] = Field(default_factory=lambda: ["user"], min_length=1)
    label: str = ""
    """Free text for the operator (who holds the key, what for)."""
    created_at: datetime | None = None


class KeyFile(BaseModel):
    """The key file's content."""

    keys: list[ApiKeyEntry] = Field(default_factory=list)


class Identity(BaseModel, frozen=True):
    """Who a request is: the key's user and roles."""

    user_id: str
    roles: frozenset[Role]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def is_approver(self) -> bool:
        """May decide approvals of sessions not its own (``approver`` or ``admin``)."""
        return bool(self.roles & {"approver", "admin"})

    def may_use(self, owner: str) -> bool:
        """Whether this identity reaches a session (or memories) of ``owner``."""
        return self.is_admin or hmac.compare_digest(self.user_id.encode(), owner.encode())

    def may_decide(self, owner: str) -> bool:
        """Whether this identity may approve or reject tool calls of a session of ``owner``."""
        return self.is_approver or self.may_use(owner)


def read_key_file(path: Path) -> KeyFile:
    """The key file at ``path``; an absent file holds no keys.

    Raises:
        ConfigError: the file is not YAML/JSON of the documented shape (naming the entry).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return KeyFile()
    except OSError as err:
        raise ConfigError(f"cannot read the API key file: {err}", source=str(path)) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"not YAML or JSON: {err}", source=str(path)) from None
    try:
        return KeyFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{first['msg']} (expected {{keys: [{{key_sha256, user_id, roles}}]}})", source=str(path), key=where) from None


def add_key(path: Path, user_id: str, roles: list[Role], *, label: str = "") -> str:
    """Make a new random key for ``user_id``, add its hash to the key file at ``path``
    (created with mode 0600 if absent; replaced atomically) and return the key, which is
    stored nowhere.

    Returns:
        The key: ``hk_`` and 43 URL-safe characters (256 random bits).

    Raises:
        ConfigError: the existing file cannot be read (it is left as it was).
        pydantic.ValidationError: an empty ``user_id`` or ``roles``.
    """
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    entry = ApiKeyEntry(
        key_sha256=hash_key(key), user_id=user_id, roles=roles, label=label, created_at=datetime.now(timezone.utc)
    )
    current = read_key_file(path)
    current.keys.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(current.model_dump(mode="json", exclude_defaults=True), sort_keys=False, allow_unicode=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return key


class KeyRing:
    """The keys of one key file, read again whenever the file changes (size or mtime),
    so a key added with ``hermes keys add`` works without restarting the server.

    Args:
        path: the key file.

    Raises:
        ConfigError: the file exists and is malformed (at construction; a malformed
            rewrite later keeps the last good keys and is reported in :attr:`error`).
    """

    def __init__(self, path: Path):
        self.path = path
        self.error: str | None = None
        self._stamp: tuple[int, int] | None = None
        self._entries: list[ApiKeyEntry] = []
        self._reload(strict=True)

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)

    def _reload(self, *, strict: bool = False) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp and self._stamp is not None:
            return
        try:
            self._entries = read_key_file(self.path).keys
            self.error = None
        except ConfigError as err:
            if strict:
                raise
            self.error = str(err)
        self._stamp = stamp

    def __len__(self) -> int:
        self._reload()
        return len(self._entries)

    def identify(self, key: str) -> Identity | None:
        """The identity of ``key``, or None for an unknown key. Every entry is compared
        (constant time per comparison, no early exit)."""
        self._reload()
        digest = hash_key(key).encode()
        found: ApiKeyEntry | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.key_sha256.encode()) and found is None:
                found = entry
        if found is None:
            return None
        return Identity(user_id=found.user_id, roles=frozenset(found.roles))
