"""Trainer end to end on a tiny random Llama: checkpoint, resume, variants, eval-heads, errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tiny_targets import tiny_workspace, torch_threads
from vllm_clover.cli import main
from vllm_clover.modeling import draft_vocab_from_counts, load_clover
from vllm_clover.modeling.checkpoint import load_clover_config
from vllm_clover.training import TrainConfig, TrainingError, train
from vllm_clover.training.data import (
    load_conversations,
    split_train_eval,
    token_counts,
    tokenize_all,
)
from vllm_clover.training.pipeline import DataSpec, prepare
from vllm_clover.training.runtime import Runtime
from vllm_clover.training.schedule import PROBE_STEPS
from vllm_clover.training.teacher import load_teacher
from vllm_clover.training.trainer import TrainLoop

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[dict[str, Path]]:
    with torch_threads(1):
        yield tiny_workspace(tmp_path_factory.mktemp("trainer"))


def config(tiny, out: Path, **overrides) -> TrainConfig:
    fields = dict(
        target=str(tiny["target"]),
        data=str(tiny["data"]),
        out=str(out),
        cache_dir=str(tiny["cache"]),
        eval_fraction=0.2,
        epochs=3,
        batch_size=4,
        max_seq_len=128,
        eval_every=0,
        save_every=0,
        progress=False,
    )
    return TrainConfig(**{**fields, **overrides})


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_train_writes_a_loadable_checkpoint_with_card(tiny, tmp_path: Path) -> None:
    result = train(config(tiny, tmp_path / "heads", epochs=6, lr=3e-3))
    assert result.out == tmp_path / "heads" and result.steps == 6 * (19 // 4)
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-3:]) < sum(losses[:3])  # it learns
    assert result.tokens_per_second > 0 and result.eval["chain_starts"] >= 0
    assert set(result.eval) >= {"top1", "top5", "expected_accepted", "tau"}
    teacher = load_teacher(str(tiny["target"]), torch.device("cpu"), torch.float32)
    heads = load_clover(result.out, teacher.lm_head)  # fingerprint and shapes check out
    assert heads.config.num_heads == 3 and heads.config.use_augmenting_block
    card = (result.out / "README.md").read_text()
    assert "Held-out evaluation" in card and "| held-out |" in card
    assert "| command | `vllm-clover train --target" in card and "--epochs 6" in card
    assert "s in the training loop on cpu:" in card
    assert (tmp_path / "heads.train-state" / "state.pt").is_file()
    with pytest.raises(TrainingError, match="already exists"):
        train(config(tiny, tmp_path / "heads"))


def test_stop_and_resume_equals_one_run(tiny, tmp_path: Path) -> None:
    """Seeded runs are reproducible, and an interrupted + resumed run gives the same weights."""
    whole = train(config(tiny, tmp_path / "whole", grad_accum=2, batch_size=2))
    part = train(config(tiny, tmp_path / "part", grad_accum=2, batch_size=2, stop_after=2))
    assert part.out is None and not (tmp_path / "part").exists()  # no checkpoint looks complete
    with pytest.raises(TrainingError, match="differ from the saved run: lr"):
        train(config(tiny, tmp_path / "part", grad_accum=2, batch_size=2, lr=5e-3, resume="auto"))
    resumed = train(config(tiny, tmp_path / "part", grad_accum=2, batch_size=2, resume="auto"))
    assert resumed.steps == whole.steps and resumed.tokens_seen == whole.tokens_seen
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "part")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def test_time_budget_cuts_the_plan_and_the_run_still_anneals(tiny, tmp_path: Path) -> None:
    """A budget spent before the first estimate: the plan is cut to the probe's steps plus
    one, the lr schedule follows the cut (its last step near 0), the checkpoint is written,
    and the state remembers the cut so that a resumed run keeps it."""
    kwargs = dict(epochs=12, batch_size=2)  # 9 steps an epoch, 108 planned
    whole = train(config(tiny, tmp_path / "whole", **kwargs, time_budget=1e6))
    assert whole.steps == 108  # a budget that fits cuts nothing
    cut = train(config(tiny, tmp_path / "cut", **kwargs, time_budget=1e-3))
    assert cut.out == tmp_path / "cut" and cut.steps == PROBE_STEPS + 1
    lrs = [h["lr"] for h in cut.history]
    assert lrs[-1] < 0.05 * max(lrs) and lrs[-1] < whole.history[cut.steps - 1]["lr"]
    info = json.loads((tmp_path / "cut.train-state" / "trainer.json").read_text())
    assert (info["total_steps"], info["planned_steps"]) == (PROBE_STEPS + 1, 108)
    assert "| planned steps | 108 |" in (tmp_path / "cut" / "README.md").read_text()
    again = train(config(tiny, tmp_path / "cut", **kwargs, resume="auto", overwrite=True))
    assert again.steps == PROBE_STEPS + 1  # the resumed run keeps the cut plan


def test_streamed_signal_trains_the_same_heads_and_resumes(tiny, tmp_path: Path) -> None:
    """--teacher-signal stream: no training shard on disk, the target's signal computed per
    micro-batch, the weights of the cached run, and an interrupted run resumes exactly."""
    kwargs = dict(grad_accum=2, batch_size=2)
    cached = train(config(tiny, tmp_path / "cached", **kwargs))
    streamed_cfg = dict(teacher_signal="stream", cache_dir=str(tmp_path / "cache"), **kwargs)
    assert train(config(tiny, tmp_path / "s", stop_after=2, **streamed_cfg)).out is None
    resumed = train(config(tiny, tmp_path / "s", resume="auto", **streamed_cfg))
    assert resumed.steps == cached.steps and resumed.tokens_seen == cached.tokens_seen
    a, b = weights(tmp_path / "cached"), weights(tmp_path / "s")
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-5
    spec = DataSpec.from_config(config(tiny, tmp_path / "x", cache_dir=str(tmp_path / "cache")))
    shards = list((tmp_path / "cache").glob("*/shard-*.safetensors"))
    cached_keys = sum(len(load_file(str(p))["top1"]) for p in shards)
    prepared = prepare(spec, Runtime(0, 1, torch.device("cpu")), torch.float32, cache_train=False)
    assert cached_keys == sum(len(s) for s in prepared.eval), "only the held-out split cached"


def test_clover2_trains_learns_and_loads(tiny, tmp_path: Path) -> None:
    """--clover2: the next-token fusion, 2 block layers and linear heads are what is built,
    trained (loss falls) and loaded back."""
    cfg = config(tiny, tmp_path / "c2", clover2=True, epochs=6, lr=3e-3)
    assert (cfg.num_augmenting_layers, cfg.head_weight_base, cfg.hidden_loss_weight) == (
        2,
        0.7,
        10.0,
    )
    result = train(cfg)
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-3:]) < sum(losses[:3])
    teacher = load_teacher(str(tiny["target"]), torch.device("cpu"), torch.float32)
    heads = load_clover(result.out, teacher.lm_head)
    c = heads.config
    assert c.fuse_next_token and c.head_projection == "linear" and c.num_hidden_layers == 2
    assert "next-token fusion" in (result.out / "README.md").read_text()


def test_compiled_heads_train_the_eager_weights(tiny, tmp_path: Path) -> None:
    """--compile-heads: the feature network and each head's cross-entropy really run
    compiled (dynamo builds graphs), and the run trains the eager run's weights and stats."""
    from torch._dynamo.utils import counters

    kwargs = dict(clover2=True, augmenting_gate=True, draft_vocab_size=64, epochs=2)
    eager = train(config(tiny, tmp_path / "eager", **kwargs))
    before = counters["stats"]["unique_graphs"]
    compiled = train(config(tiny, tmp_path / "compiled", compile_heads=True, **kwargs))
    assert counters["stats"]["unique_graphs"] - before >= 2  # features and cross-entropy
    a, b = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-4
    losses = [(e["loss"], c["loss"]) for e, c in zip(eager.history, compiled.history, strict=True)]
    assert all(math.isclose(e, c, rel_tol=1e-4) for e, c in losses)
    assert losses[-1][0] < losses[0][0]  # the compared runs did train


def test_init_from_continues_a_checkpoint_on_new_data(tiny, tmp_path: Path) -> None:
    """--init-from starts from the checkpoint's weights and draft vocabulary (not a fresh
    network, not the vocabulary counted on the new data), and refuses another network."""
    common = dict(draft_vocab_size=64, save_dtype="float32")
    base = train(config(tiny, tmp_path / "base", **common))
    # The new data: a subset whose own token counts would pick another draft vocabulary.
    teacher = load_teacher(str(tiny["target"]), torch.device("cpu"), torch.float32)
    seqs = tokenize_all(teacher.tokenizer, load_conversations(tiny["data"], 8), 128, "data")
    counted = draft_vocab_from_counts(
        token_counts(split_train_eval(seqs, 0.2, 0)[0], len(teacher.tokenizer)), 64
    )
    assert not torch.equal(counted, weights(base.out)["draft_vocab_ids"])
    tiny_lr = dict(max_samples=8, lr=1e-9, weight_decay=0.0, epochs=1, **common)
    cont = train(config(tiny, tmp_path / "cont", init_from=str(base.out), **tiny_lr))
    fresh = train(config(tiny, tmp_path / "fresh", **tiny_lr))
    a, b, c = weights(base.out), weights(cont.out), weights(fresh.out)
    assert torch.equal(b["draft_vocab_ids"], a["draft_vocab_ids"])
    assert torch.equal(c["draft_vocab_ids"], counted)  # without --init-from: counted
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max((a[k] - c[k]).abs().max().item() for k in a) > 1e-3  # the control differs
    assert "--init-from" in (cont.out / "README.md").read_text()
    cache = tmp_path / "unused-cache"
    with pytest.raises(TrainingError, match="num_heads: checkpoint 3, this run 2"):
        train(
            config(
                tiny,
                tmp_path / "x",
                init_from=str(base.out),
                num_heads=2,
                cache_dir=str(cache),
                **common,
            )
        )
    assert not cache.exists()  # refused before any teacher work
    with pytest.raises(TrainingError, match="no such checkpoint folder"):
        train(config(tiny, tmp_path / "y", init_from=str(tmp_path / "nope"), **common))


def test_init_from_a_native_medusa_export(tiny, tmp_path: Path) -> None:
    """The Medusa baseline ships in vLLM's native format; --init-from reads it back as the
    Clover Medusa heads it was exported from, and refuses LM heads of its own."""
    medusa = dict(medusa=True, draft_vocab_size=64, save_dtype="float32")
    source = train(config(tiny, tmp_path / "medusa", **medusa))
    native = tmp_path / "native"
    export = ["export-medusa", "--heads", str(source.out), "--target", str(tiny["target"])]
    assert main([*export, "--out", str(native), "--dtype", "float32"]) == 0
    tiny_lr = dict(max_samples=8, lr=1e-9, weight_decay=0.0, epochs=1, **medusa)
    cont = train(config(tiny, tmp_path / "cont", init_from=str(native), **tiny_lr))
    a, b = weights(source.out), weights(cont.out)
    assert a.keys() == b.keys() and torch.equal(a["draft_vocab_ids"], b["draft_vocab_ids"])
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-5
    with pytest.raises(TrainingError, match="use_regressive_connection: checkpoint False"):
        train(config(tiny, tmp_path / "x", init_from=str(native), draft_vocab_size=64))
    state = load_file(str(native / "model.safetensors"))
    state["lm_heads.0.weight"] = state["lm_heads.0.weight"] * 2
    save_file(state, str(native / "model.safetensors"))
    with pytest.raises(TrainingError, match="is not the target's LM head"):
        train(config(tiny, tmp_path / "y", init_from=str(native), **tiny_lr))


def test_failure_mid_run_leaves_no_checkpoint(tiny, tmp_path: Path, monkeypatch) -> None:
    def boom(self, step):
        raise KeyboardInterrupt  # e.g. a kill or a crash between steps

    monkeypatch.setattr(TrainLoop, "train_step", boom)
    with pytest.raises(KeyboardInterrupt):
        train(config(tiny, tmp_path / "crash"))
    assert not (tmp_path / "crash").exists()
    assert not list(tmp_path.glob(".crash*"))


def export_medusa(heads: Path, target: Path, out: Path) -> int:
    """`vllm-clover export-medusa`'s exit code."""
    return main(
        ["export-medusa", "--heads", str(heads), "--target", str(target), "--out", str(out)]
    )


def test_draft_vocab_medusa_and_eval_heads(tiny, tmp_path: Path, capsys) -> None:
    clover = train(config(tiny, tmp_path / "clover", draft_vocab_size=64, dtype="bfloat16"))
    medusa = train(config(tiny, tmp_path / "medusa", medusa=True))
    teacher = load_teacher(str(tiny["target"]), torch.device("cpu"), torch.float32)
    seqs = tokenize_all(teacher.tokenizer, load_conversations(tiny["data"]), 128, "data")
    train_seqs, _ = split_train_eval(seqs, 0.2, 0)
    expected = draft_vocab_from_counts(token_counts(train_seqs, len(teacher.tokenizer)), 64)
    assert torch.equal(weights(clover.out)["draft_vocab_ids"], expected)
    medusa_heads = load_clover(medusa.out, teacher.lm_head)
    assert medusa_heads.config.is_medusa  # and exportable to vLLM's native Medusa format:
    assert export_medusa(medusa.out, tiny["target"], tmp_path / "native") == 0
    native = json.loads((tmp_path / "native" / "config.json").read_text())
    assert native["architectures"] == ["MedusaModel"] and native["num_heads"] == 3
    card = (tmp_path / "native" / "README.md").read_text()
    assert '"method": "medusa"' in card and "## Medusa-1 baseline heads" in card
    assert export_medusa(clover.out, tiny["target"], tmp_path / "not-medusa") == 2  # refused
    assert not (tmp_path / "not-medusa").exists()
    capsys.readouterr()
    metrics = tmp_path / "metrics.json"
    args = ["eval-heads", "--target", str(tiny["target"]), "--heads", str(clover.out)]
    args += [str(medusa.out), "--data", str(tiny["data"]), "--cache-dir", str(tiny["cache"])]
    args += ["--eval-fraction", "0.2", "--max-seq-len", "128", "--json", str(metrics)]
    code = main([*args, "--no-progress"])
    table = capsys.readouterr().out
    assert code == 0 and "h2 top1/top5" in table and str(medusa.out) in table
    results = json.loads(metrics.read_text())
    assert results[str(clover.out)]["top1"] == pytest.approx(clover.eval["top1"], abs=0.02)
    assert results[str(medusa.out)]["positions"] == clover.eval["positions"]


def test_target_layers_train_warm_start_and_eval_heads(tiny, tmp_path: Path, capsys) -> None:
    """--target-layers: the fusion is trained (moves from zero) and stored, its signal has a
    cache of its own, adding layers to H-only heads starts from them exactly, and eval-heads
    scores H-only and layered heads in one run (each reads its own columns)."""
    common = dict(clover2=True, draft_vocab_size=64, save_dtype="float32")
    base = train(config(tiny, tmp_path / "base", epochs=2, **common))
    caches = set(tiny["cache"].iterdir())
    layered = train(config(tiny, tmp_path / "layered", target_layers=[1], lr=3e-3, **common))
    assert len(set(tiny["cache"].iterdir()) - caches) == 1  # [H | L_1] cached apart
    fused = weights(layered.out)
    assert fused["layer_fusion.projs.0.weight"].abs().max() > 1e-4  # trained, not left at 0
    assert load_clover_config(layered.out).target_layers == [1]
    assert "--target-layers 1" in (layered.out / "README.md").read_text()
    tiny_lr = dict(max_samples=8, lr=1e-9, epochs=1, target_layers=[1], **common)
    cont = train(config(tiny, tmp_path / "cont", init_from=str(base.out), **tiny_lr))
    a, b = weights(base.out), weights(cont.out)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert b["layer_fusion.projs.0.weight"].abs().max() < 1e-6  # the fusion starts at zero
    with pytest.raises(TrainingError, match=r"target_layers: checkpoint \[1\], this run None"):
        train(config(tiny, tmp_path / "x", init_from=str(layered.out), **common))
    with pytest.raises(TrainingError, match=r"--target-layers \[2\]: layer 2 is not in \[1, 1\]"):
        train(config(tiny, tmp_path / "y", target_layers=[2], **common))
    capsys.readouterr()
    metrics = tmp_path / "metrics.json"
    args = ["eval-heads", "--target", str(tiny["target"]), "--heads", str(base.out)]
    args += [str(layered.out), str(cont.out), "--data", str(tiny["data"])]
    args += ["--cache-dir", str(tiny["cache"]), "--eval-fraction", "0.2", "--max-seq-len", "128"]
    assert main([*args, "--json", str(metrics), "--no-progress"]) == 0
    results = json.loads(metrics.read_text())
    assert results[str(layered.out)]["top1"] == pytest.approx(layered.eval["top1"], abs=0.02)
    assert results[str(cont.out)]["top1"] == results[str(base.out)]["top1"]


def test_eval_heads_calibrates_and_writes_draft_confidence(tiny, tmp_path: Path, capsys) -> None:
    heads = train(config(tiny, tmp_path / "heads", draft_vocab_size=64)).out
    before = json.loads((heads / "config.json").read_text())
    assert before.get("draft_confidence") is None
    metrics = tmp_path / "metrics.json"
    common = ["--target", str(tiny["target"]), "--heads", str(heads), "--data", str(tiny["data"])]
    common += ["--cache-dir", str(tiny["cache"]), "--eval-fraction", "0.2", "--max-seq-len", "128"]
    args = ["eval-heads", *common, "--no-progress", "--json", str(metrics)]
    assert main([*args, "--draft-token-cost", "0.1", "--write-confidence"]) == 0
    out = capsys.readouterr().out
    assert "| model | thresholds (cost 0.1) | E[drafted] | E[accepted] | value |" in out
    calibration = json.loads(metrics.read_text())[str(heads)]["draft_confidence"]
    assert calibration["written"] and len(calibration["thresholds"]) == 3
    assert calibration["calibrated"]["value"] >= calibration["always"]["value"]
    after = json.loads((heads / "config.json").read_text())
    assert after.pop("draft_confidence") == calibration["thresholds"]
    assert after == {k: v for k, v in before.items() if k != "draft_confidence"}  # kept as is
    assert load_clover_config(heads).draft_confidence == calibration["thresholds"]
    assert main([*args, "--write-confidence"]) == 2  # nothing to write without a cost
    assert "--write-confidence needs --draft-token-cost" in capsys.readouterr().err


def test_train_argmax_over_draft_rows(tiny, tmp_path: Path) -> None:
    """--train-argmax draft caches the training split's argmax over the draft rows only: it
    equals the full one wherever the target's best token is a draft token, training-time
    top1 can only rise, and the weights and the (exact) held-out evaluation are unchanged."""
    cache = str(tmp_path / "cache")  # fresh: the draft run must not find full-vocabulary shards
    runs = {
        mode: config(tiny, tmp_path / mode, draft_vocab_size=64, train_argmax=mode, cache_dir=cache)
        for mode in ("draft", "full")
    }
    prepared = prepare(
        DataSpec.from_config(runs["draft"]), Runtime(0, 1, torch.device("cpu")), torch.float32
    )
    assert prepared.train_cache is not prepared.cache  # a folder of its own
    assert all(s.key in prepared.cache for s in prepared.eval)  # held-out: always exact
    assert not any(s.key in prepared.cache for s in prepared.train)
    draft, full = train(runs["draft"]), train(runs["full"])  # full fills prepared.cache
    prepared.cache.refresh()
    fast = torch.cat([prepared.train_cache.get(s.key)[1] for s in prepared.train]).long()
    exact = torch.cat([prepared.cache.get(s.key)[1] for s in prepared.train]).long()
    in_draft = torch.zeros(prepared.teacher.lm_head.shape[0], dtype=torch.bool)
    in_draft[prepared.draft_vocab_ids] = True
    assert bool(in_draft[fast].all())  # every cached argmax is a draft token
    assert torch.equal(fast[in_draft[exact]], exact[in_draft[exact]])
    assert bool((~in_draft[exact]).any())  # the case that differs was exercised
    a, b = weights(full.out), weights(draft.out)
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-6
    assert draft.eval == full.eval
    pairs = [
        (d, f)
        for hd, hf in zip(draft.history, full.history, strict=True)
        for d, f in zip(hd["top1"], hf["top1"], strict=True)
    ]
    assert all(d >= f for d, f in pairs) and any(d > f for d, f in pairs)
    with pytest.raises(TrainingError, match="--train-argmax draft needs --draft-vocab-size"):
        config(tiny, tmp_path / "x", train_argmax="draft")


def test_cli_reports_bad_input_clearly(tiny, tmp_path: Path, capsys) -> None:
    base = [
        "train",
        "--target",
        str(tiny["target"]),
        "--out",
        str(tmp_path / "o"),
        "--cache-dir",
        str(tiny["cache"]),
        "--no-progress",
    ]
    assert main([*base, "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "data file not found" in capsys.readouterr().err
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    assert main([*base, "--data", str(tmp_path / "prompts.jsonl")]) == 2
    assert "generate-data" in capsys.readouterr().err
    assert main([*base, "--data", str(tiny["data"]), "--batch-size", "64"]) == 2
    assert "training sequence(s) but one optimizer step needs 64" in capsys.readouterr().err
    assert main(["train", "--target", str(tmp_path / "nope"), "--out", "x"]) == 2
    assert "target folder not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_trainer_never_imports_vllm() -> None:
    code = (
        "import sys, vllm_clover.cli, vllm_clover.training.trainer, "
        "vllm_clover.training.evaluate, vllm_clover.training.generate_data\n"
        "bad = [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
