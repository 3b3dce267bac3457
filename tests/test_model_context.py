"""What the model is sent: Hermes' own notices never pose as the model's words."""

from hermes.errors import ModelRequestError
from hermes.models import CallModelInput, CallModelResult, Message


class FailsOnceThenRecords:
    """Refuses the first call like a 401 would, then answers and records its input."""

    name = "test"

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        self.calls.append(request.messages)
        if len(self.calls) == 1:
            raise ModelRequestError("401 from test-model: invalid api key", status_code=401)
        return CallModelResult(message=Message(role="assistant", content="answered"), provider=self.name)


async def test_a_model_error_notice_is_in_the_transcript_but_never_sent_to_the_model(run_worker, session_id):
    model = FailsOnceThenRecords()
    async with run_worker(model) as hermes:
        failed = await hermes.send_message(session_id, "first question")
        assert failed.status == "model_error"
        assert "401" in failed.reply

        answered = await hermes.send_message(session_id, "second question")
        assert answered.reply == "answered"

        transcript = await hermes.get_transcript(session_id)
        assert [m.content for m in transcript] == ["first question", failed.reply, "second question", "answered"]
        sent = [(m.role, m.content) for m in model.calls[-1]]
        assert ("assistant", failed.reply) not in sent
        assert sent[1:] == [("user", "first question"), ("user", "second question")]


class Recorder:
    """Calls `calculate` once per turn, then answers; records every context it is sent."""

    name = "test"

    def __init__(self) -> None:
        self.calls: list[CallModelInput] = []

    async def complete(self, request: CallModelInput) -> CallModelResult:
        from hermes.models import ToolCall

        self.calls.append(request)
        if request.messages[-1].role == "user":
            call = ToolCall(tool_call_id=f"c{request.turn}", name="calculate", arguments={"expression": "1+1"})
            return CallModelResult(message=Message(role="assistant", tool_calls=[call]), provider=self.name)
        return CallModelResult(message=Message(role="assistant", content=f"reply {request.turn}"), provider=self.name)


async def test_older_turns_are_sent_as_questions_and_answers_without_their_tool_traffic(run_worker, session_id):
    from hermes.models import SessionConfig

    model = Recorder()
    async with run_worker(model, config=SessionConfig(context_recent_messages=4)) as hermes:
        for i in range(1, 5):
            await hermes.send_message(session_id, f"question {i}")
        sent = model.calls[-1].messages
        assert sent[0].role == "system"
        assert [m.content for m in sent if m.role == "user"] == [f"question {i}" for i in range(1, 5)]
        assert [m.content for m in sent if m.role == "assistant" and not m.tool_calls] == [
            "reply 1", "reply 2", "reply 3"
        ]
        call_ids = [c.tool_call_id for m in sent for c in m.tool_calls]
        result_ids = [m.tool_call_id for m in sent if m.role == "tool"]
        assert call_ids == result_ids == ["c4"]  # a tool call and its result stay together
        assert len(await hermes.get_transcript(session_id)) == 16  # nothing dropped from the session


class SaysNothing:
    name = "test"

    async def complete(self, request: CallModelInput) -> CallModelResult:
        return CallModelResult(message=Message(role="assistant", content=None), provider=self.name)


async def test_an_empty_model_answer_is_reported_plainly_not_as_an_empty_reply(run_worker, session_id):
    async with run_worker(SaysNothing()) as hermes:
        result = await hermes.send_message(session_id, "hello?")
        assert result.reply.startswith("The model returned an empty answer")
        transcript = await hermes.get_transcript(session_id)
        assert [(m.role, m.internal) for m in transcript] == [("user", False), ("assistant", False), ("assistant", True)]


class _SessionAnswering:
    """Stands for a session rebuilt from history: it no longer knows the recorded context
    reference, but has the model call in flight (``get_model_context``)."""

    def __init__(self, bodies: dict[str, str], refs: list[str]) -> None:
        self.bodies, self.refs = bodies, refs
        self.queries: list[str] = []

    def get_workflow_handle(self, session_id: str) -> "_SessionAnswering":
        return self

    async def query(self, name: str, arg=None, *, args=(), result_type=None, rpc_timeout=None):  # noqa: ANN001
        """As ``WorkflowHandle.query``: one positional argument or ``args``."""
        from hermes import names

        self.queries.append(name)
        if name == names.GET_MODEL_CONTEXT:
            return self.refs if list(args) == [3, 1] else None
        wanted = arg if arg is not None else (args[0] if args else [])
        return {r: self.bodies[r] for r in wanted if r in self.bodies}


async def test_a_model_call_whose_recorded_context_the_session_no_longer_knows_gets_the_current_one():
    import pytest
    from temporalio.exceptions import ApplicationError

    from activities.model import ModelActivities
    from hermes.content.blobs import BlobStore, body_json, message_ref

    messages = [Message(role="system", content="be brief"), Message(role="user", content="question 3")]
    bodies = {message_ref(m): body_json(m) for m in messages}
    session = _SessionAnswering(bodies, list(bodies))
    model = FailsOnceThenRecords()
    model.calls.append([])  # no refusal: answer at once
    activities = ModelActivities(model, store=BlobStore(None), client=session)
    request = CallModelInput(session_id="s", turn=3, step=1, context_ref="b:" + "0" * 32)
    result = await activities.call_model(request)
    assert result.message.content == "answered"
    assert [m.content for m in model.calls[-1]] == ["be brief", "question 3"]
    # another step's context is never taken for this one
    with pytest.raises(ApplicationError, match="not in the content store or the session"):
        await activities.call_model(request.model_copy(update={"step": 2}))


async def test_a_session_query_a_worker_failed_to_replay_is_asked_again_and_other_refusals_are_final():
    # Issue 12's soak: a worker without the session cached (or with a stale copy of a
    # session that moved) failed the query with a nondeterminism error, although the
    # session's history replays cleanly; the next attempt reached a worker that had it.
    import pytest
    from temporalio.client import WorkflowQueryFailedError

    from activities.model import ModelActivities
    from hermes import names
    from hermes.content.blobs import BlobStore

    class Flaky(_SessionAnswering):
        def __init__(self, failure: str) -> None:
            super().__init__({"m:1": "body"}, ["m:1"])
            self.failure = failure

        async def query(self, name: str, arg=None, *, args=(), result_type=None, rpc_timeout=None):  # noqa: ANN001
            if not self.queries:
                self.queries.append(name)
                raise WorkflowQueryFailedError(self.failure)
            return await super().query(name, arg, args=args, result_type=result_type, rpc_timeout=rpc_timeout)

    replay = Flaky("[TMPRL1100] Nondeterminism error: Update machine does not handle this event")
    activities = ModelActivities(FailsOnceThenRecords(), store=BlobStore(None), client=replay)
    bodies = await activities._ask_session("s", names.GET_MESSAGE_BODIES, [["m:1"]], dict[str, str])
    assert bodies == {"m:1": "body"} and len(replay.queries) == 2

    refused = Flaky("no query handler named get_message_bodies")
    activities = ModelActivities(FailsOnceThenRecords(), store=BlobStore(None), client=refused)
    with pytest.raises(WorkflowQueryFailedError, match="no query handler"):
        await activities._ask_session("s", names.GET_MESSAGE_BODIES, [["m:1"]], dict[str, str])
    assert len(refused.queries) == 1
