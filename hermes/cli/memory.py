"""``hermes memory``: long-term memory (LanceDB at HERMES_MEMORY_URI).

``search`` and ``list`` read the store directly; ``add``, ``forget`` and ``consolidate``
go through the worker (the memory writer and the consolidation workflow), so they are
serialised with what sessions write; ``reembed`` rewrites the store with the workers
stopped.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from hermes.cli.errors import EXIT_REFUSED, EXIT_UNAVAILABLE, fail, failing_on
from hermes.cli.output import err_console, out, print_table
from hermes.cli.root import HermesTyper, JsonOption, app
from hermes.cli.running import answer, connect, load_settings, run_command
from hermes.errors import HermesError

if TYPE_CHECKING:
    from hermes.settings import Settings

__all__ = ["memory_app"]

memory_app = HermesTyper(
    help="Long-term memory (LanceDB at HERMES_MEMORY_URI, default .hermes/memory): search, add, list, forget, consolidate, reembed.",
    no_args_is_help=True,
)
app.add_typer(memory_app, name="memory")
MemoryUserOption = Annotated[str, typer.Option("--user", "-u", help="The user whose memories these are.")]
"""Required: a memory command never defaults to the login name (or HERMES_USER)."""


def _memory_store(settings: Settings) -> Any:
    """The store of the settings; a clear exit when it cannot be opened or searched."""
    from hermes.memory.service import open_store
    from hermes.memory.store import MemoryStoreError

    with failing_on(HermesError, MemoryStoreError, OSError, code=EXIT_UNAVAILABLE):
        store = open_store(settings)
        store.check_model()
    return store


def _print_memory_rows(rows: list[dict[str, Any]], title: str) -> None:
    """``MemoryStore.list`` rows as a table (a superseded row names what replaced it)."""
    print_table(
        ("memory_id", "kind", "status", "updated (UTC)", "hits", "said", "text"),
        (
            (
                r["memory_id"], r["kind"],
                escape(r["status"] + (f" by {r['superseded_by']}" if r.get("superseded_by") else "")),
                f"{r['updated_at']:%Y-%m-%d %H:%M}", str(r["hit_count"]), str(r["mentions"]), escape(r["text"]),
            )
            for r in rows
        ),
        title=title,
    )


@memory_app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(help="What to look for (any language).")],
    user: MemoryUserOption,
    limit: Annotated[int, typer.Option(min=1, max=5, help="At most this many (1-5).")] = 5,
    as_json: JsonOption = False,
) -> None:
    """The memories a session of USER would be given for QUERY: prefilter, vector top-20
    plus full-text, rerank (0.5 similarity, 0.2 recency, 0.2 importance, 0.1 frequency)."""
    from hermes.memory.store import MemoryStoreError

    settings = load_settings()
    store = _memory_store(settings)
    with failing_on(MemoryStoreError, code=EXIT_REFUSED):
        found = store.search(user, query, limit=limit)
    if as_json:
        typer.echo(json.dumps([m.model_dump(mode="json") for m in found], ensure_ascii=False, indent=2))
        return
    if not found:
        out.print(f"no memory of {escape(user)} matches", style="dim")
        return
    print_table(
        ("score", "similarity", "updated", "memory_id", "text"),
        (
            (f"{m.score:.3f}", f"{m.similarity:.3f}", f"{m.updated_at:%Y-%m-%d}", m.memory_id, escape(m.text))
            for m in found
        ),
        title=f"memories of {escape(user)} for {escape(query[:60])!r}",
    )


@memory_app.command("list")
def memory_list(
    user: MemoryUserOption,
    archived: Annotated[bool, typer.Option("--archived", help="The archive table's rows (merged, expired, unused).")] = False,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: JsonOption = False,
) -> None:
    """USER's memories, newest first, superseded ones included (with what replaced them)."""
    from hermes.memory.store import MemoryStoreError

    settings = load_settings()
    store = _memory_store(settings)
    statuses = ("merged", "archived", "expired", "superseded", "active") if archived else ("active", "superseded")
    with failing_on(MemoryStoreError, code=EXIT_REFUSED):
        rows = store.list(user, statuses=statuses, archived=archived, limit=limit)
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2, default=str))
        return
    _print_memory_rows(rows, f"{'archived ' if archived else ''}memories of {escape(user)} ({len(rows)})")


@memory_app.command("add")
def memory_add(
    text: Annotated[str, typer.Argument(help="The memory, as a sentence about the user.")],
    user: MemoryUserOption,
    kind: Annotated[str, typer.Option(help="fact, preference or episode.")] = "fact",
    subject: Annotated[str, typer.Option(help="Key of a single-valued fact (home_city): a new value supersedes the old.")] = "",
    value: Annotated[str, typer.Option(help="The subject's value (Zurich).")] = "",
    importance: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.7,
    as_json: JsonOption = False,
) -> None:
    """Write one memory through USER's memory writer (deduplicated and checked for
    conflicts like any other; needs a worker)."""
    from datetime import datetime, timezone

    from pydantic import ValidationError

    from hermes.memory.models import MemoryCandidate
    from hermes.memory.store import MemoryStoreError, check_id

    settings = load_settings()
    try:
        check_id(user)
        candidate = MemoryCandidate(
            user_id=user, kind=kind, subject=subject, value=value, text=text, importance=importance,
            confidence=1.0, source="cli", source_session="cli", created_at=datetime.now(timezone.utc),
        )
    except (ValidationError, MemoryStoreError) as err:
        message = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        raise fail(f"memory refused: {message}", EXIT_REFUSED) from None

    async def main() -> Any:
        hermes = await connect(settings)
        return await answer(hermes.add_memories(user, [candidate]), settings, hermes)

    report = run_command(main, settings)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    if report.error:
        raise fail(report.error, EXIT_UNAVAILABLE)
    for mid in report.inserted:
        out.print(f"added {mid}")
    for mid in report.updated:
        out.print(f"already known: refreshed {mid}")
    for mid in report.superseded:
        out.print(f"superseded {mid}")
    if report.unchanged:
        out.print("already written")
    if report.refused:
        raise fail("memory refused: " + "; ".join(report.refused), EXIT_REFUSED)


@memory_app.command("forget")
def memory_forget(
    user: MemoryUserOption,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete every memory of USER (memories and archive), and what is waiting to be
    written. Needs a worker."""
    settings = load_settings()
    if not yes and not typer.confirm(f"Delete every memory of {user!r}?"):
        raise typer.Exit(EXIT_REFUSED)

    async def main() -> Any:
        hermes = await connect(settings)
        return await answer(hermes.forget_user(user), settings, hermes)

    report = run_command(main, settings)
    out.print(f"deleted {report.deleted} memories of {escape(user)} ({report.pending_dropped} pending dropped)")


@memory_app.command("consolidate")
def memory_consolidate(
    user: Annotated[list[str] | None, typer.Option("--user", "-u", help="Only these users (repeatable).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the consolidation now (the schedule runs it hourly): merge near-duplicates,
    resolve conflicts, expire, archive unused rows; print what changed. Needs a worker."""
    settings = load_settings()

    async def main() -> Any:
        hermes = await connect(settings)
        return await hermes.consolidate_memories(archive_after_days=settings.archive_after_days, users=user or None)

    report = run_command(main, settings)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    out.print(
        f"{report.users} users: {report.merged} merged, {report.superseded} superseded, "
        f"{report.expired} expired, {report.archived} archived ({report.rows_before} -> {report.rows_after} rows)"
    )
    for line in report.details:
        out.print(f"  {escape(line)}", style="dim")


@memory_app.command("reembed")
def memory_reembed() -> None:
    """Embed every memory again with HERMES_MEMORY_EMBEDDER (after changing the model or
    its dimension). Stop the workers first; a stopped run is finished on the next start."""
    from hermes.memory.service import embedder_from_settings
    from hermes.memory.store import reembed

    settings = load_settings()
    with failing_on(HermesError, code=EXIT_UNAVAILABLE):
        embedder = embedder_from_settings(settings)
    done = reembed(settings.resolved_memory_uri, embedder, progress=lambda t, n, total: err_console.print(f"{t}: {n}/{total}", style="dim"))
    out.print(f"re-embedded with {embedder.model_id}: " + ", ".join(f"{t} {n} rows" for t, n in done.items()))

