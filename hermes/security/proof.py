"""The proof a command carries of who sent it (issue 26): a leaf model, imported by the
session's and the memory workflows' payloads; made and checked by :mod:`hermes.security.command_auth`."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

__all__ = ["CommandProof"]


class CommandProof(BaseModel, frozen=True):
    """Who sent a command, as the holder of a command key vouches (:mod:`hermes.security.command_auth`):
    an HMAC-SHA256 over the command's name, session, sender, roles, issue time and payload
    digest. Sessions refuse commands without a valid one (issue 26)."""

    key_id: str
    """The command key that made ``mac`` (the first of the signer's ring)."""
    sender: str
    """The user id the key holder authenticated (e.g. by an API key)."""
    roles: list[str] = Field(default_factory=list)
    """The sender's roles as the key holder knows them; ``admin`` may post into another
    user's session (the message is recorded as the admin's)."""
    issued_at: datetime
    """UTC; a proof older than :data:`hermes.security.command_auth.MAX_AGE` is stale."""
    mac: str
    """Hex HMAC-SHA256 (:func:`hermes.security.command_auth.sign`)."""
