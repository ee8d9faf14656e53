"""What the words of a name say about effects: identifier words (:func:`tokens`), the verbs that
write (``send``, ``post``, ``delete``, ``put_object``) or only read (``get``, ``list_objects``,
``fetch``), the first keyword of an SQL statement, and the container methods that are in-memory
bookkeeping whatever the receiver is called.

Internal to :mod:`nablax.xcs.classify`: :mod:`.effects` uses these words at each call site, and
:mod:`.keywords` reads receivers' names with :func:`tokens`.
"""

from __future__ import annotations

import re

from .records import READ, WRITE

_WRITE_VERBS = frozenset(
    """send sendall sendto sendmail post put patch delete del remove rm unlink rmdir rmtree
    removedirs write writelines writerow writerows insert update upsert commit publish notify pay
    charge refund email mail upload save savez savetxt dump store persist push create add set
    hset hdel lpush rpush sadd zadd incr incrby decr expire mkdir makedirs mkdtemp mkstemp touch
    rename replace move copy copy2 copyfile copytree copyfileobj chmod chown symlink link truncate
    kill terminate deploy submit enqueue emit broadcast alert tweet drop purge flushdb flushall
    transfer cancel approve register subscribe unsubscribe invite archive download urlretrieve
    fsync utime ack bulk merge""".split()
)
_READ_VERBS = frozenset(
    """get fetch read readline readlines load list search query select find lookup retrieve scan
    head options recv receive stat lstat exists isfile isdir islink getsize getmtime getctime
    getatime walk listdir scandir iterdir glob rglob count describe check ping wait sleep poll
    connect close cursor open iter stream batch invoke predict generate complete completion
    chat ask answer embed embedding embeddings similarity summarize classify rerank translate
    transcribe moderate score evaluate tokenize json text content fetchall fetchone fetchmany
    which info status health version aggregate distinct keys mget hget hgetall lrange smembers
    download_fileobj peek tail run arun""".split()
)
_VERBS = _WRITE_VERBS | _READ_VERBS
# read words that are mostly nouns (namespaces): a write verb after them still decides
# (chat_postMessage posts; similarity_search reads)
_READ_NOUNS = frozenset(
    "chat completion embedding embeddings text json content status info version health score "
    "stream batch iter similarity head options".split()
)
# verbs that are also ordinary words in other senses: they do not make a function's *own* name
# mean "has effects" (create_prompt, run_eval, add_numbers, set_seed, merge_dicts, ...)
_WEAK_OWN = frozenset(
    "create add set run merge bulk copy replace move store register download".split()
)
_CONJUNCTIONS = frozenset({"and", "or", "then"})
_EXACT = {  # names whose verb hides in one word, or whose generic verb misleads
    "create_connection": READ, "create_engine": READ, "create_default_context": READ,
    "disk_usage": READ, "gettempdir": READ, "getcwd": READ, "urlretrieve": WRITE,
    "create_subprocess_exec": WRITE, "create_subprocess_shell": WRITE, "connect_ex": READ,
    "loadtxt": READ, "genfromtxt": READ, "fromfile": READ, "readlink": READ, "readinto": READ,
    "settimeout": READ, "setblocking": READ, "setsockopt": READ, "socket": READ,
}  # fmt: skip
# methods of lists, dicts and strings: in-memory work, whatever the receiver is named
BOOKKEEPING = frozenset(
    """append extend pop popitem clear copy items keys values setdefault sort reverse index count
    join split rsplit strip lstrip rstrip lower upper format startswith endswith encode decode
    splitlines partition isdigit isalpha title""".split()
)
# container methods that are also I/O verbs: they count only on a receiver named like a handle
AMBIGUOUS = frozenset("get add update remove insert set discard".split())
_TOKEN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_SQL_WRITE = frozenset(
    "insert update delete replace upsert merge create drop alter truncate grant revoke vacuum "
    "attach detach reindex copy".split()
)
_SQL_READ = frozenset("select with pragma show explain describe values".split())


def tokens(name: str) -> list[str]:
    """Lowercase words of an identifier.

    >>> tokens("put_object"), tokens("sendMessage"), tokens("HTTPError")
    (['put', 'object'], ['send', 'message'], ['http', 'error'])
    """
    return [t.lower() for t in _TOKEN.findall(name)]


def verb_status(name: str) -> tuple[str | None, str]:
    """What the verbs of ``name`` say: (WRITE / READ / None, the deciding word). Each part of a
    name split by and/or/then is read for its first verb; any write part makes it a write.

    >>> verb_status("get_post"), verb_status("get_or_create"), verb_status("chat_postMessage")
    (('read', 'get'), ('write', 'create'), ('write', 'post'))
    """
    exact = _EXACT.get(name) or _EXACT.get(name.lower())
    if exact is not None:
        return exact, name
    words = tokens(name)
    if name.lower() in _VERBS:
        words = [name.lower()]
    found: tuple[str | None, str] = (None, "")
    part: list[str] = []
    for w in [*words, "and"]:
        if w not in _CONJUNCTIONS:
            part.append(w)
            continue
        for v in part:
            if v in _WRITE_VERBS:
                return WRITE, v
            if v in _READ_VERBS:
                found = found if found[0] else (READ, v)
                if v not in _READ_NOUNS:
                    break
        part = []
    return found


def creates_completion(name: str) -> bool:
    """``create_completion``, ``createChatCompletion``: the name of an LLM request (as the SDKs'
    ``completions.create``), whose only write verb is ``create``."""
    words = set(tokens(name))
    return (
        "create" in words and bool(words & _LLM_PRODUCTS) and not words & _WRITE_VERBS - {"create"}
    )


_LLM_PRODUCTS = frozenset("completion completions embedding embeddings".split())


def own_name_writes(name: str) -> str | None:
    """The write verb in a function's own name (``send_invoice``), if it says it has effects."""
    status, word = verb_status(name)
    return word if status == WRITE and word not in _WEAK_OWN else None


def sql_status(text: str) -> str | None:
    """READ / WRITE for an SQL statement by its first keyword; None if it does not look like SQL.

    >>> sql_status("SELECT 1"), sql_status("WITH t AS (SELECT 1) DELETE FROM x"), sql_status("hi")
    ('read', 'write', None)
    """
    words = re.findall(r"[A-Za-z_]+", text[:200])
    if not words:
        return None
    first = words[0].lower()
    if first in _SQL_WRITE:
        return WRITE
    if first == "with":  # WITH ... INSERT / UPDATE / DELETE is a write
        return WRITE if any(w.lower() in ("insert", "update", "delete") for w in words) else READ
    return READ if first in _SQL_READ else None
