"""The web chat's turns in a real browser (Debian's Chromium driven by Playwright, as in
``tests/test_web.py``; issue 32): one view per turn, a message sent while a reply streams
queued and answered on its own, resume after a reload and after a dropped connection,
the step indicator, Markdown replies with their HTML sanitised.

The scripted model streams its replies word by word (``stream_chunk_seconds``), so a test
can act while a reply is half shown. The screenshots of the README's web chat section are
taken by these tests: into ``test-artifacts/web`` (ignored by git), or into ``docs/`` with
``HERMES_UPDATE_SCREENSHOTS=1`` (a test run never changes tracked files otherwise).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.test_api import api_server, keys  # noqa: F401 - the fixture
from tests.test_web import chromium

DOCS = Path(__file__).resolve().parents[1] / (
    "docs" if os.environ.get("HERMES_UPDATE_SCREENSHOTS") == "1" else "test-artifacts/web"
)
DOCS.mkdir(parents=True, exist_ok=True)

STORY = " ".join(
    f"{word}{i}" for i, word in enumerate(
        "once upon a time a durable workflow lived on a small server and every word it said came back after "
        "each crash because its history kept the turns it had run and the events kept the text it streamed "
        "so nobody ever read the same sentence twice".split()
    )
)
"""A reply of numbered words: a doubled piece of it shows as a repeated number."""
MARKDOWN = (
    "Here is **bold** text and a list:\n\n- first item\n- second item\n\n"
    "```python\nprint('hello')\n```\n\n"
    "See [the docs](https://example.org/docs). <script>window.pwned = 1</script>"
    "<img src=x onerror=\"window.pwned = 2\">"
)
SCRIPT: dict[str, Any] = {
    "stream_chunk_seconds": 0.12,
    "turns": [
        {"match": "story|故事", "steps": [{"reply": STORY}]},
        {"match": "markdown", "steps": [{"reply": MARKDOWN}]},
        {
            "match": "note|笔记",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": "meeting", "text": "Alice at ten"}}]},
                {"reply": "Saved your note about the meeting with Alice."},
            ],
        },
        {"steps": [{"reply": "Hello!"}]},
    ],
}
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu"]


@asynccontextmanager
async def chat_page(base: str, key: str, locale: str = "en-US") -> AsyncIterator[Any]:
    """A signed-in page of the web chat at ``base``."""
    executable = chromium()
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1200, "height": 800}, locale=locale)
            page = await context.new_page()
            await page.goto(base + "/")
            await page.fill("#key", key)
            await page.click("#signin-form button")
            await page.wait_for_selector("#who:not(:empty)")
            yield page
        finally:
            await browser.close()


async def send(page: Any, text: str) -> None:
    await page.fill("#text", text)
    await page.press("#text", "Enter")


async def reply_text(page: Any, turn: int) -> str:
    return ((await page.text_content(f".turn[data-turn='{turn}'] .msg.assistant")) or "").strip()


async def wait_mid_reply(page: Any, turn: int) -> None:
    """Until turn ``turn``'s reply has streamed in part (its fourth word)."""
    await page.wait_for_selector(f".turn[data-turn='{turn}'] .msg.assistant.streaming:has-text('a4')", timeout=60_000)


async def watch_story(page: Any) -> None:
    """Record every text turn 1's reply shows as it streams (``window.seen``)."""
    await page.evaluate(
        """() => { window.seen = new Set(); new MutationObserver(() => {
            const b = document.querySelector(".turn[data-turn='1'] .msg.assistant");
            if (b) window.seen.add(b.textContent.trim());
          }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); }"""
    )


async def assert_story_never_doubled(page: Any) -> None:
    """Each text turn 1's reply showed was the start of the story: no word twice, none lost."""
    seen = await page.evaluate("[...window.seen]")
    assert len(seen) >= 3, seen
    assert all(STORY.startswith(text) for text in seen), [text for text in seen if not STORY.startswith(text)]


async def wait_turn_done(page: Any, turn: int, text: str) -> None:
    await page.wait_for_selector(
        f".turn[data-turn='{turn}'] .msg.assistant:not(.streaming):has-text({text!r})", timeout=60_000
    )


@pytest.mark.timeout(300)
async def test_a_message_sent_with_enter_while_a_reply_streams_is_queued_and_answered_in_its_own_view(
    run_worker, settings, keys  # noqa: F811
):
    async with run_worker(SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        async with chat_page(str(http.base_url), keys["alice"]) as page:
            # What showed first in the turn: its step indicator, or reply text.
            await page.evaluate(
                """() => { window.firsts = []; new MutationObserver(() => {
                    const step = document.querySelector('.turn .step:not([hidden])');
                    const text = document.querySelector('.turn .msg.assistant');
                    if (step && !window.firsts.includes('step')) window.firsts.push('step:' + step.dataset.state);
                    if (text && text.textContent && !window.firsts.includes('text')) window.firsts.push('text');
                  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true, attributes: true}); }"""
            )
            await watch_story(page)
            await send(page, "tell me a story")
            await wait_mid_reply(page, 1)
            assert (await page.text_content(".turn[data-turn='1'] .step")) == "Writing the reply…"
            await page.screenshot(path=str(DOCS / "web-chat-streaming.png"))
            firsts = await page.evaluate("window.firsts")
            assert firsts[0] == "step:thinking", firsts

            # Enter while the reply streams: the message waits for its turn, marked queued.
            await send(page, "now some markdown")
            queued = page.locator(".msg.user.queued")
            await queued.wait_for(timeout=10_000)
            assert "queued" in ((await queued.text_content()) or "")
            assert await page.locator(".msg.user").count() == 2

            await wait_turn_done(page, 1, "twice46")
            await page.wait_for_selector(".turn[data-turn='2'] .msg.assistant:not(.streaming) strong", timeout=60_000)
            assert await reply_text(page, 1) == STORY  # no doubled words
            await assert_story_never_doubled(page)
            assert await page.locator(".msg.user.queued").count() == 0
            # Each message is followed by its own turn's view.
            order = await page.evaluate(
                "[...document.querySelectorAll('#messages > *')].map(n => n.classList.contains('turn') ? 'turn' + n.dataset.turn : n.className)"
            )
            assert order == ["msg user", "turn1", "msg user", "turn2"], order
            # No cursor and no step indicator stays once the turns are over.
            await page.wait_for_function("!document.querySelector('.turn .step:not([hidden])')", timeout=30_000)
            assert await page.locator(".msg.streaming").count() == 0

            # The Markdown reply: formatted, its script and handler dropped, its link safe.
            md = page.locator(".turn[data-turn='2'] .msg.assistant")
            assert await md.locator("li").count() == 2
            assert "print('hello')" in ((await md.locator("pre code").text_content()) or "")
            assert await md.locator("script").count() == 0
            assert await md.locator("[onerror]").count() == 0
            assert await page.evaluate("window.pwned") is None
            link = md.locator("a")
            assert await link.get_attribute("rel") == "noopener noreferrer"
            assert await link.get_attribute("href") == "https://example.org/docs"
            await page.screenshot(path=str(DOCS / "web-chat-markdown.png"))
            # The session is listed and current while it is open.
            assert await page.locator("#sessions li.current").count() == 1
            assert "No sessions yet." not in ((await page.text_content("#sessions")) or "")


@pytest.mark.timeout(300)
async def test_a_reload_mid_reply_and_mid_approval_shows_the_running_turn_the_queued_message_and_the_approval_works(
    run_worker, settings, keys  # noqa: F811
):
    async with run_worker(SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        async with chat_page(str(http.base_url), keys["alice"]) as page:
            await send(page, "tell me a story")
            await wait_mid_reply(page, 1)
            await send(page, "now some markdown")  # queued behind the story
            await page.locator(".msg.user.queued").wait_for(timeout=10_000)
            session_id = (await page.text_content("#session-title")) or ""
            await page.reload()
            # The session reopens by itself, its running reply streaming on, the queued
            # message still shown as queued after it.
            await page.wait_for_selector(f"#session-title:has-text('{session_id}')")
            await watch_story(page)
            await page.wait_for_selector(".turn[data-turn='1'] .msg.assistant.streaming", timeout=30_000)
            queued = page.locator(".msg.user.queued")
            assert await queued.count() == 1
            assert "now some markdown" in ((await queued.text_content()) or "")
            await wait_turn_done(page, 1, "twice46")
            assert await reply_text(page, 1) == STORY
            assert all(STORY.startswith(text) for text in await page.evaluate("[...window.seen]"))
            await page.wait_for_selector(".turn[data-turn='2'] .msg.assistant:not(.streaming) strong", timeout=60_000)
            assert await page.locator(".msg.user.queued").count() == 0
            order = await page.evaluate(
                "[...document.querySelectorAll('#messages > *')].map(n => n.classList.contains('turn') ? 'turn' + n.dataset.turn : n.textContent)"
            )
            assert order[:2] == ["tell me a story", "turn1"] and order[2].startswith("now some markdown"), order
            assert order[3:] == ["turn2"], order

            # In Chinese: a write call waits for approval; reload; approve it on the page.
            await page.click("#lang")
            await send(page, "记一条笔记")
            await page.locator(".turn[data-turn='3'] .card.approval button.approve").wait_for(timeout=60_000)
            await page.reload()
            assert await page.locator(".msg.user.queued").count() == 0  # nothing waits: nothing shown queued
            approve = page.locator(".turn[data-turn='3'] .card.approval button.approve")
            await approve.wait_for(timeout=30_000)
            step = page.locator(".turn[data-turn='3'] .step[data-state='approval']")
            await step.wait_for(timeout=30_000)
            assert (await step.text_content() or "").startswith("等待审批")
            await page.screenshot(path=str(DOCS / "web-chat-zh.png"))
            await approve.click()
            await page.wait_for_selector(".turn[data-turn='3'] .card.tool .outcome.code0:has-text('完成')", timeout=60_000)
            await wait_turn_done(page, 3, "Saved your note")
            assert await page.locator(".card.approval").count() == 1
            # Switching the language retranslates what is shown, cards included.
            await page.click("#lang")
            assert await page.text_content(".turn[data-turn='3'] .card.tool .outcome") == "done"
            assert await page.text_content(".turn[data-turn='3'] .card.approval .decided") == "approved by alice"
            assert await page.text_content(".turn[data-turn='3'] .card.approval strong") == "Approval needed: save_note"
            assert await page.locator("#messages .card.warning").count() == 0, await page.text_content("#messages")


@pytest.mark.timeout(300)
async def test_a_dropped_connection_mid_reply_resumes_from_the_last_event_and_enter_sends_nothing_meanwhile(
    run_worker, settings, keys  # noqa: F811
):
    async with run_worker(SCRIPT, memory=False) as hermes, api_server(settings, keys["path"], hermes) as http:
        async with chat_page(str(http.base_url), keys["alice"]) as page:
            await watch_story(page)
            await send(page, "tell me a story")
            await wait_mid_reply(page, 1)
            await page.context.set_offline(True)
            await page.wait_for_selector("#offline:not([hidden])")
            assert await page.is_disabled("#send")
            # Enter while sending is disabled does nothing: the text stays, no message is added.
            await send(page, "hello again")
            assert await page.input_value("#text") == "hello again"
            assert await page.locator(".msg.user").count() == 1
            await page.context.set_offline(False)
            await page.wait_for_selector("#offline[hidden]", state="attached", timeout=30_000)
            await wait_turn_done(page, 1, "twice46")
            assert await reply_text(page, 1) == STORY  # nothing lost, nothing twice
            await assert_story_never_doubled(page)
            assert await page.locator(".msg.user").count() == 1
            await page.press("#text", "Enter")
            await page.wait_for_selector(".turn[data-turn='2'] .msg.assistant:not(.streaming):has-text('Hello!')", timeout=60_000)
