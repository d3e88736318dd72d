"""One engine held for many timed runs, so that methods alternate run by run without a
fresh start each time. usage: python held.py TAG MODE BATCH CHATS DIR (TAG as in `ab.py`,
whose functions start the engine and time each run)
Waits for DIR/go-TAG-N (N = 0, 1, ...), runs the timed chat, appends a JSON line to
DIR/TAG.jsonl, then writes DIR/done-TAG-N; DIR/stop ends it."""

import json
import os
import sys
import time

from ab import started, timed_row


def wait_for(*paths: str) -> str:
    while True:
        for path in paths:
            if os.path.exists(path):
                return path
        time.sleep(0.2)


def main() -> None:
    tag, mode, batch, num_chats, folder = sys.argv[1:6]
    with started(tag, mode, int(batch), int(num_chats)) as (llm, chats, greedy):
        open(f"{folder}/ready-{tag}", "w").close()
        n = 0
        while wait_for(f"{folder}/go-{tag}-{n}", f"{folder}/stop").endswith(f"-{n}"):
            row = timed_row(llm, chats, greedy, tag=tag, run=n)
            with open(f"{folder}/{tag}.jsonl", "a") as out:
                out.write(json.dumps(row) + "\n")
            open(f"{folder}/done-{tag}-{n}", "w").close()
            n += 1


if __name__ == "__main__":
    main()
