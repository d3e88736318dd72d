"""Hybrid drafting: prompt lookup beside Clover's heads, the better chain per request.

`lookup.py` finds a request's n-gram continuation (vLLM's ngram semantics, in NumPy);
`choice.py` keeps how often each source's drafts are accepted and picks, per request and
step, the source with the longer expected accepted chain; `drafter.py` does it in the
proposer's `propose`, on each request's history as the step leaves it.
"""
