"""The root ``hermes`` Typer app and the options several command groups share.

The command modules (:mod:`hermes.cli.stack`, :mod:`hermes.cli.conversation`, ...)
register their commands on :data:`app`; :mod:`hermes.cli` imports them in the order
``hermes --help`` lists them.
"""

from __future__ import annotations

import getpass
import sys
from typing import Annotated, Any, NoReturn

import typer

from hermes.cli.errors import EXIT_REFUSED, print_settings_error
from hermes.infra.process import exit_now

__all__ = ["HermesTyper", "JsonOption", "UserOption", "app", "default_user"]


class HermesTyper(typer.Typer):
    """A Typer app whose process exit skips interpreter finalization.

    The Temporal SDK's Rust threads can call into Python while CPython finalizes and
    abort the process ("Fatal Python error: PyGILState_Release", exit -6) after the
    command has succeeded: temporalio/sdk-python#300, seen here in about one run in
    twenty. So, like other short-lived Temporal clients, the CLI runs the ``atexit``
    handlers, flushes its output and leaves with ``os._exit``. Only the process entry
    point (``hermes`` / ``python -m hermes.cli``) goes through here; Typer's test
    runner calls the command directly.
    """

    def command(self, name: str | None = None, **kwargs: Any) -> Any:
        """Typer's ``command``, with the list's one-line help made from the docstring's
        first paragraph, its line breaks joined (rich kept them: a description wrapped in
        the source came out ragged in ``hermes --help``)."""
        if "short_help" in kwargs:
            return super().command(name, **kwargs)

        def register(function: Any) -> Any:
            first = (function.__doc__ or "").strip().split("\n\n", 1)[0]
            short = " ".join(first.split()) or None
            return typer.Typer.command(self, name, short_help=short, **kwargs)(function)

        return register

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        try:
            super().__call__(*args, **kwargs)
            code: Any = 0
        except SystemExit as exit_:
            code = exit_.code
        except BaseException as err:  # noqa: BLE001 - printed like an uncaught exception
            if _is_settings_error(err):
                # A bad setting (HERMES_* variable or .env): say which and why, not a traceback.
                code = print_settings_error(err)  # type: ignore[arg-type]
            else:
                sys.excepthook(*sys.exc_info())
                code = EXIT_REFUSED
        exit_now(code)


def _is_settings_error(err: BaseException) -> bool:
    """Whether ``err`` is pydantic's error for bad settings; pydantic is looked up, not
    imported, so that commands which never load it (``--help``) stay fast."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(err, pydantic.ValidationError) and err.title == "Settings"


app = HermesTyper(
    name="hermes",
    help="Hermes Agent: durable AI agent sessions on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    # Locals may hold API keys; never print them in a traceback.
    pretty_exceptions_show_locals=False,
)


def default_user() -> str:
    """The login name, or "anonymous" where there is none (some containers)."""
    try:
        return getpass.getuser() or "anonymous"
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "anonymous"


UserOption = Annotated[
    str,
    typer.Option(
        "--user",
        "-u",
        envvar="HERMES_USER",
        help="Who you are to Hermes: the id that owns the session and its long-term memories, "
        "and the approver of record (default: $HERMES_USER or your login name).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
