"""Corpus: callables users pass straight to ``xcs`` without writing a function: builtins, C
functions, library functions and methods (labels in CASES; judged by their module)."""

from __future__ import annotations

import json
import math
import operator
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx

try:
    import torch
except ImportError:  # optional
    torch = None

CASES = [
    ("len", len, "pure", False),
    ("sorted", sorted, "pure", False),
    ("max", max, "pure", False),
    ("math.sqrt", math.sqrt, "pure", False),
    ("json.loads", json.loads, "pure", False),
    ("re.sub", re.sub, "pure", False),
    ("operator.add", operator.add, "pure", False),
    ("time.sleep", time.sleep, "orchestration", False),
    ("str.upper", str.upper, "pure", False),
    ('"abc".upper (bound builtin)', "abc".upper, "pure", False),
    ("dict.get", dict.get, "pure", False),
    ("numpy.add (ufunc)", np.add, "tensor", False),
    ("numpy.linalg.norm", np.linalg.norm, "tensor", False),
    ("jnp.dot", jnp.dot, "tensor", False),
    ("jax.nn.softmax", jax.nn.softmax, "tensor", False),
    ("nx.matmul", nx.matmul, "tensor", False),
    ("torch.matmul", torch.matmul if torch is not None else None, "tensor", False),
    ("open", open, "orchestration", True),
    ("print", print, "orchestration", True),
    ("input", input, "orchestration", True),
    ("os.remove", os.remove, "orchestration", True),
    ("subprocess.run", subprocess.run, "orchestration", True),
    ("shutil.copy", shutil.copy, "orchestration", True),
    ("sqlite3.connect", sqlite3.connect, "orchestration", False),
    ("socket.create_connection", socket.create_connection, "orchestration", False),
    ("urllib.request.urlopen", urllib.request.urlopen, "orchestration", True),
]
