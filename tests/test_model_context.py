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
