"""How the vLLM layer picks the dtype drafts are scored in ($CLOVER_DRAFT_DTYPE)."""

import pytest
import torch

from vllm_clover.integration.checks import DRAFT_DTYPE_ENV, draft_dtype_setting
from vllm_clover.integration.model import scoring_dtype

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def test_auto_keeps_a_half_precision_target_dtype():
    assert scoring_dtype(torch.bfloat16, CPU, "auto") == torch.bfloat16
    assert scoring_dtype(torch.float16, torch.device("cuda"), "auto") == torch.float16


def test_auto_scores_in_bf16_on_an_fp32_target_only_where_the_cpu_has_bf16_units(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert scoring_dtype(torch.float32, CPU, "auto") == torch.bfloat16
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert scoring_dtype(torch.float32, CPU, "auto") == torch.float32
    assert scoring_dtype(torch.float32, torch.device("cuda"), "auto") == torch.float32


def test_an_explicit_setting_wins():
    assert scoring_dtype(torch.float32, CPU, "float32") == torch.float32
    assert scoring_dtype(torch.float32, CPU, "bfloat16") == torch.bfloat16


def test_the_setting_is_read_from_the_environment_and_validated(monkeypatch):
    monkeypatch.delenv(DRAFT_DTYPE_ENV, raising=False)
    assert draft_dtype_setting() == "auto"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "bfloat16")
    assert draft_dtype_setting() == "bfloat16"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="CLOVER_DRAFT_DTYPE='fp8' is not one of auto, float32"):
        draft_dtype_setting()
