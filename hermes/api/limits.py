"""Limits of ``hermes serve``, kept in the process: requests per user, failed
authentications per client address, open event streams per user.

* **Requests per user** (``HERMES_API_RATE_PER_MINUTE``): counted by the key's user, so a
  user's N keys share one budget.
* **Failed authentications per client address** (``HERMES_API_AUTH_FAILURES_PER_MINUTE``):
  a request with no key, another scheme or an unknown key counts against its address;
  over the limit, every request from that address that needs a key is answered 429
  before its key is looked at, so guessing keys is slowed and a right guess is not
  told apart from a wrong one. The address is the TCP peer's, or what a trusted proxy
  forwarded (``HERMES_API_FORWARDED_ALLOW_IPS``, uvicorn's ``forwarded_allow_ips``).
* **Open event streams per user** (``HERMES_API_MAX_STREAMS_PER_USER``): a session's
  events, a streamed message, a streamed completion; one over is answered 429 naming the
  cap; a stream frees its slot when it ends, however it ends.

Several ``hermes serve`` processes each keep their own counts.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from starlette.requests import Request

from hermes.api.keys import Identity
from hermes.api.problems import Problem

__all__ = ["AuthFailures", "RateLimit", "SlidingWindow", "StreamSlots", "stream_slot"]

WINDOW_SECONDS = 60.0
_MAX_TRACKED = 10_000
"""Past this many tracked keys, those idle for a whole window are dropped."""


class SlidingWindow:
    """At most ``per_minute`` events per key in any 60 s (event times kept per key;
    ``per_minute`` 0: no limit).

    Args:
        per_minute: the most events a key may have in a window.
    """

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._seen: dict[str, collections.deque[float]] = {}

    def wait_seconds(self, key: str) -> float:
        """0 when ``key`` may have one more event now, else the seconds until it may."""
        if self.per_minute <= 0:
            return 0.0
        now = time.monotonic()
        times = self._seen.get(key)
        if times is None:
            return 0.0
        while times and now - times[0] >= WINDOW_SECONDS:
            times.popleft()
        if len(times) < self.per_minute:
            return 0.0
        return WINDOW_SECONDS - (now - times[0])

    def add(self, key: str) -> None:
        """Count one event of ``key`` now."""
        if self.per_minute <= 0:
            return
        now = time.monotonic()
        self._seen.setdefault(key, collections.deque()).append(now)
        if len(self._seen) > _MAX_TRACKED:
            self._seen = {k: v for k, v in self._seen.items() if v and now - v[-1] < WINDOW_SECONDS}


def _retry_after(wait: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, round(wait)))}


class RateLimit(SlidingWindow):
    """Requests per user per minute (``HERMES_API_RATE_PER_MINUTE``)."""

    def take(self, user_id: str) -> None:
        """Count one request of ``user_id``.

        Raises:
            Problem: 429 ``rate-limited`` with ``Retry-After`` (not counted) when over.
        """
        wait = self.wait_seconds(user_id)
        if wait > 0:
            raise Problem(
                "rate-limited",
                f"more than {self.per_minute} requests a minute by user {user_id!r} (all its keys); retry in {wait:.0f} s",
                headers=_retry_after(wait),
            )
        self.add(user_id)


class AuthFailures(SlidingWindow):
    """Failed authentications per client address per minute
    (``HERMES_API_AUTH_FAILURES_PER_MINUTE``)."""

    def check(self, address: str) -> None:
        """Refuse ``address`` while it is over its failures.

        Raises:
            Problem: 429 ``rate-limited`` with ``Retry-After``.
        """
        wait = self.wait_seconds(address)
        if wait > 0:
            raise Problem(
                "rate-limited",
                f"more than {self.per_minute} requests a minute with a missing or unknown API key from this address; "
                f"retry in {wait:.0f} s",
                headers=_retry_after(wait),
            )


class StreamSlots:
    """At most ``per_user`` open event streams per user (``HERMES_API_MAX_STREAMS_PER_USER``;
    0: no limit).

    Args:
        per_user: the most streams one user (all its keys) may have open.
    """

    def __init__(self, per_user: int):
        self.per_user = per_user
        self._open: dict[str, int] = {}

    def open_streams(self, user_id: str) -> int:
        """How many streams ``user_id`` has open."""
        return self._open.get(user_id, 0)

    def take(self, user_id: str) -> Callable[[], None]:
        """Take a slot for one stream of ``user_id``.

        Returns:
            The function that frees it (calling it again does nothing).

        Raises:
            Problem: 429 ``too-many-streams`` naming the cap, with ``Retry-After``.
        """
        if self.per_user > 0 and self.open_streams(user_id) >= self.per_user:
            raise Problem(
                "too-many-streams",
                f"user {user_id!r} has {self.per_user} event streams open, the most allowed "
                "(HERMES_API_MAX_STREAMS_PER_USER); close one first",
                headers={"Retry-After": "5"},
            )
        self._open[user_id] = self.open_streams(user_id) + 1
        freed = False

        def free() -> None:
            nonlocal freed
            if freed:
                return
            freed = True
            left = self._open.get(user_id, 1) - 1
            if left > 0:
                self._open[user_id] = left
            else:
                self._open.pop(user_id, None)

        return free


def stream_slot(request: Request, identity: Identity) -> Callable[[], None]:
    """A slot of the app's :class:`StreamSlots` for one more event stream of
    ``identity``'s user; the result frees it (give it to
    :func:`hermes.api.sse.event_stream` as ``on_close``).

    Raises:
        Problem: 429 ``too-many-streams`` when the user has ``api_max_streams_per_user`` open.
    """
    slots: StreamSlots = request.app.state.streams
    return slots.take(identity.user_id)
