"""How the vLLM layer picks the dtype drafts are scored in ($CLOVER_DRAFT_DTYPE)."""

import pytest
import torch

from vllm_clover.integration.checks import DRAFT_DTYPE_ENV, draft_dtype_setting
from vllm_clover.integration.model import scoring_dtype

pytestmark = pytest.mark.unit

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_scores_int8_on_cpu_and_in_the_target_dtype_elsewhere():
    for target in (torch.float32, torch.bfloat16):
        assert scoring_dtype(target, CPU, "auto") == torch.int8
    assert scoring_dtype(torch.float16, CUDA, "auto") == torch.float16
    assert scoring_dtype(torch.float32, CUDA, "auto") == torch.float32


def test_an_explicit_setting_wins():
    assert scoring_dtype(torch.float32, CPU, "float32") == torch.float32
    assert scoring_dtype(torch.float32, CPU, "bfloat16") == torch.bfloat16
    assert scoring_dtype(torch.bfloat16, CUDA, "float32") == torch.float32


def test_int8_off_the_cpu_is_refused():
    with pytest.raises(ValueError, match="CLOVER_DRAFT_DTYPE=int8 scores draft rows with CPU"):
        scoring_dtype(torch.bfloat16, CUDA, "int8")


def test_the_setting_is_read_from_the_environment_and_validated(monkeypatch):
    monkeypatch.delenv(DRAFT_DTYPE_ENV, raising=False)
    assert draft_dtype_setting() == "auto"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "bfloat16")
    assert draft_dtype_setting() == "bfloat16"
    monkeypatch.setenv(DRAFT_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="CLOVER_DRAFT_DTYPE='fp8' is not one of auto, float32"):
        draft_dtype_setting()
