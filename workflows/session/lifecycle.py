"""When a session run idles, is archived and continues as new.

Plain functions over the run's figures (:class:`RunFigures`, read by the workflow from
``workflow.info()``) and the session's configuration; nothing here knows of Temporal.

Sources: seed 000 §1.3 (idle after 30 minutes, archived after 7 days); Temporal's hard
limits per run (2,000 updates, 51,200 events, 50 MB of history), kept well under; the
replay budget of issue 12 (a run's length bounds the time a takeover replays).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from hermes.models import SessionConfig

MAX_UPDATES_PER_RUN_HARD = 1500
"""Messages a run takes at most, however busy (Temporal refuses a run's 2,000th update)."""
MAX_EVENTS_PER_RUN_HARD = 30_000
"""Events a run may reach however busy (Temporal's limit is 51,200)."""
MAX_HISTORY_BYTES_HARD = 40_000_000
"""History size no budget exceeds (Temporal's hard limit is 50 MB)."""


@dataclass(frozen=True)
class RunFigures:
    """What the workflow knows of its run: messages taken, history length (events) and
    size (bytes), whether Temporal suggests continue-as-new, the transcript's size."""

    updates: int
    history_length: int
    history_bytes: int
    suggested: bool
    live_bytes: int


def history_over(cfg: SessionConfig, figures: RunFigures, times: int) -> bool:
    """The run's history is past ``times`` x ``max_history_bytes`` (capped at 40 MB)."""
    return figures.history_bytes >= min(cfg.max_history_bytes * times, MAX_HISTORY_BYTES_HARD)


def replay_budget_spent(cfg: SessionConfig, figures: RunFigures) -> bool:
    """The run has ``replay_budget_events`` events: a worker taking the session over
    (after a crash, a deploy or a cache eviction) replays the run, so its length bounds
    the time to resume, at turn 10 as at turn 10,000."""
    return cfg.replay_budget_events > 0 and figures.history_length >= cfg.replay_budget_events


def should_roll_over(
    cfg: SessionConfig, figures: RunFigures, *, bounded_context: bool, bounded_work: bool
) -> bool:
    """Continue as new at the next idle moment: ``max_updates_per_run`` messages taken,
    Temporal suggests it, the transcript is past 1.5 x ``max_carry_bytes`` (archiving at
    continue-as-new keeps the state well under the 2 MB payload limit), the history is
    past ``max_history_bytes``, or the replay budget is spent. The two flags are the
    run's patches of those checks (runs recorded before them replay without)."""
    return (
        figures.updates >= cfg.max_updates_per_run
        or figures.suggested
        or figures.live_bytes > cfg.max_carry_bytes * 3 // 2
        or (bounded_context and history_over(cfg, figures, 1))
        or (replay_budget_spent(cfg, figures) and bounded_work)
    )


def must_roll_over(cfg: SessionConfig, figures: RunFigures, *, bounded_context: bool) -> bool:
    """Stop taking messages and continue as new even though the session is never idle
    (constant load), well before Temporal's hard caps."""
    return (
        figures.updates >= min(3 * cfg.max_updates_per_run, MAX_UPDATES_PER_RUN_HARD)
        or figures.history_length >= MAX_EVENTS_PER_RUN_HARD
        or (bounded_context and history_over(cfg, figures, 3))
    )


def idle_timeout(
    cfg: SessionConfig, *, now: datetime, last_active_at: datetime, idle_marked: bool, not_before: datetime
) -> timedelta:
    """Time until the session turns idle or, when idle, until it is archived (at least
    a second; never before ``not_before``, a retry after a failed archive)."""
    after = cfg.archive_after_seconds if idle_marked else cfg.idle_after_seconds
    due = max(last_active_at + timedelta(seconds=after), not_before)
    return max(due - now, timedelta(seconds=1))


def quiet_seconds(now: datetime, last_active_at: datetime) -> float:
    return (now - last_active_at).total_seconds()


def due_for_archive(cfg: SessionConfig, now: datetime, last_active_at: datetime) -> bool:
    return quiet_seconds(now, last_active_at) >= cfg.archive_after_seconds


def turns_idle(cfg: SessionConfig, now: datetime, last_active_at: datetime, idle_marked: bool) -> bool:
    """The session has been quiet ``idle_after_seconds`` and is not marked idle yet."""
    return quiet_seconds(now, last_active_at) >= cfg.idle_after_seconds and not idle_marked


def active_since_idle(cfg: SessionConfig, now: datetime, last_active_at: datetime) -> bool:
    """A message came in while the run drained for the archive (it was refused as busy
    and will be retried): the session is active again."""
    return quiet_seconds(now, last_active_at) < cfg.idle_after_seconds


def summary_due(
    cfg: SessionConfig, turn: int, *, covered: int, retry_turn: int
) -> int | None:
    """The turn a summary should now cover up to, or None (DESIGN.md: at most once
    every ``summary_every_turns`` turns; turns older than ``context_history_turns``;
    after a failure, not before ``retry_turn``)."""
    upto = turn - cfg.context_history_turns
    if upto - covered < cfg.summary_every_turns or turn < retry_turn:
        return None
    return upto
