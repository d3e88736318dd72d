"""The training commands' flags: one per config field, help that reads the right way round,
and a command line that rebuilds its config."""

from __future__ import annotations

import argparse
import dataclasses
import shlex

import pytest

from vllm_clover.training.config import EvalConfig, GenerateConfig, TrainConfig, TrainingError
from vllm_clover.training.flags import add_arguments, from_args, to_command_line

pytestmark = pytest.mark.unit


def _help(cls, flag: str) -> str:
    parser = argparse.ArgumentParser()
    add_arguments(parser, cls)
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return action.help


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--no-attention-decoder", "turn off the Attention Decoder"),
        ("--no-regressive-connection", "turn off the Regressive Connection"),
        ("--no-augmenting-block", "turn off the Augmenting Block"),
        ("--no-progress", "turn off the progress bar"),
    ],
)
def test_flags_that_turn_something_off_say_so(flag: str, expected: str) -> None:
    assert _help(TrainConfig, flag) == expected


def test_eval_heads_takes_the_teacher_dtype_train_cached_with() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, EvalConfig)
    args = parser.parse_args(["--target", "t", "--heads", "h", "--dtype", "bfloat16"])
    assert args.dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--target", "t", "--heads", "h", "--dtype", "fp8"])


@pytest.mark.parametrize("cls", [TrainConfig, EvalConfig, GenerateConfig])
def test_every_config_field_is_a_flag(cls) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, cls)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {f.name for f in dataclasses.fields(cls)}


def test_train_flags_round_trip() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig)
    args = parser.parse_args(
        [
            "--target",
            "t",
            "--out",
            "o",
            "--num-heads",
            "4",
            "--no-attention-decoder",
            "--draft-vocab-size",
            "100",
            "--dtype",
            "bfloat16",
            "--resume",
        ]
    )
    cfg = from_args(args, TrainConfig)
    assert (cfg.num_heads, cfg.attention_decoder, cfg.draft_vocab_size) == (4, False, 100)
    assert cfg.regressive_connection and cfg.dtype == "bfloat16"
    assert cfg.resume == "auto" and cfg.state_dir == "o.train-state"
    medusa = from_args(parser.parse_args(["--target", "t", "--out", "o", "--medusa"]), TrainConfig)
    assert not (medusa.attention_decoder or medusa.regressive_connection or medusa.augmenting_block)
    with pytest.raises(TrainingError, match="--num-heads"):
        TrainConfig(target="t", out="o", num_heads=0)


def test_command_line_rebuilds_the_config() -> None:
    cfg = TrainConfig(
        target="t", out="o dir", medusa=True, attention_decoder=False, draft_vocab_size=64, lr=3e-4
    )
    line = to_command_line(cfg)
    assert line.startswith("vllm-clover train ") and "--no-attention-decoder" in line
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig)
    assert from_args(parser.parse_args(shlex.split(line)[2:]), TrainConfig) == cfg
    layered = TrainConfig(target="t", out="o", clover2=True, target_layers=[2, 15, 27])
    line = to_command_line(layered)
    assert "--target-layers 2 15 27" in line  # a list flag: one word per item, ints back
    assert from_args(parser.parse_args(shlex.split(line)[2:]), TrainConfig) == layered
