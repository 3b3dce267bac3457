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
