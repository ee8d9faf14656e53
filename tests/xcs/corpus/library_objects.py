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
    ("len", len, "pure"),
    ("sorted", sorted, "pure"),
    ("max", max, "pure"),
    ("math.sqrt", math.sqrt, "pure"),
    ("json.loads", json.loads, "pure"),
    ("re.sub", re.sub, "pure"),
    ("operator.add", operator.add, "pure"),
    ("time.sleep", time.sleep, "pure"),
    ("str.upper", str.upper, "pure"),
    ('"abc".upper (bound builtin)', "abc".upper, "pure"),
    ("dict.get", dict.get, "pure"),
    ("numpy.add (ufunc)", np.add, "tensor"),
    ("numpy.linalg.norm", np.linalg.norm, "tensor"),
    ("jnp.dot", jnp.dot, "tensor"),
    ("jax.nn.softmax", jax.nn.softmax, "tensor"),
    ("nx.matmul", nx.matmul, "tensor"),
    ("torch.matmul", torch.matmul if torch is not None else None, "tensor"),
    ("open", open, "orchestration"),
    ("print", print, "orchestration"),
    ("input", input, "orchestration"),
    ("os.remove", os.remove, "orchestration"),
    ("subprocess.run", subprocess.run, "orchestration"),
    ("shutil.copy", shutil.copy, "orchestration"),
    ("sqlite3.connect", sqlite3.connect, "orchestration"),
    ("socket.create_connection", socket.create_connection, "orchestration"),
    ("urllib.request.urlopen", urllib.request.urlopen, "orchestration"),
]
