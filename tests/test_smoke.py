from hermes.models import ToolResultCode

SCRIPT = {
    "turns": [
        {"match": "time", "steps": [
            {"tool_calls": [{"name": "current_time", "arguments": {"timezone": "Asia/Shanghai"}}]},
            {"reply": "It is {{ last_tool_result.data.time }}."},
        ]},
        {"steps": [{"reply": "Hello!"}]},
    ]
}


async def test_a_turn_with_a_tool_call_returns_the_reply_and_the_call(run_worker, session_id):
    async with run_worker(SCRIPT) as hermes:
        first = await hermes.send_message(session_id, "hi", user_id="alice")
        assert first.reply == "Hello!"
        second = await hermes.send_message(session_id, "what time is it?", user_id="alice")
        assert second.reply.startswith("It is ")
        assert [c.name for c in second.tool_calls] == ["current_time"]
        assert second.tool_calls[0].result.code == ToolResultCode.OK
        state = await hermes.get_state(session_id)
        assert state.turn_count == 2
        transcript = await hermes.get_transcript(session_id)
        assert [m.role for m in transcript] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
