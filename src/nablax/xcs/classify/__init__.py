"""The classifier behind ``xcs.classify`` and ``xcs.analyze_operations``: is a function tensor,
orchestration, hybrid or pure code, does it have external effects, and why.

Its public names are re-exported by :mod:`nablax.xcs` (``xcs.classify``, ``xcs.Classification``,
...); the modules here are internal. Import them as ``from nablax.xcs.classify import analysis``
or ``from nablax.xcs.classify.analysis import classify_target``: the attribute
``nablax.xcs.classify`` is the *function* ``xcs.classify``, which hides this package's name, so
``import nablax.xcs.classify.analysis as a`` does not work.

Modules, each one idea, lowest first (a module imports only modules above it in this list):

- ``records.py``: the shared records (``Rule``, ``Evidence``, ``Analysis``, ``Context``,
  ``Classification``, ``OperationSummary``), the effect statuses and ``MISSING``;
- ``rules.py``: what library names mean (``numpy`` is tensor, ``requests`` is HTTP I/O, ...);
- ``verbs.py``: what the words of a name say (``put_object`` writes, ``list_objects`` reads);
- ``source.py``: the syntactic facts of a function, read from its source or bytecode;
- ``objects.py``: objects read statically (dotted names, library or user code, attributes);
- ``effects.py``: the effect status of each I/O operation, and of a whole function;
- ``evidence.py``: evidence from a rule, the order of reasons, a helper as evidence;
- ``keywords.py``: the keyword fallback for calls on receivers whose type is unknown;
- ``resolve.py``: the names a function uses, resolved to the objects they denote;
- ``function.py``: the evidence of one Python function (``FunctionAnalyzer``);
- ``callables.py``: any callable analyzed by what it is (marked, wrapper, partial, class, ...);
- ``verdict.py``: from an ``Analysis`` to a ``Classification`` and an ``OperationSummary``;
- ``target.py``: the definitions of a file or module, and the ``nablax classify`` table;
- ``analysis.py``: the public entry points and the classification cache.

Besides ``nablax._caches``, the only module outside this package they use is
``nablax.xcs.markers`` (which imports nothing of nablax).
"""
