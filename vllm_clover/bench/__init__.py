"""`vllm-clover bench`: vanilla, ngram, Medusa and Clover through vLLM on the same prompts;
`vllm-clover search-tree`: the token tree to draft, from node acceptance measured through vLLM.

Options (config.py, arguments.py), prompts, timed runs and counters (measure.py), engines in
child processes (runner.py), reports (report.py, summary.py), the tie check (ties.py), the
make-heads check (check.py) and the tree search (tree_search.py). How it works:
docs/design/engine-layer.md, "The benchmark".
"""
