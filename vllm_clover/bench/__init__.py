"""`vllm-clover bench`: vanilla, ngram, Medusa and Clover through vLLM on the same prompts;
`vllm-clover search-tree`: the token tree to draft, from node acceptance measured through vLLM.

config.py   options (one dataclass), validated before any engine starts
prompts.py  MT-Bench first turns, or a prompts / ShareGPT file
measure.py  one timed generation and the counters around it (shared with the demo)
runner.py   one engine per (method, batch size), each in a forked child process
report.py   rows of figures, JSON and Markdown
check.py    heads checked through vLLM on held-out prompts (what make-heads ends with)
tree_search.py  the candidate tree's node rates, the best subtree per size, the default tree
"""
