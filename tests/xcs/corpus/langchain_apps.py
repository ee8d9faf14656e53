"""Corpus: LangChain / LlamaIndex-style applications: runnables composed with ``|``, ``invoke`` /
``ainvoke`` / ``batch`` / ``stream``, retrievers, vector stores, agents as classes, tools,
partials and lambdas. None of these libraries needs to be installed: the objects arrive as
parameters, instance attributes or module globals that are ``None`` here (labels: kind, effects).
"""

from __future__ import annotations

import functools
import json
import re

import jax.numpy as jnp
import numpy as np

try:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
except ImportError:  # optional
    ChatPromptTemplate = StrOutputParser = ChatOpenAI = OpenAIEmbeddings = None

if ChatOpenAI is not None:
    llm = ChatOpenAI(model="gpt-4o-mini", temperature=0)
    prompt = ChatPromptTemplate.from_template("Answer briefly: {question}")
    qa_chain = prompt | llm | StrOutputParser()
    embeddings = OpenAIEmbeddings()
else:
    llm = prompt = qa_chain = embeddings = None


def answer_question(question: str) -> str:
    return qa_chain.invoke({"question": question})


def ask_model(model, question: str) -> str:
    return model.invoke(question).content


async def answer_async(chain, question: str) -> str:
    return await chain.ainvoke({"question": question})


def answer_many(chain, questions: list[str]) -> list[str]:
    return chain.batch([{"question": q} for q in questions], config={"max_concurrency": 4})


def stream_answer(chain, question: str):
    for chunk in chain.stream({"question": question}):  # noqa: UP028
        yield chunk


def print_stream(llm, question: str) -> None:
    for chunk in llm.stream(question):
        print(chunk.content, end="", flush=True)


def summarize_with_llm(llm, text: str) -> str:
    msg = llm.invoke([("system", "Summarize in one sentence."), ("human", text)])
    return msg.content.strip()


def retrieve_context(retriever, question: str) -> str:
    docs = retriever.invoke(question)
    return "\n\n".join(d.page_content for d in docs)


def search_store(vectorstore, query: str, k: int = 4) -> list[str]:
    return [d.page_content for d in vectorstore.similarity_search(query, k=k)]


def index_documents(vectorstore, texts: list[str]) -> list[str]:
    return vectorstore.add_texts(texts)


def embed_query_norm(embedder, query: str):
    vec = jnp.asarray(embedder.embed_query(query))
    return vec / jnp.linalg.norm(vec)


def rank_by_embedding(query: str, docs: list[str]):
    q = np.asarray(embeddings.embed_query(query))
    d = np.asarray(embeddings.embed_documents(docs))
    return np.argsort(-(d @ q))


def format_docs(docs) -> str:
    return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs))


def parse_json_reply(reply: str) -> dict:
    match = re.search(r"\{.*\}", reply, flags=re.S)
    return json.loads(match.group(0)) if match else {}


class ResearchAgent:
    """A tool-using agent: the LLM picks tools, the agent keeps a scratchpad."""

    def __init__(self, llm, tools: dict):
        self.llm = llm
        self.tools = tools
        self.scratchpad: list[str] = []

    def plan(self, goal: str) -> str:
        reply = self.llm.invoke(f"Plan the steps to: {goal}")
        self.scratchpad.append(reply.content)
        return reply.content

    def remember(self, note: str) -> None:
        self.scratchpad.append(note.strip())

    def history(self) -> str:
        return "\n".join(self.scratchpad[-10:])


class SupportBot:
    def __init__(self, chat_model, kb_retriever):
        self.chat_model = chat_model
        self.kb = kb_retriever

    def reply(self, message: str) -> str:
        context = retrieve_context(self.kb, message)
        return self.chat_model.invoke(f"{context}\n\nCustomer: {message}").content


def rewrite_query(llm_chain, query: str) -> str:
    return llm_chain.run(query)


def classify_ticket(agent, ticket: str) -> str:
    return agent.run(f"Classify this ticket: {ticket}")


def score_candidates(llm, question: str, candidates: list[str]):
    """LLM grades, then a softmax over the grades (hybrid)."""
    grades = [float(llm.invoke(f"Grade 0-9: {question}\n{c}").content) for c in candidates]
    g = jnp.asarray(grades)
    return jnp.exp(g) / jnp.exp(g).sum()


def embed_and_center(embedder, texts: list[str]):
    x = np.asarray(embedder.embed_documents(texts))
    return x - x.mean(axis=0)


def llama_query(query_engine, question: str) -> str:
    return str(query_engine.query(question))


def build_messages(system: str, history: list[tuple[str, str]], user: str) -> list[dict]:
    msgs = [{"role": "system", "content": system}]
    for role, content in history:
        msgs.append({"role": role, "content": content})
    msgs.append({"role": "user", "content": user})
    return msgs


def truncate_history(chat_history: list[dict], max_turns: int = 8) -> list[dict]:
    return chat_history[-2 * max_turns :]


def count_tokens(text: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", text))


ask_gpt = functools.partial(ask_model, None)
quick_summary = lambda text: summarize_with_llm(llm, text)  # noqa: E731
extract_answer = lambda chain, q: chain.invoke({"question": q})["answer"]  # noqa: E731
_agent = ResearchAgent(llm=None, tools={})
_bot = SupportBot(chat_model=None, kb_retriever=None)

CASES = [
    ("answer_question (module-level chain)", answer_question, "orchestration", False),
    ("ask_model (model.invoke(...).content)", ask_model, "orchestration", False),
    ("answer_async (chain.ainvoke)", answer_async, "orchestration", False),
    ("answer_many (chain.batch)", answer_many, "orchestration", False),
    ("stream_answer (chain.stream)", stream_answer, "orchestration", False),
    ("print_stream (llm.stream + print)", print_stream, "orchestration", True),
    ("summarize_with_llm", summarize_with_llm, "orchestration", False),
    ("retrieve_context (retriever.invoke)", retrieve_context, "orchestration", False),
    ("search_store (similarity_search)", search_store, "orchestration", False),
    ("index_documents (add_texts)", index_documents, "orchestration", True),
    ("embed_query_norm", embed_query_norm, "hybrid", False),
    ("rank_by_embedding (module-level embeddings)", rank_by_embedding, "hybrid", False),
    ("format_docs", format_docs, "pure", False),
    ("parse_json_reply", parse_json_reply, "pure", False),
    ("ResearchAgent.plan (bound)", _agent.plan, "orchestration", False),
    ("ResearchAgent.remember (bound)", _agent.remember, "pure", False),
    ("ResearchAgent.history (bound)", _agent.history, "pure", False),
    ("SupportBot.reply (bound)", _bot.reply, "orchestration", False),
    ("rewrite_query (llm_chain.run)", rewrite_query, "orchestration", False),
    ("classify_ticket (agent.run)", classify_ticket, "orchestration", True),
    ("score_candidates", score_candidates, "hybrid", False),
    ("embed_and_center", embed_and_center, "hybrid", False),
    ("llama_query (query_engine.query)", llama_query, "orchestration", False),
    ("build_messages", build_messages, "pure", False),
    ("truncate_history", truncate_history, "pure", False),
    ("count_tokens", count_tokens, "pure", False),
    ("partial(ask_model, None)", ask_gpt, "orchestration", False),
    ("quick_summary (lambda over a global llm)", quick_summary, "orchestration", False),
    ("extract_answer (lambda, chain parameter)", extract_answer, "orchestration", False),
]
