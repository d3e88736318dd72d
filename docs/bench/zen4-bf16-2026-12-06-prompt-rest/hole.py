"""python hole.py PAIRS DTYPE: what a rested prompt costs the drafts that follow it. Pairs of
MT-Bench prompts prefilled together at K = 0 (K = 0 at 2 or more requests), the second of each
ends after one token, the first then decodes 96 tokens alone at K = 4. Prints the engine's
speculation as JSON. Env: TESTS (the tree's tests/, for its helpers), HEADS (a checkpoint)."""

import json
import os
import sys
from pathlib import Path

from transformers import AutoTokenizer
from vllm import SamplingParams

from vllm_clover.assets.data import fetch_mtbench
from vllm_clover.assets.target import fetch_reference_target


def main() -> None:
    sys.path[:0] = [os.environ["TESTS"]]
    from spec_checks import speculation

    from helpers import in_process_llm, mtbench_prompts

    pairs, dtype = int(sys.argv[1]), sys.argv[2]
    target = Path(fetch_reference_target())
    prompts = mtbench_prompts(AutoTokenizer.from_pretrained(target), fetch_mtbench(), 2 * pairs)
    spec = {
        "method": "clover",
        "model": os.environ["HEADS"],
        "num_speculative_tokens": 4,
        "draft_budget": "fixed",
        "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 1048576, 0]],
    }
    answer = SamplingParams(max_tokens=96, temperature=0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0)
    with in_process_llm(target, speculative_config=spec, dtype=dtype, max_num_seqs=16) as llm:
        for i in range(pairs):
            llm.generate([prompts[2 * i], prompts[2 * i + 1]], [answer, one], use_tqdm=False)
        s = speculation(llm)
    print(
        json.dumps(
            {
                "drafts": s.drafts,
                "draft_tokens": s.draft_tokens,
                "accepted": s.accepted,
                "per_pos": s.accepted_per_pos,
                "steps_by_k": dict(s.steps_by_k),
                "tau": 1 + s.accepted / max(s.drafts, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
