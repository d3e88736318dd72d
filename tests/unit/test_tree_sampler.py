"""The tree sampler on hand-made logits: greedy verdicts in vLLM's output layout, requests
without drafts, allowed_token_ids, and seeded requests that reproduce their samples."""

from types import SimpleNamespace

import pytest
import torch

from vllm_clover.tree import TokenTree

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0)]")
V = 6


def _sampling(m, temperature=None, generators=None, allowed=None):
    greedy = temperature is None
    return SimpleNamespace(
        all_greedy=greedy,
        all_random=not greedy and bool((temperature > 0).all()),
        temperature=temperature,
        top_k=None,
        top_p=None,
        generators=generators or {},
        allowed_token_ids_mask=allowed,
    )


def _one_hot_logits(argmax_rows):
    return torch.nn.functional.one_hot(torch.tensor(argmax_rows), V).float() * 10


def test_padded_layout_docstring_example():
    """The `_padded` example of docs/design/drafting.md, "The tree sampler"."""
    from vllm_clover.tree.sampler import _padded

    tree = TokenTree.parse("[(0,), (1,), (0, 0)]")
    drafts, rows = _padded(tree, [2, 0], torch.tensor([7, 8]))
    assert drafts.tolist() == [[7, 8, -1], [-1, -1, -1]]
    assert rows.tolist() == [[0, 1, 2, 0], [3, 3, 3, 3]]


def test_greedy_batch_with_a_request_without_drafts():
    from vllm_clover.tree.sampler import verify_trees

    # request 0: nodes n0=2, n1=4, n2=5; request 1: no drafts (one row); request 2: n0=1, n1=3
    drafts = torch.tensor([2, 4, 5, 1, 3])
    argmax = [4, 0, 1, 5, 0, 3, 2, 0]  # r0: after root 4 -> n1; r1: 0; r2: root 3 -> n1 (3)
    out, verdict = verify_trees(TREE, [3, 0, 2], drafts, _one_hot_logits(argmax), _sampling(3))
    assert out.sampled_token_ids.tolist() == [[4, 1, -1, -1], [0, -1, -1, -1], [3, 0, -1, -1]]
    assert out.sampled_token_ids.dtype == torch.int32 and out.logprobs_tensors is None
    assert verdict.path.tolist() == [[1, -1], [-1, -1], [1, -1]]


def test_allowed_token_ids_mask_every_row():
    from vllm_clover.tree.sampler import verify_trees

    allowed = torch.ones(1, V, dtype=torch.bool)  # True = masked out, as vLLM keeps it
    allowed[0, [2, 3]] = False
    logits = torch.zeros(4, V)
    logits[:, 5] = 10.0  # the unconstrained argmax
    logits[0, 2] = logits[1, 3] = 1.0
    out, _ = verify_trees(TREE, [3], torch.tensor([2, 4, 3]), logits, _sampling(1, allowed=allowed))
    # root: 2 (5 is masked) = n0; after n0: 3 = n2; after n2 both allowed tie at 0: 2
    assert out.sampled_token_ids[0].tolist() == [2, 3, 2, -1]


def test_seeded_requests_reproduce_their_samples():
    from vllm.platforms import current_platform

    from vllm_clover import patches
    from vllm_clover.tree.sampler import verify_trees

    patches.apply_patches()  # cpu_float_expand: temperature per row
    current_platform.register_triton_kernel_overrides()  # as a worker does at start-up

    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(0))
    drafts = torch.tensor([0, 1, 2, 3, 4, 5])

    def run(seed):
        sampling = _sampling(
            2, temperature=torch.ones(2), generators={1: torch.Generator().manual_seed(seed)}
        )
        return verify_trees(TREE, [3, 3], drafts, logits.clone(), sampling)[0].sampled_token_ids

    same = [run(7)[1].tolist() for _ in range(3)]
    assert same[0] == same[1] == same[2]
    assert len({tuple(run(s)[1].tolist()) for s in range(40)}) > 1  # the seed matters
