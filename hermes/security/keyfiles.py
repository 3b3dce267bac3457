"""Key rings in settings: ``"<id>:<base64>,..."`` in a variable or ``<id> <base64>`` lines in a
file, the first key the one that writes. Shared by the encryption keys
(:mod:`hermes.security.encryption`) and the command keys (:mod:`hermes.security.command_auth`), which differ
only in the key sizes they take and in the names of their settings.

Errors are :class:`hermes.errors.ConfigError`, naming the setting or file and the entry.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable
from pathlib import Path

from hermes.errors import ConfigError

KEY_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def parse_key_entries(text: str, *, source: str, separator: str, size_error: Callable[[str, int], str | None]) -> dict[str, bytes]:
    """The keys of ``text``, in order (the first writes).

    Args:
        text: ``id:base64`` entries separated by ``separator`` ``","``, or ``id base64``
            lines (``separator`` ``"\\n"``, ``#`` comments).
        source: the setting or file, for errors.
        size_error: why a key of ``n`` bytes with id ``key_id`` is refused (None: taken).

    Raises:
        ConfigError: an entry is malformed, a key id repeats, a key is not base64 or is
            refused by ``size_error``, or there is no key.
    """
    keys: dict[str, bytes] = {}
    for number, raw in enumerate(text.split(separator), start=1):
        entry = raw.split("#", 1)[0].strip() if separator == "\n" else raw.strip()
        if not entry:
            continue
        parts = [p.strip() for p in entry.partition(":")[::2]] if separator == "," else entry.split()
        if len(parts) != 2 or not parts[1] or not KEY_ID_RE.match(parts[0]):
            sep = ":" if separator == "," else " "
            raise ConfigError(
                f"expected '<key id>{sep}<base64 key>' with a key id of letters, digits, '.', '_' or '-' (at most 64); "
                f"found something else at entry {number}",
                source=source,
            )
        key_id, encoded = parts
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"the key {key_id!r} is not valid base64", source=source) from None
        refusal = size_error(key_id, len(key))
        if refusal is not None:
            raise ConfigError(refusal, source=source)
        if key_id in keys:
            raise ConfigError(f"the key id {key_id!r} is listed twice", source=source)
        keys[key_id] = key
    if not keys:
        raise ConfigError("no key is listed", source=source)
    return keys


def new_key() -> str:
    """A new random 32-byte key, base64 (``hermes encryption-key``, ``hermes command-key``)."""
    return base64.b64encode(os.urandom(32)).decode()


def key_setting(value: str, path: Path | None, *, variable: str, file_variable: str) -> tuple[str, str, str] | None:
    """Where a key ring is configured: ``(text, source, separator)`` of the variable's value
    or of the file, or None when neither is set.

    Raises:
        ConfigError: both are set, or the file cannot be read.
    """
    if value and path:
        raise ConfigError(f"set {variable} or {file_variable}, not both", source=variable)
    if value:
        return value, variable, ","
    if path:
        try:
            return Path(path).expanduser().read_text(encoding="utf-8"), str(path), "\n"
        except OSError as err:
            raise ConfigError(f"cannot read the key file: {err.strerror or err}", source=str(path)) from None
    return None
