"""``classify/keywords.py``: the keyword fallback for calls on receivers of unknown type."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from nablax.xcs.classify.analysis import classify


def test_keyword_fallback_for_unresolved_llm_calls():
    def ask(model, q):
        return model.invoke(q).content

    async def ask_async(chain, q):
        return await chain.ainvoke({"q": q})

    def many(runnable, qs):
        return runnable.batch(qs)

    def direct(llm, prompt):
        return llm(prompt)

    class Agent:
        def __init__(self, llm):
            self.llm = llm
            self.notes = []

        def step(self, goal):
            return self.llm.invoke(goal).content

        def note(self, text):
            self.notes.append(text)

    agent = Agent(llm=None)
    for fn in (ask, ask_async, many, direct, agent.step, functools.partial(ask, None)):
        c = classify(fn)
        assert (c.kind, c.effects) == ("orchestration", False), c
        assert any(r.startswith("keyword fallback: ") and "unresolved" in r for r in c.reasons)
    assert classify(lambda chain, q: chain.stream(q)).kind == "orchestration"
    assert classify(agent.note).kind == "pure"  # bookkeeping on an agent is not a call

    def history(chat_history, turns):  # `chat_history` ends with *history*: not an LLM
        chat_history.append(turns)
        return chat_history[-8:]

    assert classify(history).kind == "pure"


def test_runnable_compositions_with_the_pipe_operator():
    def answer(prompt, llm, parser, q):
        return (prompt | llm | parser).invoke({"q": q})

    def answer_all(prompt, llm, qs):
        return (prompt | llm).batch([{"q": q} for q in qs])

    def flags(a, b):
        return (a | b).bit_length()  # `|` on ints: no runnable method, stays pure

    for fn in (answer, answer_all):
        c = classify(fn)
        assert (c.kind, c.effects) == ("orchestration", False), c
        assert "(... | ...)" in c.reasons[0]
    assert classify(flags).kind == "pure"


def test_a_model_receiver_counts_only_without_tensor_work():
    def generate(model, prompt):
        return model.generate(prompt)

    def forward(model, x, y):
        return ((model.predict(x) - y) ** 2).mean()

    assert classify(generate).kind == "orchestration"
    assert classify(forward).kind == "tensor"  # model.predict on arrays: a model, not an LLM


def test_hybrids_with_keyword_orchestration():
    def graded(llm, answers):
        g = jnp.asarray([float(llm.invoke(a).content) for a in answers])
        return jnp.exp(g) / jnp.exp(g).sum()

    def projected(embedder, texts, proj):
        return np.asarray(embedder.embed_documents(texts)) @ proj

    for fn in (graded, projected):
        c = classify(fn)
        assert c.kind == "hybrid", c
        assert any(r.startswith("keyword fallback") for r in c.reasons)
