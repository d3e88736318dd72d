"""The flags of the training commands, built from their config dataclasses so that the two
can never drift apart: ``num_heads`` -> ``--num-heads``; a bool that defaults to True becomes
``--no-<name>``, one that defaults to False ``--<name>``.
Examples: docs/design/training-internals.md, "Flags".
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from dataclasses import field
from typing import Any


def opt(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its CLI help (and extra argparse keywords)."""
    return field(default=default, metadata={"help": help, **extra})


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of the dataclass ``cls`` (the module docstring says how it is named)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta.pop("help", None)}
        if hints[f.name] is bool:
            flag = _flag(("no_" if f.default else "") + f.name)
            kwargs.update(action="store_false" if f.default else "store_true", default=f.default)
            if f.default:  # the help names what is on by default; the flag turns it off
                kwargs["help"] = f"turn off {kwargs['help']}"
        else:
            flag = _flag(f.name)
            base = [t for t in typing.get_args(hints[f.name]) if t is not type(None)]
            kind = base[0] if base else hints[f.name]
            if typing.get_origin(kind) is list:  # nargs fields: the type of one item
                kind = typing.get_args(kind)[0]
            kwargs.update(type=kind, default=f.default, **meta)
            if f.default not in (None, "", []) and kwargs["help"]:
                kwargs["help"] += f" (default: {f.default})"
        parser.add_argument(flag, **kwargs)


def to_command_line(config: Any, command: str = "vllm-clover train") -> str:
    """The flags that rebuild ``config`` (a dataclass), by the rules of ``add_arguments``;
    only fields that differ from their default are written."""
    hints = typing.get_type_hints(type(config))
    words = command.split()
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if hints[f.name] is bool:
            words.append(_flag(("no_" if f.default else "") + f.name))
        elif isinstance(value, list | tuple):
            words += [_flag(f.name), *map(str, value)]
        elif value is not None:
            words += [_flag(f.name), str(value)]
    return shlex.join(words)


def from_args(args: argparse.Namespace, cls: type) -> Any:
    """The dataclass ``cls`` built from parsed flags (see ``add_arguments``)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
