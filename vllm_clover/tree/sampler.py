"""vLLM's rejection sampler, for token trees: the target's logits at every root and node in,
each request's emitted tokens out (``tree.accept`` decides, greedy or lossless multi-draft).

The output is what vLLM's chain sampler returns, (num_reqs, N + 1) int32 with -1 after each
request's tokens, so the runner's bookkeeping and the scheduler read it unchanged.

How it works: docs/design/drafting.md, "The tree sampler".
"""

from __future__ import annotations

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.rejection_sampler import apply_sampling_constraints

from vllm_clover.tree.accept import TreeVerdict, accept_greedy, accept_sampled
from vllm_clover.tree.spec import TokenTree

GREEDY = 0.0  # vLLM's temperature for greedy requests (GREEDY_TEMPERATURE)


def verify_trees(
    tree: TokenTree, num_draft_tokens: list[int], draft_token_ids, logits, sampling
) -> tuple[SamplerOutput, TreeVerdict]:
    """(vLLM's SamplerOutput for the whole batch, the verdict of every request); each
    request's drafts are a breadth-first prefix of the tree."""
    drafts, rows = _padded(tree, num_draft_tokens, draft_token_ids)  # (M, N), (M, N + 1)
    counts = torch.tensor(num_draft_tokens) + 1
    logits = logits.float()
    if sampling.allowed_token_ids_mask is not None:
        mask = sampling.allowed_token_ids_mask[: len(num_draft_tokens)]
        logits = logits.masked_fill(mask.repeat_interleave(counts, dim=0), float("-inf"))
    m = drafts.shape[0]
    path = torch.full((m, tree.depth), -1, dtype=torch.long)
    tokens = torch.full((m, tree.depth + 1), -1, dtype=torch.long)
    greedy = _greedy_requests(sampling, m)
    if greedy.any():
        argmax = logits.argmax(dim=-1)[rows]  # (M, N + 1)
        verdict = accept_greedy(tree, drafts[greedy], argmax[greedy])
        path[greedy], tokens[greedy] = verdict.path, verdict.tokens
    if not greedy.all():
        cumulative = torch.cumsum(counts, 0).to(torch.int32)
        probs = apply_sampling_constraints(logits, cumulative, sampling).softmax(dim=-1)
        for group, generator in _generator_groups(sampling, ~greedy):
            verdict = accept_sampled(tree, drafts[group], probs[rows[group]], generator)
            path[group], tokens[group] = verdict.path, verdict.tokens
    out = torch.full((m, tree.num_nodes + 1), -1, dtype=torch.int32)
    out[:, : tree.depth + 1] = tokens.to(torch.int32)
    return SamplerOutput(sampled_token_ids=out, logprobs_tensors=None), TreeVerdict(path, tokens)


def _padded(tree: TokenTree, num_draft_tokens: list[int], draft_token_ids: torch.Tensor):
    """Drafts (M, N), -1 where a request drafted no token for a node, and the logits row of
    each request's root and nodes (M, N + 1), its root's where it has none; a request's
    drafts are the tree's first nodes, breadth-first (example: docs/design/drafting.md)."""
    n = torch.tensor(num_draft_tokens)
    m, width = n.numel(), tree.num_nodes
    starts = torch.cumsum(n + 1, 0) - (n + 1)  # (M,) root rows
    drafted = torch.arange(width)[None, :] < n[:, None]  # (M, N)
    request, node = drafted.nonzero(as_tuple=True)  # request-major, as the flat drafts
    drafts = torch.full((m, width), -1, dtype=torch.long)
    drafts[request, node] = draft_token_ids.long()
    rows = starts[:, None].repeat(1, width + 1)
    rows[request, 1 + node] = starts[request] + 1 + node
    return drafts, rows


def _greedy_requests(sampling, m: int) -> torch.Tensor:
    if sampling.all_greedy:
        return torch.ones(m, dtype=torch.bool)
    if sampling.all_random:
        return torch.zeros(m, dtype=torch.bool)
    return sampling.temperature[:m] == GREEDY


def _generator_groups(sampling, random: torch.Tensor):
    """(requests, generator) groups of the random requests: each seeded request alone with
    its own generator (so a seed reproduces its samples), the rest together."""
    seeded = torch.zeros_like(random)
    for index, generator in sampling.generators.items():
        if index < random.numel() and random[index]:
            seeded[index] = True
            yield (
                seeded.new_zeros(random.shape).index_fill_(0, torch.tensor(index), True),
                generator,
            )
    rest = random & ~seeded
    if rest.any():
        yield rest, None
