"""Token trees for Clover, in pure PyTorch (never imports vLLM): the tree as users give it
(``spec``), how a tree is drafted (``draft``), verified (``attention``), accepted
(``accept``) and how the accepted path's KV entries are compacted (``kv``)."""

from vllm_clover.tree.accept import TreeVerdict, accept_greedy, accept_sampled
from vllm_clover.tree.spec import ROOT, TokenTree, TokenTreeError

__all__ = ["ROOT", "TokenTree", "TokenTreeError", "TreeVerdict", "accept_greedy", "accept_sampled"]
