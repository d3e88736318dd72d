"""The tree patches' request check: what a tree engine refuses, naming the parameter."""

from types import SimpleNamespace

import pytest

from vllm_clover import patches

pytestmark = pytest.mark.unit

TREE_SPEC = SimpleNamespace(speculative_token_tree="[(0,), (1,)]")
CHAIN_SPEC = SimpleNamespace(speculative_token_tree=None)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"frequency_penalty": -0.5}, "frequency_penalty"),
        ({"min_tokens": 3}, "min_tokens"),
        ({"logprobs": 2}, "logprobs"),
        ({"bad_words": ["dragon"]}, "bad_words"),
    ],
)
def test_a_tree_engine_refuses_path_dependent_parameters(params, named):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    patches.apply_patches()
    request = SamplingParams(temperature=0.7, **params)
    request._validate_spec_decode(CHAIN_SPEC)  # chains take them
    with pytest.raises(VLLMValidationError, match=f"{named} cannot be used with speculative_t"):
        request._validate_spec_decode(TREE_SPEC)


def test_a_tree_engine_takes_plain_sampling():
    from vllm import SamplingParams

    patches.apply_patches()
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=3)._validate_spec_decode(TREE_SPEC)
    SamplingParams(temperature=0.0, allowed_token_ids=[1, 2])._validate_spec_decode(TREE_SPEC)
