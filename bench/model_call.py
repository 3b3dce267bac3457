"""What Hermes' model path costs per call over a bare ``openai`` client on the same endpoint.

- **hermes**: ``ModelActivities.call_model`` (the activity's body: context resolution,
  the provider with its profile, reply checks and counting) through ``OpenAIProvider``,
  streamed and not.
- **bare**: ``openai.AsyncOpenAI().chat.completions.create`` with the same messages and
  tools, streamed (chunks read and joined) and not.

Both talk to the same local fake endpoint (``tests/fake_providers.py``, profile
``openai``), which answers the conformance conversation's two kinds of step in turn: two
parallel tool calls, and a text reply after the tool results. The four variants run
interleaved, in a shuffled order per round, in one process, so a busy machine slows them
alike. Time to first chunk is from the call to the first streamed chunk.

    python bench/model_call.py [--quick]

Prints per-call medians and p95s, the overhead in milliseconds, the time to first chunk,
and last ``model_call_ratio=``: the larger of the streamed and unstreamed ratios of the
medians, hermes over bare (target: at most 1.2).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from _common import describe_ms, headline, parser, run

import openai

from activities.model import ModelActivities
from hermes.models import CallModelInput
from hermes.providers.base import to_openai_messages
from hermes.providers.openai import OpenAIProvider
from tests.fake_providers import TOOLS, FakeProvider, opening_messages, tool_messages


async def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    rounds, warmup = (150, 20) if args.quick else (1000, 50)
    with FakeProvider("openai") as fake:
        hermes_provider = OpenAIProvider(model="fake-model", base_url=fake.base_url, api_key="k", profile="openai")
        hermes_plain = OpenAIProvider(model="fake-model", base_url=fake.base_url, api_key="k", profile="openai", stream=False)
        activities = {True: ModelActivities(hermes_provider), False: ModelActivities(hermes_plain)}
        bare = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        first_chunk: dict[str, float] = {}

        def mark() -> None:
            first_chunk.setdefault("at", time.perf_counter())

        hermes_provider.on_chunk = mark

        # Two requests: the opening (answered with tool calls) and the one after the tool results.
        opening = opening_messages()
        calls = (await hermes_plain.complete(CallModelInput(session_id="b", turn=1, messages=opening, tools=TOOLS))).message
        after_tools = [*opening, calls, *tool_messages(calls)]
        requests = [
            CallModelInput(session_id="bench", turn=1, step=step, messages=messages, tools=TOOLS, max_output_tokens=512)
            for step, messages in enumerate((opening, after_tools))
        ]
        tools = [t.to_openai() for t in TOOLS]

        async def run_hermes(stream: bool, request: CallModelInput) -> tuple[float, float | None]:
            first_chunk.clear()
            t0 = time.perf_counter()
            result = await activities[stream].call_model(request)
            elapsed = time.perf_counter() - t0
            assert result.message.content or result.message.tool_calls
            return elapsed, (first_chunk["at"] - t0) if stream else None

        async def run_bare(stream: bool, request: CallModelInput) -> tuple[float, float | None]:
            t0 = time.perf_counter()
            kwargs: dict[str, Any] = {
                "model": "fake-model", "messages": to_openai_messages(request.messages), "tools": tools, "max_tokens": 512,
            }
            if not stream:
                response = await bare.chat.completions.create(**kwargs)
                assert response.choices
                return time.perf_counter() - t0, None
            first = None
            parts: list[str] = []
            response = await bare.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
            async for chunk in response:
                if first is None:
                    first = time.perf_counter() - t0
                for choice in chunk.choices:
                    if choice.delta.content:
                        parts.append(choice.delta.content)
            return time.perf_counter() - t0, first

        variants = {
            ("hermes", False): run_hermes, ("hermes", True): run_hermes,
            ("bare", False): run_bare, ("bare", True): run_bare,
        }
        samples: dict[tuple[str, bool], list[float]] = {key: [] for key in variants}
        first_samples: dict[str, list[float]] = {"hermes": [], "bare": []}
        order = list(variants)
        rng = random.Random(13)
        for n in range(warmup + rounds):
            rng.shuffle(order)
            request = requests[n % len(requests)]
            for key in order:
                elapsed, first = await variants[key](key[1], request)
                if n >= warmup:
                    samples[key].append(elapsed)
                    if first is not None:
                        first_samples[key[0]].append(first)

    print(f"endpoint: local fake (profile openai), {rounds} rounds after {warmup} warm-up, variants interleaved")
    ratios = {}
    for stream in (False, True):
        label = "streamed" if stream else "unstreamed"
        h, b = samples[("hermes", stream)], samples[("bare", stream)]
        print(f"{label} hermes call_model: {describe_ms(h)}")
        print(f"{label} bare openai client: {describe_ms(b)}")
        overhead = (statistics.median(h) - statistics.median(b)) * 1000
        ratios[stream] = statistics.median(h) / statistics.median(b)
        print(
            f"{label} overhead per call: {overhead:.2f} ms (ratio of medians {ratios[stream]:.2f}; "
            f"of minimums, the least disturbed calls, {min(h) / min(b):.2f})"
        )
    print(f"time to first chunk, hermes: {describe_ms(first_samples['hermes'])}")
    print(f"time to first chunk, bare: {describe_ms(first_samples['bare'])}")
    headline("model_call_ratio", f"{max(ratios.values()):.2f}")


if __name__ == "__main__":
    run(main)
