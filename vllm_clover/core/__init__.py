"""Clover inside vLLM: the method's start-up checks (``checks``), the draft model built from
vLLM layers around the shared head loop (``model``), the proposer vLLM's runner calls each
step (``proposer``), the target's LM head attached to the heads' tables (``target_tables``),
and which prefix-cache blocks Clover-2's draft KV may keep (``prefix_blocks``)."""
