"""Keyword fallback: what a call on an object whose type cannot be resolved probably is, from the
names written at the call (``llm.invoke(...)``, ``self.chain.batch(...)``, ``db.commit()``).

Internal to :mod:`nablax.xcs.classify`. Used only when nothing stronger is known about the
receiver (it is a parameter, a ``None`` placeholder, an attribute set from a parameter), and
always said in the reasons ("keyword fallback: ..."). Words are whole identifier words
(``qa_chain`` ends with *chain*; ``chat_history`` ends with *history*, so it is not an LLM), and
container methods (``append``, ``items``, ``clear``, ...) never count, whatever the receiver.

A name bound nowhere (an undefined global, a global still ``None``) that is called directly is
judged by any of its words: LLM words and *completion* mean an LLM call (``create_completion``),
array-operation words a tensor operation (``matmul``, ``batched_einsum``). A called parameter
keeps its stricter rule: its kind is known only at run time unless its name names an LLM.
"""

from __future__ import annotations

from . import rules
from .records import Rule
from .verbs import AMBIGUOUS as _AMBIGUOUS
from .verbs import BOOKKEEPING as _BOOKKEEPING
from .verbs import tokens

LLM = Rule("orchestration", "an LLM call")
AGENT = Rule("orchestration", "an LLM agent")
CLIENT = Rule("orchestration", "an API client")
DB = Rule("orchestration", "a database handle")
STORE = Rule("orchestration", "a vector store")
NET = Rule("orchestration", "a network connection")
CLOUD = Rule("orchestration", "cloud storage")

_WORDS: dict[str, Rule] = {
    **{
        w: LLM
        for w in "llm llms lm chat chain chains runnable retriever embedder embeddings".split()
    },
    **{w: LLM for w in "openai anthropic claude gpt gemini mistral cohere groq ollama".split()},
    **{w: LLM for w in "assistant chatbot bot completer".split()},
    **{w: AGENT for w in "agent agents".split()},
    **{w: CLIENT for w in "client session api http transport stub sdk".split()},
    **{w: DB for w in "db conn connection cursor cur database redis mongo".split()},
    **{w: STORE for w in "vectorstore vectordb store index".split()},
    **{w: NET for w in "sock socket ws websocket".split()},
    **{w: CLOUD for w in "s3 gcs bucket".split()},
}
_WHOLE = {"vectorstore": STORE, "vector_store": STORE, "chatbot": LLM, "s3": CLOUD}
# ``index`` and ``store`` are common words: only with a qualifier (vector_index, doc_store)
_NEED_QUALIFIER = frozenset({"index", "store"})
_MODEL = frozenset({"model", "models"})  # an LLM or a neural network: decided by the caller
# the methods of a LangChain-style runnable, on a ``a | b`` composition
_RUNNABLE = frozenset("invoke ainvoke batch abatch stream astream run arun".split())
# words that, in the name of an undefined function called directly, say what it computes
_COMPLETION = frozenset({"completion", "completions"})
ARRAY_OP = Rule("tensor", "an array operation")
_ARRAY_WORDS = frozenset("matmul einsum tensordot logsumexp softmax".split())
# methods distinctive of LLM / retrieval frameworks, on any receiver
LLM_METHODS = frozenset(
    """invoke ainvoke abatch astream astream_events astream_log acomplete achat acompletion
    embed_query embed_documents aembed_query aembed_documents similarity_search
    asimilarity_search similarity_search_with_score max_marginal_relevance_search
    get_relevant_documents aget_relevant_documents""".split()
)


def category(name: str) -> Rule | None:
    """The fallback rule a receiver's name suggests, or None.

    >>> category("qa_chain").what, category("chat_history"), category("redis_client").what
    ('an LLM call', None, 'an API client')
    """
    lname = name.lower()
    if lname in _WHOLE:
        return _WHOLE[lname]
    words = tokens(name)
    if not words:
        return None
    last = words[-1]
    if last in _MODEL:
        return LLM if any(_WORDS.get(w) is LLM for w in words[:-1]) else None
    if last in _NEED_QUALIFIER and len(words) == 1:
        return None
    return _WORDS.get(last)


def is_model(name: str) -> bool:
    words = tokens(name)
    return bool(words) and words[-1] in _MODEL and category(name) is None


def array_word(name: str) -> str | None:
    """The array-operation word in the name of an undefined function, if any.

    >>> array_word("batched_matmul"), array_word("format_row")
    ('matmul', None)
    """
    return next((w for w in tokens(name) if w in _ARRAY_WORDS), None)


def _library(name: str) -> Rule | None:
    rule = rules.RULES.get(name)
    return rule if rule is not None and rule.kind == "orchestration" else None


def fallback(
    names: tuple[str, ...], self_name: str | None, direct_param: bool, undefined: bool = False
) -> tuple[Rule, int, str, bool] | None:
    """``(rule, index of the call's name, what suggests it, ambiguous)`` for the first call in
    ``names`` (an unresolved chain), or None. ``ambiguous`` (a receiver named ``model``) means:
    use it only if the function has no tensor evidence. ``direct_param``: ``names`` calls a
    parameter directly (``llm(prompt)``); ``undefined``: it calls a name bound nowhere
    (``create_completion(text)``)."""
    if "()" not in names[1:]:
        return None
    k = names.index("()", 1)
    callee = names[k - 1]
    if callee in ("()", "[]", "?") or callee in _BOOKKEEPING:
        return None
    receivers = [n for n in names[: k - 1] if n not in ("()", "[]", "?")]
    if receivers and receivers[0] == self_name:
        receivers = receivers[1:]
    if k >= 2 and callee in LLM_METHODS:  # a method: llm.invoke(...), (prompt | llm).invoke(...)
        return LLM, k - 1, f"the method name `.{callee}`", False
    if receivers == ["|"] and callee in _RUNNABLE:  # (prompt | llm | parser).batch(...)
        return LLM, k - 1, f"`.{callee}` on a `|` composition", False
    if not receivers:  # a direct call: llm(prompt), self.chat(p), chat_fn(messages)
        rule = category(callee)
        if rule in (LLM, AGENT):
            return rule, k - 1, f"the name `{callee}`", False
        words = tokens(callee)
        if (direct_param or undefined) and any(_WORDS.get(w) in (LLM, AGENT) for w in words):
            return LLM, k - 1, f"the name `{callee}`", False
        if undefined and any(w in _COMPLETION for w in words):
            return LLM, k - 1, f"the name `{callee}`", False
        return None
    for i, name in enumerate(reversed(receivers)):
        if callee in _AMBIGUOUS and i > 0:
            break
        rule = category(name) or _library(name)
        if rule is not None:
            return rule, k - 1, f"the name `{name}`", False
        if i == 0 and is_model(name):
            return LLM, k - 1, f"the name `{name}`", True
    return None
