"""Whether a memory is relevant enough to inject: silence when nothing is (issue 15).

With the multilingual USE encoder a relevant memory in the other language, or in other
words, sits at cosine 0.14-0.25 from its question, and the best match of a question that
no memory answers at 0.10-0.30 (``bench/memory_quality.py``): no single cosine floor
separates them, nor does how far the top hit stands out from the user's other memories
(its z-score: 1.6-3.3 for both). What does separate them better is that the unrelated
matches are *hubs*: memories that sit close to many questions of the same form ("Her
birthday is on October 2." to any "when is ..." question, "I jog about three times every
week." to any "how many ... a week" one). So a memory's similarity is measured against its
own usual level, the mean of its ``HUB_K`` (10) highest similarities to a fixed bank of generic
questions (:data:`REFERENCE_QUESTIONS`, English and Chinese, about the things people ask an
assistant about themselves) - the hubness correction of CSLS (Conneau et al. 2018, "Word
translation without parallel data"), with the question bank in place of the other
language's vocabulary:

    lift(q, m) = cos(q, m) - hub(m),   hub(m) = mean of the HUB_K highest cos(m, r), r in the bank

A memory is admitted (:func:`admit`) when it shares a content word with the question (the
lexical channel; people must match, see below), or when its similarity reaches the model's
retrieval floor *and* its lift reaches the model's ``retrieval_lift``; a similarity at or
above ``retrieval_sure`` admits it on its own. A question about someone else (``my sister``,
``我妈妈``) is not answered by a memory that names none of its people unless the memory
is that close.

The bank is embedded once per embedder (about 0.1 s with USE) and a memory's hub level is
one ``(rows, 512) @ (512, bank)`` product, computed when the user's rows are read (the hot
path holds it); no model is called on the read path.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hermes.memory.embeddings import Embedder, Thresholds

HUB_K = 10
"""A memory's hub level is the mean of its this many highest similarities to the bank."""

REFERENCE_QUESTIONS: tuple[str, ...] = (
    # English: about the user, their people, their work, their plans and preferences
    "When is my birthday?",
    "When is my mother's birthday?",
    "What is my wife's name?",
    "How old are my children?",
    "Where does my brother live?",
    "What does my father do for a living?",
    "Where do I live?",
    "What is my home address?",
    "Which company do I work for?",
    "What is my job title?",
    "Who do I report to at work?",
    "What project am I working on?",
    "When is the deadline for the report?",
    "When is my next meeting?",
    "Which day is the team meeting?",
    "What time does my flight leave?",
    "Which hotel did I book for the trip?",
    "Where am I going on holiday?",
    "What did we decide about the budget?",
    "How much did I spend last month?",
    "How many days a week do I exercise?",
    "What sport do I do?",
    "What do I usually eat for breakfast?",
    "Do I have any food allergies?",
    "Am I allergic to any medicine?",
    "What health problems do I have?",
    "Which doctor do I see?",
    "What is my favourite food?",
    "What music do I like?",
    "What are my hobbies?",
    "Which languages do I speak?",
    "How should you format your answers for me?",
    "What language should you reply in?",
    "Do I prefer short or long answers?",
    "What phone do I have?",
    "What kind of laptop do I use?",
    "Which apps do I use for work?",
    "What car do I drive?",
    "How do I get to work?",
    "What is my order number?",
    "Has my refund arrived?",
    "When does my subscription renew?",
    "When does my passport expire?",
    "What is my account username?",
    "Do I have any pets?",
    "Where did I go to school?",
    "What am I studying at the moment?",
    "Which exam am I preparing for?",
    "What time do I usually go to bed?",
    "What should I avoid when booking a restaurant?",
    # Chinese: the same ground, as Chinese users put it
    "我的生日是哪天？",
    "我爸爸的生日是几月几号？",
    "我老婆叫什么名字？",
    "我孩子今年几岁了？",
    "我姐姐住在哪里？",
    "我妈妈是做什么的？",
    "我住在哪个城市？",
    "我家的地址是什么？",
    "我在哪家公司上班？",
    "我的职位是什么？",
    "我的领导是谁？",
    "我最近在做什么项目？",
    "报告什么时候要交？",
    "下次开会是什么时候？",
    "每周例会是星期几？",
    "我的航班几点起飞？",
    "这次出差订的是哪家酒店？",
    "假期我打算去哪里玩？",
    "预算最后是怎么决定的？",
    "上个月花了多少钱？",
    "我一周运动几次？",
    "我平时做什么运动？",
    "我早饭一般吃什么？",
    "我有什么忌口吗？",
    "我对什么过敏？",
    "我身体有什么毛病？",
    "我平时看哪个医生？",
    "我最喜欢吃什么？",
    "我喜欢听什么音乐？",
    "我有什么爱好？",
    "我会说哪些语言？",
    "回答我的时候要注意什么格式？",
    "你应该用什么语言回复我？",
    "我喜欢简短的回答还是详细的？",
    "我用的是什么手机？",
    "我的笔记本电脑是什么型号？",
    "我工作上用哪些软件？",
    "我开的是什么车？",
    "我每天怎么去上班？",
    "我的订单号是多少？",
    "我的退款到账了吗？",
    "我的会员什么时候到期？",
    "我的护照什么时候过期？",
    "我的账号用户名是什么？",
    "我家养了什么宠物？",
    "我以前在哪里上的学？",
    "我最近在学什么？",
    "我在准备什么考试？",
    "我一般几点睡觉？",
    "订餐厅的时候要注意什么？",
)
"""Generic questions people ask an assistant about themselves, 50 in English and 50 in
Chinese, written for this bank (not taken from the bench's sets): the background against
which a memory's similarity to a question is judged."""


class ReferenceBank:
    """The reference questions embedded by one embedder, and memories' hub levels.

    Args:
        embedder: the model whose scale the hub levels are on.
        questions: the bank (default :data:`REFERENCE_QUESTIONS`).
        k: how many of a memory's highest bank similarities are averaged.

    Raises:
        ValueError: an empty bank, or ``k`` not in 1..len(questions).
    """

    def __init__(self, embedder: Embedder, questions: Sequence[str] = REFERENCE_QUESTIONS, k: int = HUB_K) -> None:
        if not questions:
            raise ValueError("the reference bank needs at least one question")
        if not 1 <= k <= len(questions):
            raise ValueError(f"k must be in 1..{len(questions)}, got {k}")
        self._embedder = embedder
        self._questions = tuple(questions)
        self.k = k
        self._matrix: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def matrix(self) -> np.ndarray:
        """``(len(questions), dim)`` float32: the bank embedded as queries (once)."""
        if self._matrix is None:
            with self._lock:
                if self._matrix is None:
                    # One batch where the embedder takes one (a pooled model: one round trip
                    # to its child instead of one per question: 3 s of a cold first search
                    # on an idle machine, past the search's timeout on a starved one).
                    batch = getattr(self._embedder, "embed_queries", None)
                    rows = batch(list(self._questions)) if batch is not None else [
                        self._embedder.embed_query(q) for q in self._questions
                    ]
                    self._matrix = np.stack(list(rows)).astype(np.float32)
        return self._matrix

    def hub(self, vectors: np.ndarray) -> np.ndarray:
        """Hub levels of memories.

        Args:
            vectors: ``(n, dim)`` float32, L2-normalised memory vectors.

        Returns:
            ``(n,)`` float32: each memory's mean of its ``k`` highest cosines to the bank.
        """
        if len(vectors) == 0:
            return np.zeros(0, dtype=np.float32)
        sims = np.asarray(vectors, dtype=np.float32) @ self.matrix.T
        top = np.partition(sims, sims.shape[1] - self.k, axis=1)[:, -self.k :]
        return top.mean(axis=1)


_JOB_QUESTION = re.compile(
    r"\b(?:job|jobs|title|work|occupation|profession|role|position|employer|career|for\s+a\s+living)\b|"
    r"工作|上班|职位|职业|哪家公司|做什么的",
    re.I,
)
_JOB_STATEMENT = re.compile(
    r"\b(?:is|am|as)\s+(?:a|an|the)\s+(?:[\w-]+\s+){0,3}?(?:lead|manager|engineer|developer|designer|director|"
    r"teacher|nurse|doctor|analyst|consultant|founder|officer|head|architect|scientist|researcher|accountant|lawyer)"
    r"\b|\bworks?\s+(?:at|for|as)\b|老师|教师|经理|工程师|医生|护士|在[^，。,.]{1,12}(?:工作|上班|任职)",
    re.I,
)


def asks_job(query: str) -> bool:
    """Whether a question is about the user's job (its title, role, employer): such a
    question and a memory stating a job (:func:`states_job`) meet on a topic they word
    differently ("What's my current job title?" / "Mira is the product lead at Kestrel
    Labs."), sharing no word and sitting below the similarity-lift check (issue 30); the
    read path takes that as a shared word."""
    return _JOB_QUESTION.search(query) is not None


def states_job(text: str) -> bool:
    """Whether a memory states someone's job ("is the product lead at", "works for", "在...工作")."""
    return _JOB_STATEMENT.search(text) is not None


_BANKS: weakref.WeakKeyDictionary[Embedder, ReferenceBank] = weakref.WeakKeyDictionary()
_BANKS_LOCK = threading.Lock()


def bank_for(embedder: Embedder) -> ReferenceBank:
    """The reference bank of ``embedder``: one per embedder, embedded on first use (the
    caller asks only when its thresholds have a hub check, so an embedding endpoint is not
    called for a bank it does not use)."""
    with _BANKS_LOCK:
        bank = _BANKS.get(embedder)
        if bank is None:
            bank = _BANKS[embedder] = ReferenceBank(embedder)
    return bank


def admit(sim: float, hub: float, *, shared: bool, persons_ok: bool, thresholds: Thresholds) -> bool:
    """Whether a memory is put before the model for a question (rules only, no model).

    Args:
        sim: cosine of the question and the memory.
        hub: the memory's hub level (:meth:`ReferenceBank.hub`).
        shared: the question and the memory share a content word.
        persons_ok: the question names no one else, or the memory names one of them.
        thresholds: the model's thresholds (``retrieval``, ``retrieval_lift``,
            ``retrieval_sure``).

    Returns:
        True when the memory answers something of the question.
    """
    if not persons_ok:
        # A question about someone else meets the user's own memory through the words
        # they share ("my sister's birthday" / "Her birthday is on October 2.", 0.54):
        # those never admit it; only a memory that close without them does.
        return not shared and sim >= thresholds.retrieval_sure
    if shared or sim >= thresholds.retrieval_sure:
        return True
    return sim >= thresholds.retrieval and sim - hub >= thresholds.retrieval_lift
