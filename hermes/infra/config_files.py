"""Reading the configuration files users write (tool files, MCP configs): JSON or YAML
by extension, strict about what silently hides mistakes (a key written twice, comments
in JSON, alias bombs), with errors that name the file, the line and what was expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hermes.errors import ConfigError

EXTENSIONS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}


class DuplicateKey(Exception):
    pass


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


MAX_YAML_ALIASES = 100
"""Anchors/aliases are for sharing a few blocks (headers, schemas); more is refused."""


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (a silent
    override would hide a mistake)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {first[key] + 1}); expected each key once",
                        key_node.start_mark,
                    )
                first[key] = key_node.start_mark.line
            except TypeError:
                pass  # an unhashable key: the base loader reports it
        return super().construct_mapping(node, deep=deep)


def read_document(path: Path, source: str, *, what: str, expected: str) -> Any:
    """The decoded contents of a JSON or YAML configuration file.

    Args:
        path: the file; ``.json``, ``.yaml`` or ``.yml``.
        source: how errors name it.
        what: what kind of file it is, for messages ("tool file").
        expected: what its top level should hold, for messages ("a `tools` list").

    Raises:
        ConfigError: a missing or unreadable file, a wrong extension, invalid JSON/YAML
            (with line and column), a duplicate key, too many YAML aliases.
    """
    kind = EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"expected a {what} ending in .json, .yaml or .yml; found {path.suffix or 'no extension'!r}",
            source=source,
        )
    try:
        text = path.read_text(encoding="utf-8-sig")  # editors on Windows may write a BOM
    except FileNotFoundError:
        raise ConfigError(f"{what} not found; expected an existing JSON or YAML file", source=source) from None
    except IsADirectoryError:
        raise ConfigError(f"is a directory; expected a JSON or YAML {what}", source=source) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"expected UTF-8 text; found an undecodable byte at offset {err.start}", source=source
        ) from None
    except OSError as err:
        raise ConfigError(f"cannot read the {what}: {err.strerror or err}", source=source) from None
    if kind == "JSON":
        try:
            return json.loads(text, object_pairs_hook=unique_pairs)
        except json.JSONDecodeError as err:
            comment = text[err.pos : err.pos + 2] in ("//", "/*")
            hint = " (JSON has no comments; remove them or use a .yaml file)" if comment else ""
            raise ConfigError(
                f"not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}{hint}; expected a JSON object "
                f"with {expected}",
                source=source,
            ) from None
        except DuplicateKey as err:
            raise ConfigError(
                f"duplicate key {err.args[0]!r} in one object; expected each key once", source=source
            ) from None
    try:
        aliases = sum(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader))
        if aliases > MAX_YAML_ALIASES:
            raise ConfigError(
                f"{aliases} YAML aliases; expected at most {MAX_YAML_ALIASES} (nested aliases can expand "
                "exponentially: a 'billion laughs' file would stall the worker)",
                source=source,
            )
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = "; ".join(p for p in (err.context, err.problem) if p)
        if "expected" not in problem:
            problem += f"; expected a YAML mapping with {expected}"
        raise ConfigError(f"not valid YAML{where}: {problem}", source=source) from None
    except yaml.YAMLError as err:
        raise ConfigError(
            f"not valid YAML: {err}; expected a YAML mapping with {expected}", source=source
        ) from None
