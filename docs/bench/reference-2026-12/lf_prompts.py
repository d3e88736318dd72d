"""Prompts of the reference run's second instruction set: llamafactory==0.9.5 (PyPI sdist).

The first user turn of each record of its four English demo sets (alpaca_en_demo: the
instruction, a blank line and the input; dpo_en_demo, glaive_toolcall_en_demo: the first
human turn; kto_en_demo: the first user message), in that order, without repeats, written
as prompt-only records for `vllm-clover generate-data`. None of them is a benchmark's test set.

    pip download --no-deps --no-binary :all: llamafactory==0.9.5
    python lf_prompts.py llamafactory-0.9.5.tar.gz lf-prompts.jsonl     # 1,770 prompts
"""

from __future__ import annotations

import json
import sys
import tarfile

SETS = [
    ("alpaca", "alpaca_en_demo.json"),
    ("dpo", "dpo_en_demo.json"),
    ("glaive_toolcall", "glaive_toolcall_en_demo.json"),
    ("kto", "kto_en_demo.json"),
]


def first_turn(name: str, record: dict) -> str:
    if name == "alpaca":
        return "\n\n".join(t for t in (record["instruction"], record["input"]) if t)
    if "messages" in record:
        return next(m["content"] for m in record["messages"] if m["role"] == "user")
    return next(t["value"] for t in record["conversations"] if t["from"] == "human")


def main(sdist: str, out: str) -> None:
    seen: set[str] = set()
    rows: list[dict] = []
    with tarfile.open(sdist) as tar:
        for name, file in SETS:
            member = next(m for m in tar.getmembers() if m.name.endswith("/data/" + file))
            for record in json.load(tar.extractfile(member)):
                raw = first_turn(name, record)
                if raw.strip() and raw not in seen:
                    seen.add(raw)
                    content = raw.strip()
                    rows.append(
                        {
                            "id": f"lf-{name}-{len(rows)}",
                            "messages": [{"role": "user", "content": content}],
                        }
                    )
    with open(out, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"{len(rows)} prompts -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
