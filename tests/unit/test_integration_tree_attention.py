"""The tree attention over vLLM-CPU's paged cache: the probed layout reads back what vLLM's
writer stored, and the batched rows equal the reference tree attention."""

import pytest
import torch

from vllm_clover.tree import TokenTree
from vllm_clover.tree.attention import tree_attention

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")


def _cache(dtype, block_size, head_size, blocks=6, heads=2):
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(dtype, block_size, head_size, "auto")
    kv = torch.zeros(blocks, heads, 2 * block_size, head_size, dtype=dtype)
    return isa, *kv.chunk(2, dim=2)


def _write(isa, key_cache, value_cache, keys, values, table, block_size):
    from vllm import _custom_ops as ops

    position = torch.arange(keys.shape[1])
    for r in range(keys.shape[0]):
        slots = table[r, position // block_size] * block_size + position % block_size
        ops.cpu_attn_reshape_and_cache(
            keys[r], values[r], key_cache, value_cache, slots, isa,
            k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto",
        )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "head_size"), [(32, 64), (128, 64), (64, 128)])
def test_the_probed_layout_reads_back_what_vllm_wrote(dtype, block_size, head_size):
    from vllm_clover.integration.tree_attention import CacheLayout, PrefixPlan, gather_prefix

    isa, key_cache, value_cache = _cache(dtype, block_size, head_size)
    table = torch.tensor([[4, 1, 5], [2, 3, 0]])
    length = 2 * block_size + 7  # across three blocks, the last one partly
    keys, values = torch.randn(2, 2, length, 2, head_size).to(dtype)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    layout = CacheLayout.probe(isa, dtype, block_size, head_size)
    lengths, nodes = torch.tensor([length, length]), torch.tensor([1, 1])
    plan = PrefixPlan.of(TokenTree.chain(1), layout, table, block_size, lengths, nodes)
    read_k = gather_prefix(key_cache, plan.blocks, plan.key_offsets)  # (R, nkv, P, hs)
    read_v = gather_prefix(value_cache, plan.blocks, plan.value_offsets)
    assert torch.equal(read_k.transpose(1, 2), keys) and torch.equal(read_v.transpose(1, 2), values)


def test_batched_rows_equal_the_reference_tree_attention():
    """Two requests, prefixes of 40 and 75 tokens in the cache, 6 and 3 nodes scheduled
    (the second a breadth-first prefix of the tree): each real row equals tree_attention
    over that request's own prefix and tree."""
    from vllm_clover.integration.tree_attention import (
        CacheLayout,
        PrefixPlan,
        gather_prefix,
        tree_attention_rows,
    )

    gen = torch.Generator().manual_seed(0)
    block_size, hs, nh, nkv, t = 32, 64, 4, 2, TREE.num_nodes + 1
    isa, key_cache, value_cache = _cache(torch.float32, block_size, hs, blocks=8, heads=nkv)
    table = torch.tensor([[3, 0, 6], [1, 7, 2]])
    lengths, nodes = torch.tensor([40, 75]), torch.tensor([6, 3])
    prefix_k, prefix_v = torch.randn(2, 2, 75, nkv, hs, generator=gen)
    _write(isa, key_cache, value_cache, prefix_k, prefix_v, table, block_size)
    q = torch.randn(2, t, nh, hs, generator=gen)
    k_new, v_new = torch.randn(2, 2, t, nkv, hs, generator=gen)
    layout = CacheLayout.probe(isa, torch.float32, block_size, hs)
    plan = PrefixPlan.of(TREE, layout, table, block_size, lengths, nodes)
    out = tree_attention_rows(
        plan, q, k_new, v_new,
        gather_prefix(key_cache, plan.blocks, plan.key_offsets),
        gather_prefix(value_cache, plan.blocks, plan.value_offsets),
        scale=hs**-0.5,
    )  # fmt: skip
    for r in range(2):
        rows, length = 1 + int(nodes[r]), int(lengths[r])
        sub = TokenTree.from_paths(list(TREE.paths[: rows - 1]))
        k = torch.cat([prefix_k[r, :length], k_new[r, :rows]])
        v = torch.cat([prefix_v[r, :length], v_new[r, :rows]])
        expected = tree_attention(q[r, :rows], k, v, sub, scale=hs**-0.5)
        torch.testing.assert_close(out[r, :rows], expected, rtol=1e-5, atol=1e-5)
