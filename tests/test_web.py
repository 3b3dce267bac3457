"""The web chat of ``hermes serve`` in a real browser: Debian's Chromium driven by
Playwright (its own browser download is not reachable here; ``.ci/run`` installs
``chromium`` and ``fonts-noto-cjk`` with apt).

Sign in with a key, send a message and see its text stream in, ask for a note and approve
the write call on its card, see the tool's result and the reply, switch to Chinese.
Screenshots go to ``test-artifacts/web/`` (kept by CI as artefacts; the README's come from
there). Without Chromium the test is skipped, except where ``HERMES_TEST_BROWSER_REQUIRED``
is set (``.ci/run``), where it fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.test_api import api_server, keys  # noqa: F401 - the fixture

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "web"
REQUIRED_ENV = "HERMES_TEST_BROWSER_REQUIRED"

WEB_SCRIPT: dict[str, Any] = {
    "stream_chunk_seconds": 0.05,
    "turns": [
        {
            "match": "note|笔记",
            "steps": [
                {"tool_calls": [{"name": "save_note", "arguments": {"title": "meeting", "text": "Alice at ten"}}]},
                {"reply": "Saved your note about the meeting with Alice."},
            ],
        },
        {"steps": [{"reply": "Hello! I am a durable session: every word of this reply streams to your page."}]},
    ],
}


def chromium() -> str:
    found = os.environ.get("HERMES_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    message = "no Chromium: apt-get install -y chromium fonts-noto-cjk (Playwright's own download is not reachable)"
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(message)
    pytest.skip(message)


@pytest.mark.timeout(900)
async def test_sign_in_stream_a_reply_approve_a_write_call_and_read_chinese(run_worker, settings, keys):  # noqa: F811
    executable = chromium()
    playwright_api = pytest.importorskip("playwright.async_api")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    web = settings.model_copy(update={"temporal_ui_url": "http://127.0.0.1:8233"})
    async with run_worker(WEB_SCRIPT, memory=False) as hermes, api_server(web, keys["path"], hermes) as http:
        base = str(http.base_url)
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page(viewport={"width": 1200, "height": 800}, locale="en-US")
                # The page runs under its Content-Security-Policy: nothing of it may be blocked.
                blocked: list[str] = []
                page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
                await page.goto(base + "/")
                assert "frame-ancestors 'none'" in ((await page.request.get(base + "/")).headers["content-security-policy"])
                # A wrong key is refused on the page; the right one signs in.
                await page.fill("#key", "hk_wrong")
                await page.click("#signin-form button")
                await page.wait_for_selector("#signin-error:has-text('not accepted')")
                await page.fill("#key", keys["alice"])
                await page.click("#signin-form button")
                await page.wait_for_selector("#who:has-text('alice')")
                await page.screenshot(path=str(ARTIFACTS / "1-signed-in.png"))

                # The lengths the streaming reply had as it grew: streamed text shows partly first.
                await page.evaluate(
                    """() => { window.partial = new Set(); new MutationObserver(() => {
                        const b = document.querySelector('.msg.assistant.streaming');
                        if (b) window.partial.add(b.textContent.length);
                      }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); }"""
                )
                await page.fill("#text", "hello there")
                await page.press("#text", "Enter")
                reply = "Hello! I am a durable session: every word of this reply streams to your page."
                await page.wait_for_selector(f".msg.assistant:not(.streaming):has-text('{reply}')", timeout=60_000)
                partial = await page.evaluate("[...window.partial]")
                assert len([n for n in partial if 0 < n < len(reply)]) >= 3, f"the reply did not stream in: {partial}"
                session_id = (await page.text_content("#session-title")) or ""
                link = await page.get_attribute("#ui-link", "href")
                assert session_id and link == f"http://127.0.0.1:8233/namespaces/default/workflows/{session_id}"
                await page.screenshot(path=str(ARTIFACTS / "2-streamed.png"))

                # A write call: its card has Approve / Reject; approving runs it.
                await page.fill("#text", "please save a note")
                await page.press("#text", "Enter")
                approve = page.locator(".card.approval button.approve")
                await approve.wait_for(timeout=60_000)
                assert "save_note" in (await page.text_content(".card.approval")) or ""
                await page.screenshot(path=str(ARTIFACTS / "3-approval.png"))
                await approve.click()
                await page.wait_for_selector(".card.approval .decided:has-text('alice')")
                await page.wait_for_selector(".card.tool .outcome.code0", timeout=60_000)
                await page.wait_for_selector(".msg.assistant:has-text('Saved your note')", timeout=60_000)
                await page.screenshot(path=str(ARTIFACTS / "4-approved.png"))
                assert await page.locator("#messages .error").count() == 0, await page.text_content("#messages")
                state = await hermes.get_state(session_id)
                assert state.decisions[-1].approver == "alice" and state.decisions[-1].outcome == "applied"

                # Chinese, and the session again after a reload (from its transcript).
                await page.click("#lang")
                assert await page.text_content("#send") == "发送"
                await page.reload()
                await page.wait_for_selector("#who:has-text('当前用户')")
                await page.locator(f"#sessions li[data-session-id='{session_id}']").click(timeout=60_000)
                await page.wait_for_selector(".msg.assistant:has-text('Saved your note')")
                await page.fill("#text", "再记一条笔记")
                await page.press("#text", "Enter")
                await page.locator(".card.approval button.reject").last.wait_for(timeout=60_000)
                await page.screenshot(path=str(ARTIFACTS / "5-chinese.png"))
                await page.locator(".card.approval button.reject").last.click()
                await page.wait_for_selector(".card.approval .decided:has-text('拒绝')")
                await page.locator(".msg.assistant:has-text('Saved your note')").nth(1).wait_for(timeout=60_000)
                assert await page.locator("#messages .error").count() == 0, await page.text_content("#messages")
                assert not blocked, blocked
            finally:
                await browser.close()
    assert (ARTIFACTS / "4-approved.png").stat().st_size > 10_000


VENDORED = {
    # name: (npm package, sha256 of the file as published in it)
    "marked.js": ("marked@18.3.0 lib/marked.umd.js", "f8c7f128939415995e2219e8a84bec42fab27f5980d22e361339e6901da5eadf"),
    "purify.js": ("dompurify@3.5.0 dist/purify.min.js", "f69a46022ab1f53e969c8ebbca98172c8995785a9b3be72ea4a12d25b1a1bf67"),
}


def test_the_page_fetches_nothing_from_elsewhere():
    static = Path(__file__).resolve().parents[1] / "hermes" / "api" / "static"
    for path in static.iterdir():
        if path.name in VENDORED:
            continue
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path.name


def test_the_vendored_markdown_libraries_are_the_pinned_npm_files_with_their_licenses():
    api = Path(__file__).resolve().parents[1] / "hermes" / "api"
    for name, (package, digest) in VENDORED.items():
        assert hashlib.sha256((api / "static" / name).read_bytes()).hexdigest() == digest, f"{name} is not {package}"
    licenses = {p.name for p in (api / "third_party").iterdir()}
    assert {"marked-LICENSE.md", "dompurify-LICENSE", "dompurify-LICENSE-MPL"} <= licenses
