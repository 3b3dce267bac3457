"""Encryption at rest (issue 17, hermes/security/encryption.py): with keys configured no message text
is in any event of a session's history (the raw history scanned, payloads base64-decoded)
nor in Redis's copies of message bodies; a rotated key ring (a new key first, the old one
kept) reads and continues a session written under the old key; the codec server decrypts
only with its bearer token and only for the Web UI's origin. The suite's real Temporal and
Redis, a real worker, a real codec server over HTTP."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from typing import Any

import httpx2 as httpx
import pytest
from cryptography.exceptions import InvalidTag
from google.protobuf import json_format
from pydantic import SecretStr
from temporalio.client import Client, WorkflowUpdateFailedError

from hermes import names
from hermes.security import command_auth, encryption
from hermes.content.blobs import BLOB_KEY, BlobStore
from hermes.client import HermesClient
from hermes.security.codec_server import create_app, default_ui_origins, running_codec_server
from hermes.infra.durable import DurableStore
from hermes.security.encryption import EncryptionCodec, KeyRing, UnknownKeyError, keyring_from_settings, parse_keys
from hermes.errors import ConfigError
from hermes.models import SendMessageInput, TurnResult
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.infra.stack import free_port
from tests.conftest import builtin_registry
from tests.support import decoded_history, eventually, signed
from worker import build_worker

OLD = base64.b64encode(b"o" * 32).decode()
NEW = base64.b64encode(b"n" * 32).decode()
UI_ORIGIN = "http://localhost:8233"
SCRIPT = {"turns": [{"match": ".*", "steps": [{"reply": "Noted: {{ user }}"}]}]}


@pytest.fixture
def no_active_keyring() -> Iterator[None]:
    yield
    encryption.activate(None)


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "no key is listed"),
        ("k1", "expected '<key id>:<base64 key>'"),
        ("k1:not-base64!", "is not valid base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "is 5 bytes; expected 16, 24 or 32"),
        (f"k1:{OLD},k1:{NEW}", "listed twice"),
        (f"bad id!:{OLD}", "expected '<key id>:<base64 key>'"),
    ],
)
def test_a_bad_key_setting_is_refused_naming_the_setting_and_what_was_expected(value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="HERMES_ENCRYPTION_KEYS") as info:
        parse_keys(value, source="HERMES_ENCRYPTION_KEYS", separator=",")
    assert fragment in str(info.value)
    assert OLD not in str(info.value) and NEW not in str(info.value)


def test_keys_come_from_the_setting_or_a_file_never_both(tmp_path: Any) -> None:
    assert keyring_from_settings(Settings()) is None
    ring = keyring_from_settings(Settings(encryption_keys=f"new:{NEW},old:{OLD}"))
    assert ring is not None and ring.current == "new" and set(ring.keys) == {"new", "old"}
    path = tmp_path / "keys"
    path.write_text(f"# rotated in May\nnew {NEW}\nold {OLD}  # keep until June\n")
    assert keyring_from_settings(Settings(encryption_key_file=path)) == ring
    with pytest.raises(ConfigError, match="not both"):
        keyring_from_settings(Settings(encryption_keys=f"new:{NEW}", encryption_key_file=path))
    with pytest.raises(ConfigError, match="cannot read the key file"):
        keyring_from_settings(Settings(encryption_key_file=tmp_path / "missing"))


async def test_the_codec_encrypts_every_payload_and_a_rotated_ring_still_decrypts_the_old_ones() -> None:
    from temporalio.api.common.v1 import Payload

    old = KeyRing({"old": base64.b64decode(OLD)}, "old")
    rotated = parse_keys(f"new:{NEW},old:{OLD}", source="test", separator=",")
    payload = Payload(metadata={"encoding": b"json/plain"}, data='{"text": "我的银行卡密码"}'.encode())
    (sealed,) = await EncryptionCodec(old).encode([payload])
    assert sealed.metadata["encoding"] == b"binary/encrypted" and sealed.metadata["encryption-key-id"] == b"old"
    assert "银行卡".encode() not in sealed.data
    assert (await EncryptionCodec(rotated).decode([sealed])) == [payload]
    (resealed,) = await EncryptionCodec(rotated).encode([payload])
    assert resealed.metadata["encryption-key-id"] == b"new"
    with pytest.raises(UnknownKeyError, match="'new', which is not configured"):
        await EncryptionCodec(old).decode([resealed])
    # Written before encryption was on: read as it is.
    assert (await EncryptionCodec(rotated).decode([payload])) == [payload]
    tampered = type(sealed)()
    tampered.CopyFrom(sealed)
    tampered.metadata["encryption-key-id"] = b"new"  # the key id is authenticated too
    with pytest.raises(InvalidTag):
        await EncryptionCodec(rotated).decode([tampered])


async def test_redis_copies_of_bodies_are_sealed_and_one_sealed_with_an_unknown_key_is_a_miss(
        redis: Any, no_active_keyring: None) -> None:
    store = BlobStore(redis)
    ref, body = f"m:{uuid.uuid4().hex}", '{"role":"user","content":"我的密码是 1234"}'
    encryption.activate(parse_keys(f"old:{OLD}", source="test", separator=","))
    await store.put_many({ref: body})
    raw = (await redis.get(BLOB_KEY.format(ref=ref))).decode()
    assert raw.startswith("enc:v1:old:") and "密码" not in raw
    assert await store.get_many([ref]) == {ref: body}
    encryption.activate(parse_keys(f"new:{NEW}", source="test", separator=","))
    assert await store.get_many([ref]) == {}  # the old key is gone: a miss, not an error
    encryption.activate(None)
    assert await store.get_many([ref]) == {}


# --------------------------------------------------------------------------- a session


@pytest.fixture
async def encrypted(temporal_client: Client, settings: Settings, redis: Any, no_active_keyring: None) -> Any:
    """``async with encrypted(keys) as hermes``: a worker and a client whose payloads are
    encrypted with ``keys`` (``HERMES_ENCRYPTION_KEYS`` syntax), on this test's task queue."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def run(keys: str, refuse_clear: bool = False) -> AsyncIterator[HermesClient]:
        ring = keyring_from_settings(settings.model_copy(update={"encryption_keys": SecretStr(keys)}))
        encryption.activate(ring)
        client = Client(temporal_client.service_client, namespace=temporal_client.namespace,
                        data_converter=encryption.data_converter(ring, refuse_clear=refuse_clear))
        worker = build_worker(client, settings, provider=ScriptedModel.from_dict(SCRIPT),
                              registry=builtin_registry(), redis=redis, memory=False)
        async with worker:
            yield HermesClient(client, task_queue=settings.task_queue, redis=redis,
                               durable=DurableStore(settings.resolved_memory_uri))

    return run


async def test_no_message_text_is_in_history_or_redis_and_a_rotated_ring_continues_the_session(
        encrypted: Any, temporal_client: Client, redis: Any, session_id: str) -> None:
    secret = f"我的银行卡密码是 {uuid.uuid4().hex[:8]}"
    async with encrypted(f"old:{OLD}") as hermes:
        first = await hermes.send_message(session_id, secret, user_id="alice")
    assert first.reply == f"Noted: {secret}"

    # The raw history, read with no codec: every payload base64-decoded, no message text.
    raw = decoded_history((await temporal_client.get_workflow_handle(session_id).fetch_history()).to_json())
    assert "Noted:" not in raw and secret not in raw and "alice" in raw  # ids and search attributes stay clear
    assert "binary/encrypted" in raw or base64.b64encode(b"binary/encrypted").decode() in raw
    values = [await redis.get(key) async for key in redis.scan_iter(match="hermes:blob:*", count=1000)]
    assert not any(v is not None and secret.encode() in v for v in values)

    # Rotation: a new key first, the old one kept; the old session reads and goes on.
    async with encrypted(f"new:{NEW},old:{OLD}") as hermes:
        transcript = await hermes.get_transcript(session_id)
        assert [m.content for m in transcript if m.role == "user"] == [secret]
        second = await hermes.send_message(session_id, "and again", user_id="alice")
    assert second.reply == "Noted: and again"
    raw = decoded_history((await temporal_client.get_workflow_handle(session_id).fetch_history()).to_json())
    assert "and again" not in raw


@pytest.mark.parametrize("refuse_clear", [False, True])
async def test_after_the_cut_over_a_command_in_clear_is_refused_even_with_a_valid_proof(
        encrypted: Any, temporal_client: Client, session_id: str, refuse_clear: bool) -> None:
    """A client holding a (leaked) command key but not the encryption key: before the
    cut-over its clear close is taken; with HERMES_ENCRYPTION_REFUSE_CLEAR it is refused,
    noted, and a clear message fails, the session going on."""
    async with encrypted(f"old:{OLD}", refuse_clear=refuse_clear) as hermes:
        await hermes.send_message(session_id, "hello", user_id="alice")
        plain = temporal_client.get_workflow_handle(session_id)  # pydantic converter, no codec
        message = signed(names.SEND_MESSAGE, session_id, SendMessageInput(text="in clear", user_id="alice"), sender="alice")
        taken = True
        try:
            await plain.execute_update(names.SEND_MESSAGE, message, result_type=TurnResult)
        except WorkflowUpdateFailedError:
            taken = False
        except KeyError:  # taken: its reply is encrypted, which this client cannot read
            pass
        close = command_auth.sign(command_auth.active(), names.CLOSE_SESSION, session_id, None, sender="alice",
                                  now=datetime.now(timezone.utc))
        await plain.signal(names.CLOSE_SESSION, close)

        async def settled() -> Any:
            state = await hermes.get_state(session_id)
            return state if state.status == "closed" or any("close_session" in n for n in state.notices) else None

        state = await eventually(settled, what="the clear close taken or refused")
    assert taken is not refuse_clear
    assert (state.status == "closed") is not refuse_clear


# --------------------------------------------------------------------------- the codec server


@pytest.fixture
async def codec(redis: Any, no_active_keyring: None) -> AsyncIterator[httpx.AsyncClient]:
    ring = parse_keys(f"new:{NEW},old:{OLD}", source="test", separator=",")
    encryption.activate(ring)
    async with running_codec_server(BlobStore(redis), port=free_port(), ui_origins=default_ui_origins(8233),
                                    keyring=ring, token="codec-token-1") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client


async def test_the_codec_server_decrypts_only_with_its_token_and_for_the_web_ui_origin(codec: httpx.AsyncClient) -> None:
    from temporalio.api.common.v1 import Payload

    ring = KeyRing({"old": base64.b64decode(OLD)}, "old")
    plain = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"content": "体检报告"}).encode())
    (sealed,) = await EncryptionCodec(ring).encode([plain])
    body = {"payloads": [json_format.MessageToDict(sealed)]}

    unauthenticated = await codec.post("/decode", json=body, headers={"Origin": UI_ORIGIN})
    assert unauthenticated.status_code == 401 and "体检" not in unauthenticated.text
    wrong = await codec.post("/decode", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    other_origin = await codec.post("/decode", json=body, headers={"Origin": "http://evil.example",
                                                                   "Authorization": "Bearer codec-token-1"})
    assert other_origin.status_code == 403 and "体检" not in other_origin.text

    answer = await codec.post("/decode", json=body, headers={"Origin": UI_ORIGIN, "Authorization": "Bearer codec-token-1"})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == UI_ORIGIN
    (decoded,) = answer.json()["payloads"]
    assert json.loads(base64.b64decode(decoded["data"])) == {"content": "体检报告"}

    encoded = await codec.post("/encode", json={"payloads": [json_format.MessageToDict(plain)]},
                               headers={"Authorization": "Bearer codec-token-1"})
    (again,) = encoded.json()["payloads"]
    assert base64.b64decode(again["metadata"]["encoding"]) == b"binary/encrypted"


def test_a_codec_server_that_decrypts_without_a_token_is_refused(redis: Any) -> None:
    ring = KeyRing({"old": base64.b64decode(OLD)}, "old")
    with pytest.raises(ValueError, match="needs a bearer token"):
        create_app(BlobStore(redis), ui_origins=[UI_ORIGIN], keyring=ring)


def test_hermes_encryption_key_prints_a_key_the_settings_take() -> None:
    from typer.testing import CliRunner

    from hermes.cli import app

    made = CliRunner().invoke(app, ["encryption-key", "--id", "2026-05"])
    assert made.exit_code == 0, made.output
    line = made.stdout.strip().splitlines()[0]
    ring = parse_keys(line, source="test", separator=",")
    assert ring.current == "2026-05" and len(ring.keys["2026-05"]) == 32
    refused = CliRunner().invoke(app, ["encryption-key", "--id", "bad id"])
    assert refused.exit_code == 1 and "expected 1-64 letters" in refused.output


async def test_the_session_index_row_holding_the_title_is_sealed_too(redis: Any, no_active_keyring: None) -> None:
    from datetime import datetime, timezone

    from hermes.models import SessionIndexEntry
    from hermes.infra.redis_keys import index_row_key
    from hermes.sessions.index import list_entries, write_entry

    user = f"u-{uuid.uuid4().hex[:8]}"
    now = datetime.now(timezone.utc)
    entry = SessionIndexEntry(session_id=f"s-{user}", user_id=user, title="我的银行卡密码是 1234", created_at=now,
                              last_active_at=now)
    encryption.activate(parse_keys(f"old:{OLD}", source="test", separator=","))
    await write_entry(redis, entry)
    raw = (await redis.get(index_row_key(user, f"s-{user}"))).decode()
    assert raw.startswith("enc:v1:old:") and "银行卡" not in raw
    assert await list_entries(redis, user) == [entry]
    encryption.activate(parse_keys(f"new:{NEW}", source="test", separator=","))
    assert await list_entries(redis, user) == []  # the old key is gone: not listed, not an error


async def test_turn_events_in_redis_are_sealed_and_read_back_by_a_reader_with_the_keys(
        redis: Any, no_active_keyring: None) -> None:
    from hermes.content.events import EventLog, TurnEvent, stream_key

    session = f"s-{uuid.uuid4().hex[:8]}"
    log = EventLog(redis)
    encryption.activate(parse_keys(f"old:{OLD}", source="test", separator=","))
    await log.publish([TurnEvent(type="text_delta", session_id=session, turn=1, data={"text": "你的体检报告正常"})])
    [(_, fields)] = await redis.xrange(stream_key(session))
    assert "体检".encode() not in b"".join(fields.values())
    [event] = await log.read(session)
    assert (event.type, event.data) == ("text_delta", {"text": "你的体检报告正常"})
    encryption.activate(None)
    [unreadable] = await log.read(session)
    assert unreadable.type == "warning" and "cannot decrypt" in unreadable.data["text"]
