"""Workloads where copying matters, for `vllm-clover bench --prompts` (issue #63's hybrid):
prompts whose answers repeat spans of the prompt or of the conversation so far. None of them
is a set the bundled heads trained on.

    mtbench-turn2   MT-Bench's second turns, after the target's own greedy answer to the
                    first (a multi-turn chat: the answer refers back to the first one)
    quotes          ACL papers (`aclsum==0.1.2`, MIT, its train and val splits): quote
                    verbatim the sentences that describe the paper's approach
    black           Python files of Black's own test cases (`black==26.10.1` sdist, MIT):
                    reformat in Black's style, the whole file back with small changes

    python benchmarks/copy_workloads.py --out docs/bench/hybrid/workloads

Each file is JSONL the bench reads: {"id", "messages"} records ending with the user turn to
answer. The packages are downloaded with pip (not installed) and checked against their sha256.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from vllm_clover.assets.wheels import sha256_of

ACLSUM = ("aclsum==0.1.2", "c75ffc48d3eabc5f37c68ea087943780a85950087957759e89746f21111f2213")
BLACK = ("black==26.10.1", "5f9f83beae62437e060dafd53d7f1fc327e3d3494f74d72ee5c2b73eb90fc4e7")
MAX_CHARS = 4000  # of text to copy from: the prompt and its answer fit 2048 tokens


def download(requirement: str, sha256: str, dest: Path, sdist: bool = False) -> Path:
    """The wheel (pip download, no install) or the sdist (PyPI's own file: pip would build
    it to read its metadata) of `requirement`, checked against its sha256."""
    name, version = requirement.split("==")
    dest.mkdir(parents=True, exist_ok=True)
    if sdist:
        with urllib.request.urlopen(f"https://pypi.org/simple/{name}/") as page:
            index = page.read().decode()  # the simple index: one link per file
        filename = f"{name}-{version}.tar.gz"
        url = re.search(rf'href="([^"#]*/{re.escape(filename)})', index).group(1)
        path = dest / filename
        urllib.request.urlretrieve(url, path)
    else:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
        subprocess.run([*command, "--only-binary", ":all:", requirement], check=True)
        (path,) = dest.iterdir()
    if sha256_of(path) != sha256:
        raise SystemExit(f"{path.name}: sha256 {sha256_of(path)} != pinned {sha256}")
    return path


def quotes(wheel: Path) -> list[dict]:
    records = []
    with zipfile.ZipFile(wheel) as archive:
        for split in ("train", "val"):
            for line in archive.read(f"aclsum/dataset/{split}.jsonl").decode().splitlines():
                paper = json.loads(line)
                text = " ".join(sum(paper["sentences"].values(), []))[:MAX_CHARS]
                ask = "Quote verbatim every sentence above that describes the paper's approach."
                content = f"{paper['title']}\n\n{text}\n\n{ask}"
                records.append({"id": paper["id"], "messages": [_user(content)]})
    return records


def black_cases(sdist: Path) -> list[dict]:
    records = []
    with tarfile.open(sdist) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if "/tests/data/cases/" not in member.name or not member.name.endswith(".py"):
                continue
            code = archive.extractfile(member).read().decode()
            code = code.split("\n# output\n")[0]
            code = "\n".join(x for x in code.splitlines() if not x.startswith("# flags:"))
            if 200 <= len(code) <= MAX_CHARS // 2:
                ask = "Reformat this Python code in Black's style. Output only the code."
                content = f"{ask}\n\n```python\n{code.strip()}\n```"
                records.append({"id": Path(member.name).stem, "messages": [_user(content)]})
    return records


def mtbench_turn2(cache_dir: str | None, max_tokens: int) -> list[dict]:
    """The target's greedy first answers (vLLM, float32), then the second question."""
    from vllm import SamplingParams

    from vllm_clover.assets.data import fetch_mtbench, mtbench_questions
    from vllm_clover.assets.target import fetch_reference_target
    from vllm_clover.bench.measure import engine

    questions = mtbench_questions(fetch_mtbench(cache_dir))
    chats = [[_user(q.turns[0])] for q in questions]
    with engine(fetch_reference_target(cache_dir), None, 16, dtype="float32") as llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        answers = [o.outputs[0].text for o in llm.chat(chats, greedy, use_tqdm=False)]
    return [
        {"id": f"mt-{q.question_id}-2", "messages": [*chat, _assistant(a), _user(q.turns[1])]}
        for q, chat, a in zip(questions, chats, answers, strict=True)
    ]


def _user(content: str) -> dict:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache-dir")
    parser.add_argument("--answer-tokens", type=int, default=192)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        workloads = {
            "quotes": quotes(download(*ACLSUM, Path(tmp) / "a")),
            "black": black_cases(download(*BLACK, Path(tmp) / "b", sdist=True)),
        }
    workloads["mtbench-turn2"] = mtbench_turn2(args.cache_dir, args.answer_tokens)
    for name, records in workloads.items():
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        print(f"{path}: {len(records)} prompts")


if __name__ == "__main__":
    main()
