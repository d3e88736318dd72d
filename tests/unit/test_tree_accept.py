import pytest
import torch

from helpers import chi_square_fit
from vllm_clover.tree import TokenTree, accept_greedy, accept_sampled
from vllm_clover.tree.accept import children_table

pytestmark = pytest.mark.unit

EXAMPLE = TokenTree.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")


def test_children_table():
    assert children_table(EXAMPLE).tolist() == [
        [0, 1],
        [2, 3],
        [4, -1],
        [5, -1],
        [-1, -1],
        [-1, -1],
        [-1, -1],
    ]


def test_greedy_docstring_example():
    """The greedy worked example of docs/design/drafting.md, "Which path is accepted"."""
    verdict = accept_greedy(
        EXAMPLE, torch.tensor([[7, 8, 9, 4, 5, 6]]), torch.tensor([[8, 1, 5, 2, 3, 3, 3]])
    )
    assert verdict.path.tolist() == [[1, 4, -1]]
    assert verdict.tokens.tolist() == [[8, 5, 3, -1]]
    assert verdict.num_accepted.tolist() == [2]


def test_greedy_full_path_nothing_and_missing_drafts():
    drafts = torch.tensor([[7, 8, 9, 4, 5, 6]] * 3)
    drafts[2, 0] = -1  # n0 not drafted: never accepted, even where -1 "matches"
    argmax = torch.tensor(
        [
            [7, 9, 0, 6, 0, 0, 2],  # n0, n2, n5: the whole deepest path, bonus 2
            [3, 0, 0, 0, 0, 0, 0],  # nothing: the target's own token 3
            [-1, 0, 0, 0, 0, 0, 0],
        ]
    )
    verdict = accept_greedy(EXAMPLE, drafts, argmax)
    assert verdict.path.tolist() == [[0, 2, 5], [-1, -1, -1], [-1, -1, -1]]
    assert verdict.tokens.tolist() == [[7, 9, 6, 2], [3, -1, -1, -1], [-1, -1, -1, -1]]


def _chain_accept(drafts: list[int], argmax: list[int]) -> list[int]:
    """vLLM's chain rule: accept while draft i equals the target's argmax before it."""
    out = []
    for draft, target in zip(drafts, argmax, strict=False):
        if draft != target:
            return out + [target]
        out.append(draft)
    return out + [argmax[len(drafts)]]


def test_greedy_on_a_chain_is_vllms_chain_rule():
    gen = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, 3, (200, 4), generator=gen)
    argmax = torch.randint(0, 3, (200, 5), generator=gen)
    verdict = accept_greedy(TokenTree.chain(4), drafts, argmax)
    for row in range(200):
        expected = _chain_accept(drafts[row].tolist(), argmax[row].tolist())
        assert [t for t in verdict.tokens[row].tolist() if t >= 0] == expected


def test_sampled_with_one_hot_targets_is_greedy():
    gen = torch.Generator().manual_seed(1)
    drafts = torch.randint(0, 4, (300, EXAMPLE.num_nodes), generator=gen)
    argmax = torch.randint(0, 4, (300, EXAMPLE.num_nodes + 1), generator=gen)
    probs = torch.nn.functional.one_hot(argmax, 4).double()
    sampled = accept_sampled(EXAMPLE, drafts, probs, torch.Generator().manual_seed(2))
    greedy = accept_greedy(EXAMPLE, drafts, argmax)
    assert torch.equal(sampled.path, greedy.path) and torch.equal(sampled.tokens, greedy.tokens)


# A wide tree over 6 tokens: three drafts after the root, two after n0, one after n1.
WIDE = TokenTree.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]")
WIDE_DRAFTS = [2, 0, 5, 1, 3, 2]  # n0..n5: root children 2, 0, 5; after n0: 1, 3; after n1: 2
SAMPLES = 40_000


def _targets(seed: int) -> torch.Tensor:
    """Target distributions at the root and after each node, uniform on the simplex:
    (N + 1, 6)."""
    gen = torch.Generator().manual_seed(seed)
    e = -torch.rand(WIDE.num_nodes + 1, 6, generator=gen, dtype=torch.float64).log()
    return e / e.sum(dim=-1, keepdim=True)


def _no_renormalisation_first_token(p: torch.Tensor, children: list[int]) -> torch.Tensor:
    """The first-token law of a classic bug: sibling j accepted with p(x_j), not with the
    renormalised residual. Used as the power control."""
    law, left = torch.zeros_like(p), 1.0
    for token in children:
        law[token] += left * p[token]
        left *= 1 - p[token]
    rest = p.clone()
    rest[children] = 0
    return law + left * rest / rest.sum()


def test_sampled_output_follows_the_target_with_power_control():
    """Every emitted token is distributed as the target's: the first as the root's p, the
    second (after each drafted child's token) as that child's p, the third after n0 -> n4
    as n4's. Chi-square at alpha 0.001 over 40,000 seeded samples; the same test rejects the
    no-renormalisation bug's first-token law (power control)."""
    p = _targets(0)
    drafts = torch.tensor([WIDE_DRAFTS] * SAMPLES)
    verdict = accept_sampled(
        WIDE, drafts, p.expand(SAMPLES, -1, -1).clone(), torch.Generator().manual_seed(3)
    )
    tokens = verdict.tokens
    assert chi_square_fit(tokens[:, 0], p[0])[2] > 1e-3
    for node, token in enumerate(WIDE_DRAFTS[:3]):  # after each of the root's children
        after = tokens[tokens[:, 0] == token, 1]
        assert after.numel() > 300 and chi_square_fit(after, p[1 + node])[2] > 1e-3
    deep = (tokens[:, 0] == WIDE_DRAFTS[0]) & (tokens[:, 1] == WIDE_DRAFTS[4])  # n0 -> n4
    assert chi_square_fit(tokens[deep, 2], p[1 + 4])[2] > 1e-3
    assert set(verdict.num_accepted.tolist()) == {0, 1, 2}
    bug = _no_renormalisation_first_token(p[0], WIDE_DRAFTS[:3])
    wrong = torch.multinomial(
        bug, SAMPLES, replacement=True, generator=torch.Generator().manual_seed(4)
    )
    assert chi_square_fit(wrong, p[0])[2] < 1e-3
