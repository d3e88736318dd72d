"""Teacher: post-norm hidden states, architecture checks, and the hidden-state cache."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from tiny_targets import synthetic_conversations, tiny_workspace, torch_threads
from vllm_clover.training import cache as cache_module
from vllm_clover.training import pipeline as pipeline_module
from vllm_clover.training.cache import HiddenStateCache, padded_batch
from vllm_clover.training.config import TrainingError
from vllm_clover.training.data import TokenizedSequence, tokenize_all
from vllm_clover.training.pipeline import DataSpec, check_disk, fill_cache
from vllm_clover.training.runtime import init_runtime
from vllm_clover.training.teacher import (
    check_architecture,
    load_teacher,
    model_fingerprint,
    resolve_target,
    teacher_forward,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[dict[str, Path]]:
    with torch_threads(1):
        yield tiny_workspace(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def teacher(tiny):
    return load_teacher(str(tiny["target"]), torch.device("cpu"), torch.float32)


def test_hf_last_hidden_state_is_post_norm(tiny) -> None:
    """What we cache (output_hidden_states[-1]) == model.model.norm(pre-norm) == what vLLM hands."""
    model = AutoModelForCausalLM.from_pretrained(tiny["target"]).eval()
    seen = {}
    model.model.norm.register_forward_hook(lambda m, args, out: seen.update(pre=args[0]))
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    out = model(ids, output_hidden_states=True)
    torch.testing.assert_close(out.hidden_states[-1], model.model.norm(seen["pre"]))
    assert not torch.allclose(out.hidden_states[-1], seen["pre"])
    torch.testing.assert_close(out.logits, F.linear(out.hidden_states[-1], model.lm_head.weight))


def test_teacher_forward_is_padding_invariant(teacher) -> None:
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    hidden, top1 = teacher_forward(teacher, ids, mask)
    alone, alone_top1 = teacher_forward(teacher, ids[1:, :5], mask[1:, :5])
    torch.testing.assert_close(hidden[1, :5], alone[0], rtol=1e-4, atol=1e-5)
    assert torch.equal(top1[1, :5], alone_top1[0])
    torch.testing.assert_close(top1, (hidden @ teacher.lm_head.T).argmax(-1))


def test_teacher_forward_with_layers_appends_their_residual_streams(teacher) -> None:
    """target_layers [1]: the signal is [H | hidden_states[1]], the input of decoder layer 1
    (vLLM's auxiliary hidden state 1); the argmax is still H's."""
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    hidden, top1 = teacher_forward(teacher, ids, mask)
    signal, signal_top1 = teacher_forward(teacher, ids, mask, layers=(1,))
    d = hidden.shape[-1]
    assert signal.shape == (2, 9, 2 * d)
    layer_in = {}
    teacher.model.model.layers[1].register_forward_pre_hook(
        lambda m, args, kwargs: layer_in.update(x=args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True,
    )
    teacher_forward(teacher, ids, mask, layers=(1,))
    torch.testing.assert_close(signal[..., :d], hidden)
    torch.testing.assert_close(signal[..., d:], layer_in["x"])
    assert torch.equal(signal_top1, top1)


def test_architecture_checks(teacher) -> None:
    model = teacher.model
    check_architecture(model, "ok")
    original = model.forward

    def scaled(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = out.logits * 2.0  # e.g. a logit scale / softcap the LM head does not show
        return out

    model.forward = scaled
    try:
        with pytest.raises(TrainingError, match="logits != LM head"):
            check_architecture(model, "scaled")
    finally:
        del model.forward
    biased = nn.Linear(4, 4)
    model_with_bias = type("M", (nn.Module,), {"get_output_embeddings": lambda self: biased})()
    with pytest.raises(TrainingError, match="has a bias"):
        check_architecture(model_with_bias, "biased")
    no_head = type("N", (nn.Module,), {"get_output_embeddings": lambda self: None})()
    with pytest.raises(TrainingError, match="no linear LM head"):
        check_architecture(no_head, "headless")


def test_unloadable_targets(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="target folder not found"):
        resolve_target(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError, match="cannot load target"):
        load_teacher(str(tmp_path / "empty"), torch.device("cpu"), torch.float32)
    with pytest.raises(TrainingError, match="no network is used"):
        load_teacher("no-such-org/no-such-model", torch.device("cpu"), torch.float32)


def make_cache(tiny, teacher, root: Path | None = None) -> HiddenStateCache:
    fingerprint = {"target_fingerprint": teacher.fingerprint, "teacher_dtype": "torch.float32"}
    return HiddenStateCache(root or tiny["cache"], fingerprint)


def sequences(teacher, n: int = 6):
    return tokenize_all(teacher.tokenizer, synthetic_conversations(n, seed=5), 128, "syn")


def test_cache_round_trip_and_reuse(tiny, teacher) -> None:
    seqs = sequences(teacher)
    calls = []

    def forward(ids, mask):
        calls.append(ids.shape)
        return teacher_forward(teacher, ids, mask)

    cache = make_cache(tiny, teacher, tiny["cache"] / "rt")
    assert cache.fill(seqs, forward, batch_tokens=200) == len(seqs) and calls
    hidden, top1 = cache.get(seqs[0].key)
    ref, ref_top1 = teacher_forward(teacher, seqs[0].input_ids[None], torch.ones(1, len(seqs[0])))
    assert hidden.dtype == torch.bfloat16 and hidden.shape == ref[0].shape
    torch.testing.assert_close(
        hidden.float(), ref[0].to(torch.bfloat16).float(), rtol=0.02, atol=0.02
    )
    assert torch.equal(top1.long(), ref_top1[0])
    calls.clear()
    reopened = make_cache(tiny, teacher, tiny["cache"] / "rt")  # another run, same fingerprint
    assert reopened.fill(seqs, forward, 200) == 0 and not calls
    assert all(s.key in reopened for s in seqs)


def test_padded_batch_pads_rows_and_width() -> None:
    """The worked example of docs/design/training-internals.md, "The hidden-state cache":
    lengths [3, 2], width 4, 3 rows -> one filler row, all valid."""
    group = [
        TokenizedSequence(str(n), torch.arange(1, n + 1), torch.ones(n, dtype=torch.bool))
        for n in (3, 2)
    ]
    ids, mask = padded_batch(group, width=4, rows=3)
    assert ids.tolist() == [[1, 2, 3, 0], [1, 2, 0, 0], [0, 0, 0, 0]]
    assert mask.int().tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert padded_batch(group, width=1, rows=2)[0].shape == (2, 3)  # never narrower than data


def test_bucketed_fill_has_one_shape_per_bucket_and_the_same_signal(tiny, teacher) -> None:
    """A compiled teacher needs few shapes: widths are multiples of the bucket and each batch
    has as many rows as its width allows, filler included; the cached signal is unchanged."""
    seqs = tokenize_all(teacher.tokenizer, synthetic_conversations(12, seed=9), 128, "syn")
    shapes = []

    def forward(ids, mask):
        shapes.append(tuple(ids.shape))
        return teacher_forward(teacher, ids, mask)

    plain, bucketed = (make_cache(tiny, teacher, tiny["cache"] / f"b{b}") for b in (1, 32))
    plain.fill(seqs, lambda i, m: teacher_forward(teacher, i, m), batch_tokens=200)
    assert bucketed.fill(seqs, forward, batch_tokens=200, length_bucket=32) == len(seqs)
    widths = {-(-len(s) // 32) * 32 for s in seqs}
    assert set(shapes) == {(200 // w, w) for w in widths}, "one (rows, width) per bucket"
    assert len(shapes) > len(widths), "some bucket took more than one batch"
    for seq in seqs:
        got, want = bucketed.get(seq.key), plain.get(seq.key)
        torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0.02, atol=0.02)
        assert torch.equal(got[1], want[1])


def test_compiled_teacher_fills_the_same_cache(tiny, teacher) -> None:
    """--compile-teacher: the pipeline's fill under torch.compile caches what eager does."""
    from torch._dynamo.utils import counters

    seqs = sequences(teacher, n=4)
    runtime = init_runtime("cpu")
    caches, graphs = {}, []
    for compiled in (False, True):
        spec = DataSpec(target="t", compile_teacher=compiled, progress=False)
        caches[compiled] = make_cache(tiny, teacher, tiny["cache"] / f"compiled-{compiled}")
        before = counters["stats"]["unique_graphs"]
        fill_cache(caches[compiled], teacher, seqs, runtime, spec)
        graphs.append(counters["stats"]["unique_graphs"] - before)
    assert graphs[0] == 0 and graphs[1] >= 1, f"graphs compiled (eager, compiled): {graphs}"
    for seq in seqs:
        got, want = caches[True].get(seq.key), caches[False].get(seq.key)
        torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0.02, atol=0.02)
        assert torch.equal(got[1], want[1])


def test_a_sequence_cached_twice_is_read_from_the_earliest_shard(tiny, teacher) -> None:
    """Two processes filling one folder can both write a sequence, with values that differ
    by rounding. Every process reads the copy written first, whatever order it finds the
    shards in, so a resumed run trains on the signal its first process read."""
    import os

    root = tiny["cache"] / "twice"
    writer, seq = make_cache(tiny, teacher, root), sequences(teacher, n=1)[0]
    hidden = torch.zeros(len(seq), 8)
    later = writer.write_shard([seq.key], [hidden + 2], [torch.zeros(len(seq))])
    earlier = writer.write_shard([seq.key], [hidden + 1], [torch.zeros(len(seq))])
    os.utime(earlier, ns=(10**18, 10**18))  # its writer finished first ...
    os.utime(later, ns=(2 * 10**18, 2 * 10**18))
    assert make_cache(tiny, teacher, root).get(seq.key)[0].float().unique().tolist() == [1.0]
    hidden_away = earlier.rename(earlier.with_name("hidden"))  # ... but renamed it in late
    reader = make_cache(tiny, teacher, root)
    assert reader.get(seq.key)[0].float().unique().tolist() == [2.0]
    hidden_away.rename(earlier)
    reader.refresh()
    assert reader.get(seq.key)[0].float().unique().tolist() == [1.0]


def test_cache_is_keyed_by_target_weights(tiny, teacher) -> None:
    base = make_cache(tiny, teacher, tiny["cache"] / "fp")
    with torch.no_grad():
        weight = teacher.model.model.layers[0].mlp.up_proj.weight
        original = weight[0, 0].clone()
        weight[0, 0] = original + 1.0  # one retrained weight deep inside the model
        changed = model_fingerprint(teacher.model)
        weight[0, 0] = original
    assert changed != teacher.fingerprint == model_fingerprint(teacher.model)
    other = HiddenStateCache(
        tiny["cache"] / "fp", {"target_fingerprint": changed, "teacher_dtype": "torch.float32"}
    )
    assert other.dir != base.dir


def test_cache_out_of_disk_leaves_nothing(tiny, teacher, monkeypatch) -> None:
    seqs = sequences(teacher)
    cache = make_cache(tiny, teacher, tiny["cache"] / "full")

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module, "save_file", full_disk)
    with pytest.raises(TrainingError, match="out of disk space"):
        cache.fill(seqs, lambda i, m: teacher_forward(teacher, i, m), 200)
    assert sorted(p.name for p in cache.dir.iterdir()) == ["index.json"]
    assert cache.missing(seqs) == seqs


def test_cache_refuses_up_front_when_disk_too_small(tiny, teacher, monkeypatch) -> None:
    usage = type("U", (), {"free": 1000})()
    monkeypatch.setattr(pipeline_module.shutil, "disk_usage", lambda p: usage)
    with pytest.raises(TrainingError, match="needs about .*GiB.*--cache-dir"):
        check_disk(tiny["cache"] / "small", sequences(teacher), width=64)
    check_disk(tiny["cache"] / "small", [], width=64)  # nothing to cache fits anywhere


def test_corrupt_shard_is_named(tiny, teacher) -> None:
    cache = make_cache(tiny, teacher, tiny["cache"] / "corrupt")
    (cache.dir / "shard-bad.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(TrainingError, match="corrupt hidden-state cache shard .*shard-bad"):
        make_cache(tiny, teacher, tiny["cache"] / "corrupt")


@pytest.mark.parametrize("max_elements", [1, 7 * 50, 1 << 26])
def test_argmax_rows_in_chunks_equals_one_product(max_elements: int) -> None:
    """However small the chunk, the argmax over the whole vocabulary is the same."""
    from vllm_clover.training.teacher import argmax_rows

    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 11, 8, generator=gen), torch.randn(50, 8, generator=gen)
    expected = (hidden @ weight.T).argmax(-1)
    assert torch.equal(argmax_rows(hidden, weight, max_elements), expected)


def test_teacher_forward_over_some_rows_returns_target_ids(teacher) -> None:
    """rows = [5, 9, 40, ...]: the best of those LM-head rows, as a target id, not an index."""
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    hidden, _ = teacher_forward(teacher, ids, mask)
    rows = torch.tensor([5, 9, 40, 77, 150])
    _, best = teacher_forward(teacher, ids, mask, rows)
    logits = F.linear(hidden, teacher.lm_head)  # (2, 9, V)
    assert torch.equal(best, rows[logits[..., rows].argmax(-1)])


def test_a_soft_capped_target_is_refused_naming_why() -> None:
    """Gemma 2 soft-caps its logits: on small logits a probe cannot see it, the config can."""
    from tiny_targets import tiny_target_config
    from vllm_clover.training.teacher import check_architecture

    special = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    config, model_class = tiny_target_config("gemma2", 97, hidden_size=32, **special)
    with pytest.raises(TrainingError, match=r"soft-capped \(final_logit_softcapping=30.0\)"):
        check_architecture(model_class(config).eval(), "tiny-gemma2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copied_block_mirrors_the_last_layers_and_a_wrong_one_is_refused(tiny, dtype) -> None:
    """Two copied layers reproduce the target's last two (within bf16 rounding for a bf16
    target); a block with one weight off is refused, naming the difference."""
    from vllm_clover.modeling import CloverConfig, CloverModel
    from vllm_clover.training.teacher import augmenting_init, check_block_mirrors

    teacher = load_teacher(str(tiny["target"]), torch.device("cpu"), dtype)
    config = CloverConfig.from_target_config(teacher.config, num_heads=2, num_augmenting_layers=2)
    block = CloverModel(config).augmenting
    block.init_from_target(*augmenting_init(teacher, 2))
    check_block_mirrors(teacher, block)
    with torch.no_grad():
        block.layers[0].mlp.down_proj.weight.mul_(3.0)
    with pytest.raises(TrainingError, match="does not reproduce it"):
        check_block_mirrors(teacher, block)
