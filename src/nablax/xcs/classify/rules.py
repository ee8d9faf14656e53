"""What the classifier knows about libraries: dotted-name prefixes → tensor / orchestration / neutral.

Internal to :mod:`nablax.xcs.classify` (:class:`~.records.Rule` is the record). A name is matched
on whole dotted components (longest prefix wins), so ``relax`` never matches ``lax`` and
``requests_count`` never matches ``requests``.
"""

from __future__ import annotations

import sys

from .records import Rule

JAX = Rule("tensor", "JAX", True)
NABLAX = Rule("tensor", "nablax", True)
NUMPY = Rule("tensor", "NumPy")
NUMPY_CONST = Rule("tensor", "NumPy constant", True)  # np.float32, np.pi: fine under tracing
TORCH = Rule("tensor", "PyTorch")
ARRAY_LIB = Rule("tensor", "array library")
HTTP = Rule("orchestration", "HTTP I/O")
LLM = Rule("orchestration", "LLM API")
DB = Rule("orchestration", "database")
CLOUD = Rule("orchestration", "cloud storage")
PROC = Rule("orchestration", "subprocess")
NET = Rule("orchestration", "network I/O")
FILE = Rule("orchestration", "file I/O")
CONSOLE = Rule("orchestration", "console I/O")
WAIT = Rule("orchestration", "a blocking wait")
WEB_API = Rule("orchestration", "web API")
NEUTRAL = Rule("neutral", "no I/O, no tensors")
# exec / eval run code that cannot be read: neither kind is known (the safe route, effects assumed)
DYNAMIC = Rule("unknown", "runs code that cannot be analyzed")
# modules of this package that hold example user code (demos): analyzed from source like the
# user's own code, not judged as library code by their module name
USER_CODE = Rule("user", "user code")


def _many(rule: Rule, *names: str) -> dict[str, Rule]:
    return {n: rule for n in names}


_NP_CONSTS = "pi e inf nan newaxis euler_gamma dtype generic bool_ float16 float32 float64 "
_NP_CONSTS += "int8 int16 int32 int64 uint8 uint16 uint32 uint64 complex64 complex128 finfo iinfo"
_NP_IO = "load save savez savez_compressed loadtxt savetxt genfromtxt fromfile memmap lib.npyio"
_OS_FILE = (
    "remove unlink rename replace makedirs mkdir rmdir removedirs listdir scandir walk stat open "
    "read write fdopen chmod chown symlink link truncate fsync utime"
)
_OS_PATH_FILE = "exists isfile isdir islink getsize getmtime getctime getatime samefile"
_PATH_IO = (
    "read_text write_text read_bytes write_bytes open iterdir glob rglob unlink mkdir touch "
    "rmdir rename replace stat exists is_file is_dir resolve chmod symlink_to"
)
_PANDAS_IO = (
    "read_csv read_parquet read_json read_excel read_sql read_feather read_pickle read_table"
)

RULES: dict[str, Rule] = {
    **_many(JAX, "jax", "jaxlib", "flax", "optax", "equinox", "chex", "orbax", "jraph"),
    "jax.device_get": Rule("tensor", "JAX host transfer"),
    **_many(NABLAX, "nablax"),
    **_many(NEUTRAL, "nablax.xcs", "nablax.cli", "nablax.demo", "nablax._config", "nablax.errors"),
    "nablax.xcs.loopback": HTTP,  # the local test service: chat/score are HTTP calls
    "nablax.xcs.demo": USER_CODE,
    **{
        f"nablax.core.tensor.Tensor.{m}": Rule("tensor", "nablax realization")
        for m in ("numpy", "item", "tolist")
    },
    **_many(NUMPY, "numpy"),
    **{f"numpy.{n}": NUMPY_CONST for n in _NP_CONSTS.split()},
    **{f"numpy.{n}": FILE for n in _NP_IO.split()},
    **_many(TORCH, "torch", "torchvision", "torchaudio"),
    **_many(FILE, "torch.load", "torch.save", "torch.hub", "torchvision.io"),
    **_many(ARRAY_LIB, "scipy", "tensorflow", "cupy", "sklearn", "numba", "jaxtyping"),
    **_many(ARRAY_LIB, "pandas", "polars", "xarray"),  # host data frames, as NumPy (not traceable)
    **_many(HTTP, "requests", "httpx", "urllib3", "aiohttp", "http.client", "urllib.request"),
    **_many(HTTP, "websockets", "websocket", "grpc", "xmlrpc.client", "httpcore", "webbrowser"),
    "urllib": HTTP,
    "urllib.parse": NEUTRAL,
    **_many(LLM, "openai", "anthropic", "google.genai", "google.generativeai", "vertexai"),
    **_many(LLM, "cohere", "litellm", "mistralai", "groq", "together", "ollama", "replicate"),
    **_many(LLM, "langchain", "langchain_core", "langchain_openai", "langchain_anthropic"),
    **_many(LLM, "langchain_community", "llama_index", "huggingface_hub", "dspy", "instructor"),
    **_many(DB, "sqlite3", "psycopg", "psycopg2", "asyncpg", "aiosqlite", "pymysql", "MySQLdb"),
    **_many(DB, "pymongo", "motor", "redis", "sqlalchemy", "duckdb", "elasticsearch", "chromadb"),
    **_many(DB, "pinecone", "qdrant_client", "weaviate", "dbm", "shelve", "lmdb"),
    **_many(CLOUD, "boto3", "botocore", "google.cloud", "azure", "s3fs", "fsspec", "gcsfs"),
    **_many(PROC, "subprocess", "pexpect", "os.system", "os.popen", "os.fork"),
    **{f"os.{n}": PROC for n in "execv execve execvp execl spawnv spawnl posix_spawn".split()},
    **_many(PROC, "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell"),
    **_many(NET, "socket", "ssl", "select", "selectors", "socketserver", "smtplib", "ftplib"),
    **_many(NET, "imaplib", "poplib", "telnetlib", "paramiko", "asyncssh", "zmq"),
    **_many(NET, "asyncio.open_connection", "asyncio.start_server", "asyncio.open_unix_connection"),
    **_many(FILE, "builtins.open", "io.open", "io.FileIO", "io.open_code", "shutil", "tempfile"),
    **_many(FILE, "glob", "gzip.open", "bz2.open", "lzma.open", "zipfile", "tarfile", "mmap"),
    **_many(FILE, "json.load", "json.dump", "pickle.load", "pickle.dump", "fileinput"),
    **_many(FILE, "aiofiles", "h5py", "zarr", "soundfile", "PIL.Image.open", "imageio"),
    **{f"os.{n}": FILE for n in _OS_FILE.split()},
    **{f"os.path.{n}": FILE for n in _OS_PATH_FILE.split()},
    **{f"pathlib.Path.{n}": FILE for n in _PATH_IO.split()},
    **{f"pandas.{n}": FILE for n in _PANDAS_IO.split()},
    **_many(CONSOLE, "builtins.print", "builtins.input", "builtins.breakpoint", "getpass"),
    **_many(CONSOLE, "sys.stdout", "sys.stderr", "sys.stdin"),
    **_many(WAIT, "time.sleep", "asyncio.sleep"),  # waits: concurrency pays, no effects
    **_many(WEB_API, "stripe", "twilio", "sendgrid", "slack_sdk", "telegram", "discord"),
    **_many(DYNAMIC, "builtins.exec", "builtins.eval"),
}

# C modules and private implementation modules under the public name users know.
MODULE_ALIASES = {
    "posix": "os",
    "nt": "os",
    "posixpath": "os.path",
    "ntpath": "os.path",
    "genericpath": "os.path",
    "io.open": "builtins.open",
    "_io": "io",
    "_socket": "socket",
    "_ssl": "ssl",
    "_sqlite3": "sqlite3",
    "_posixsubprocess": "subprocess",
    "_pickle": "pickle",
    "_json": "json",
    "_asyncio": "asyncio",
    "asyncio.tasks": "asyncio",
    "_operator": "operator",
    "_functools": "functools",
    "_collections": "collections",
    "_random": "random",
}

# Methods and attributes that no builtin Python type has and arrays (NumPy, JAX, PyTorch, nablax,
# pandas) all do: on a value whose type is unknown they are evidence that it is an array.
# Names that lists, dicts, strings or common objects also have (count, index, copy, max, min,
# all, any, size, round, log, sort) are left out on purpose.
_ARRAY_METHODS = (
    "reshape astype block_until_ready argmax argmin squeeze ndim shape dtype T mT sum mean std "
    "var prod cumsum cumprod argsort transpose matmul dot flatten ravel permute unsqueeze "
    "softmax log_softmax clip numel contiguous swapaxes"
)
ARRAY_METHOD = Rule("tensor", "array method", True)
_MONGO = (  # document-store methods no builtin type has
    "insert_one insert_many find_one update_one update_many delete_one delete_many replace_one "
    "count_documents bulk_write find_one_and_update find_one_and_delete create_index"
)

# Methods whose name alone says what the receiver is, when the receiver cannot be resolved
# (a parameter, the result of a call): Path / file / DB cursor / socket / array objects.
METHOD_HINTS: dict[str, Rule] = {
    **{m: FILE for m in "read_text write_text read_bytes write_bytes iterdir rglob touch".split()},
    **{m: FILE for m in "unlink rmdir mkdir symlink_to hardlink_to".split()},
    **{m: FILE for m in "to_csv to_parquet to_excel to_sql".split()},
    **{m: DB for m in "fetchall fetchone fetchmany executemany executescript".split()},
    **{m: DB for m in _MONGO.split()},
    **{m: NET for m in "recv recv_into recvfrom sendall sendto".split()},
    **{m: HTTP for m in "iter_lines iter_content aiter_lines aiter_bytes aiter_text".split()},
    "raise_for_status": HTTP,  # requests / httpx responses: the request was just made
    **{m: ARRAY_METHOD for m in _ARRAY_METHODS.split()},
    **{m: Rule("tensor", "PyTorch tensor method") for m in "detach cpu cuda backward".split()},
    **{m: Rule("tensor", "array-to-host method") for m in ("tolist", "item", "numpy")},
}

# Attribute-chain endings of LLM SDK clients (OpenAI, Anthropic, Google GenAI, ...), for clients
# that arrive as parameters or attributes whose object is not available.
LLM_SUFFIXES = tuple(
    tuple(s.split("."))
    for s in (
        "chat.completions.create",
        "chat.completions.parse",
        "completions.create",
        "messages.create",
        "messages.stream",
        "embeddings.create",
        "responses.create",
        "models.generate_content",
        "generate_content",
        "generate_content_async",
        "models.embed_content",
    )
)

# Annotations naming these classes say "this parameter is a client / connection".
CLIENT_WORDS = ("Client", "Session", "Connection", "Cursor", "OpenAI", "Anthropic", "socket")

STDLIB = frozenset(sys.stdlib_module_names) | {"builtins"}


def canonical(path: str) -> str:
    """``posixpath.join`` → ``os.path.join``: private module names under their public name."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        alias = MODULE_ALIASES.get(".".join(parts[:n]))
        if alias is not None:
            return ".".join([alias, *parts[n:]])
    return path


def lookup(path: str) -> Rule | None:
    """The rule for a dotted name (longest whole-component prefix), or ``None`` if unknown.
    Standard-library names without a rule are neutral; builtins other than I/O ones are pure."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        rule = RULES.get(".".join(parts[:n]))
        if rule is USER_CODE:
            return None
        if rule is not None:
            return rule
    return NEUTRAL if parts[0] in STDLIB else None


def llm_suffix(names: tuple[str, ...]) -> str | None:
    """The LLM-API ending of an attribute chain (``client.chat.completions.create``), if any."""
    for suffix in LLM_SUFFIXES:
        if len(names) >= len(suffix) and names[-len(suffix) :] == suffix:
            return ".".join(suffix)
    return None
