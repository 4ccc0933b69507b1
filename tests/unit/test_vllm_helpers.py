"""Pure helpers of the vLLM engine adapter (no engine is started)."""

from __future__ import annotations

import pytest
import torch

from services.common.config import GenerationConfig
from services.common.lora import AdapterError, LoraConfig
from services.generation.vllm_engine import lora_args, omp_binding, serving_dtype


def test_vllm_binds_threads_only_when_the_sgs_is_pinned():
    assert omp_binding([0, 1], 2, 1) == "nobind"  # unpinned: the OS places each instance
    assert omp_binding([1], 2, 1) == "1"  # generation.cpus = [1]
    assert omp_binding([2, 3, 5], 8, 2) == "2,3"


def test_serving_dtype_is_float32_on_cpu_and_bfloat16_on_cuda_unless_set():
    assert serving_dtype(GenerationConfig(), cuda=False) == torch.float32
    assert serving_dtype(GenerationConfig(), cuda=True) == torch.bfloat16
    assert serving_dtype(GenerationConfig(dtype="float16"), cuda=False) == torch.float16


def test_lora_args_pick_the_smallest_max_rank_vllm_accepts_that_holds_the_adapter():
    assert lora_args(LoraConfig(rank=4)) == dict(enable_lora=True, max_loras=1, max_cpu_loras=2, max_lora_rank=8)
    assert lora_args(LoraConfig(rank=16))["max_lora_rank"] == 16
    assert lora_args(LoraConfig(rank=300))["max_lora_rank"] == 320
    with pytest.raises(AdapterError, match="rank 600: vLLM serves LoRA ranks up to 512"):
        # above LoraConfig's bound: what a wider bound would let through
        lora_args(LoraConfig.model_construct(rank=600))
