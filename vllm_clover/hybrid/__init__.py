"""Hybrid drafting: prompt lookup beside Clover's heads, the better chain per request.

`lookup.py` finds a request's n-gram continuation (vLLM's ngram rule, in NumPy); `choice.py`
picks the source with the longer expected accepted chain; `drafter.py` does it in `propose`.
How it works: docs/design/drafting.md, "Hybrid drafting"."""
