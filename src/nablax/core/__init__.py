"""The lazy-eager tensor core: graph, primitives, realization and the op families."""
