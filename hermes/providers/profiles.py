"""Provider profiles: what each OpenAI-compatible endpoint accepts and returns.

One chat-completions wire, many dialects. A :class:`ProviderProfile` states, from the
provider's public documentation (and the error bodies its users report), the few places
where an endpoint departs from OpenAI's own:

- which output-limit parameter it takes (``max_tokens`` or ``max_completion_tokens``);
- where reasoning comes back (``reasoning_content`` or ``reasoning``, in ``message`` or in
  each streamed ``delta``) and whether it must be sent back on the assistant messages
  that carry ``tool_calls``;
- whether an assistant message's ``content`` may be ``null``;
- whether parallel tool calls must be asked for, and which ``tool_choice`` values work;
- how usage arrives when streaming.

Sources (read when the profiles were written):

- openai-reasoning: 400 ``Unsupported parameter: 'max_tokens' is not supported with this
  model. Use 'max_completion_tokens' instead.`` (``param: max_tokens``, ``code:
  unsupported_parameter``), as o1/o3/o4-mini/gpt-5 answer; ``parallel_tool_calls`` is
  refused by some of them (``Unsupported parameter: 'parallel_tool_calls'``), so it is never
  sent. Their reasoning is not returned on chat completions.
- deepseek: https://api-docs.deepseek.com/guides/thinking_mode - reasoning in
  ``reasoning_content``; between two user messages, an assistant turn that called tools
  must have its ``reasoning_content`` sent back in every later request, or the API answers
  400 ``Missing `reasoning_content` field in the assistant message at message index N``;
  without tool calls it is ignored.
- qwen (DashScope compatible mode): https://help.aliyun.com/en/model-studio/deep-thinking
  - ``reasoning_content``; ``parallel_tool_calls`` defaults to false (one call per answer
  unless asked); ``stream_options: {include_usage: true}`` puts usage in a last chunk with
  no choices.
- moonshot (Kimi): thinking models return ``reasoning_content`` and refuse a later request
  whose assistant tool-call message lacks it (``thinking is enabled but reasoning_content
  is missing in assistant tool call message``); a forced ``tool_choice`` is refused with
  thinking on; tool-call ids look like ``name:0``; a stream's usage is in the last
  chunk's choice.
- ollama: https://docs.ollama.com/api/openai-compatibility - reasoning in ``reasoning``;
  an assistant message with ``"content": null`` is refused with 400 ``invalid message
  content type: <nil>``; ``tool_choice`` is not supported; a streamed tool call arrives
  whole in one chunk.
- vllm: https://docs.vllm.ai/en/stable/features/reasoning_outputs/ - reasoning in
  ``reasoning`` (``reasoning_content`` before 0.11; both are read).
- llamacpp (llama-server): reasoning in ``reasoning_content`` (``--reasoning-format
  deepseek``, the default); tool-call ids may come back empty (ggml-org/llama.cpp#12279),
  so Hermes makes stable ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal
from urllib.parse import urlsplit

from hermes.errors import ConfigError
from hermes.models import ProviderProfileName

__all__ = ["PROFILES", "ProviderProfile", "ProviderProfileName", "detect_profile", "known_model", "resolve_profile"]


@dataclass(frozen=True)
class ProviderProfile:
    """One endpoint's dialect of the chat-completions wire."""

    name: str
    output_limit_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """The request parameter that caps the output tokens."""
    reasoning_fields: tuple[str, ...] = ()
    """Fields of ``message`` / ``delta`` that carry reasoning, in order of preference."""
    reasoning_sent_back: str | None = None
    """Field under which the reasoning of an assistant message with ``tool_calls`` goes
    back to the provider (``""`` when the transcript has none); None: never sent back."""
    null_content: bool = True
    """Whether an assistant message with ``tool_calls`` may have ``"content": null``
    (otherwise ``""`` is sent)."""
    ask_parallel_tool_calls: bool = False
    """Send ``parallel_tool_calls: true`` when tools are offered (the provider's default is
    one call per answer)."""
    tool_choice: tuple[str, ...] = ("auto", "none", "required", "function")
    """``tool_choice`` values the provider honours (Hermes sends none: ``auto`` is every
    provider's default when tools are offered)."""
    stream: bool = True
    """The provider streams (``stream: true``) chat completions with tool calls."""
    stream_usage_option: bool = True
    """Send ``stream_options: {include_usage: true}``: without it the stream reports no
    usage. False for providers that report usage in the final chunk on their own."""
    models: tuple[str, ...] = ()
    """Model names the provider serves, as case-insensitive ``fnmatch`` patterns, checked
    when a session starts on the provider's own host (:func:`known_model`); empty: any
    name (a local server serves whatever was loaded)."""
    docs: str = ""


_OPENAI_MODELS = ("gpt-*", "chatgpt-*", "o1*", "o3*", "o4*", "codex-*", "computer-use-*", "ft:*")
"""OpenAI's chat model families (https://platform.openai.com/docs/models)."""

PROFILES: dict[str, ProviderProfile] = {
    p.name: p
    for p in (
        ProviderProfile(name="openai", models=_OPENAI_MODELS, docs="https://platform.openai.com/docs/api-reference/chat"),
        ProviderProfile(
            name="openai-reasoning",
            output_limit_parameter="max_completion_tokens",
            models=_OPENAI_MODELS,
            docs="https://platform.openai.com/docs/guides/reasoning",
        ),
        ProviderProfile(
            name="deepseek",
            reasoning_fields=("reasoning_content",),
            reasoning_sent_back="reasoning_content",
            tool_choice=("auto", "none", "required", "function"),
            models=("deepseek-*",),
            docs="https://api-docs.deepseek.com/guides/thinking_mode",
        ),
        ProviderProfile(
            name="qwen",
            reasoning_fields=("reasoning_content",),
            ask_parallel_tool_calls=True,
            tool_choice=("auto", "none", "function"),
            # DashScope serves other families too (https://help.aliyun.com/en/model-studio/models).
            models=("qwen*", "qwq*", "qvq*", "deepseek-*", "kimi-*", "moonshot-*", "glm-*", "llama*"),
            docs="https://help.aliyun.com/en/model-studio/deep-thinking",
        ),
        ProviderProfile(
            name="moonshot",
            reasoning_fields=("reasoning_content",),
            reasoning_sent_back="reasoning_content",
            tool_choice=("auto", "none"),
            stream_usage_option=False,
            models=("kimi-*", "moonshot-*"),
            docs="https://platform.moonshot.ai/docs/guide/use-kimi-k2-thinking-model",
        ),
        ProviderProfile(
            name="ollama",
            reasoning_fields=("reasoning",),
            null_content=False,
            tool_choice=(),
            docs="https://docs.ollama.com/api/openai-compatibility",
        ),
        ProviderProfile(
            name="vllm",
            reasoning_fields=("reasoning", "reasoning_content"),
            docs="https://docs.vllm.ai/en/stable/features/reasoning_outputs/",
        ),
        ProviderProfile(
            name="llamacpp",
            reasoning_fields=("reasoning_content",),
            tool_choice=("auto", "none", "required"),
            stream_usage_option=False,
            docs="https://github.com/ggml-org/llama.cpp/tree/master/tools/server",
        ),
    )
}

_OPENAI_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)", re.IGNORECASE)
"""o1, o3, o4-mini, gpt-5... : the models that refuse ``max_tokens``."""


def detect_profile(base_url: str | None, model: str | None) -> str:
    """The profile a base URL names without doubt; ``openai`` otherwise.

    Args:
        base_url: the endpoint (None: OpenAI's own).
        model: the model name (chooses ``openai-reasoning`` on api.openai.com).

    Returns:
        A key of :data:`PROFILES`. ``vllm`` and ``llamacpp`` are never guessed (they
        serve on any port): set them with ``HERMES_MODEL_PROFILE``.
    """
    parts = urlsplit(base_url or "https://api.openai.com/v1")
    host = (parts.hostname or "").lower()
    port = parts.port
    if host == "api.openai.com":
        return "openai-reasoning" if model and _OPENAI_REASONING_MODEL.match(model.split("/")[-1]) else "openai"
    if host == "api.deepseek.com":
        return "deepseek"
    if host.startswith("dashscope") and host.endswith(".aliyuncs.com"):
        return "qwen"
    if host.startswith("api.moonshot."):
        return "moonshot"
    if port == 11434:
        return "ollama"
    return "openai"


def resolve_profile(name: str | None, base_url: str | None, model: str | None) -> ProviderProfile:
    """The profile called ``name``, or the one :func:`detect_profile` picks when it is
    empty or ``auto``.

    Raises:
        ConfigError: ``name`` is not a known profile.
    """
    if not name or name == "auto":
        return PROFILES[detect_profile(base_url, model)]
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown model profile {name!r}; expected one of: auto, {', '.join(PROFILES)}",
            source="settings",
            key="model_profile",
        ) from None


def known_model(base_url: str | None, model: str) -> bool:
    """Whether the provider at ``base_url`` serves a model called ``model``, as far as its
    profile's :attr:`ProviderProfile.models` tell.

    Args:
        base_url: the endpoint (None: OpenAI's own).
        model: the model name a session asks for.

    Returns:
        False only when the base URL names a provider without doubt (api.openai.com,
        api.deepseek.com, DashScope, Moonshot) and no pattern of its profile matches;
        True for any other endpoint (an OpenAI-compatible proxy or a local server
        serves names of its own: list them in ``HERMES_ALLOWED_MODELS`` to check them).
    """
    host = (urlsplit(base_url or "https://api.openai.com/v1").hostname or "").lower()
    name = detect_profile(base_url, model)
    if name == "openai" and host != "api.openai.com":
        return True
    patterns = PROFILES[name].models
    return not patterns or any(fnmatchcase(model.lower(), p) for p in patterns)
