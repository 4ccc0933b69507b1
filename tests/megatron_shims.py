"""Test-only shims that let megatron-core 0.16.1 run on a CPU (never used by the product).

megatron-core's local (non-TransformerEngine) GPTModel is plain torch except for two CUDA
assumptions that a CPU run meets on every forward, measured here with torch 2.13.0+cpu:

- ``RotaryEmbedding.get_emb`` moves its frequencies to ``torch.cuda.current_device()`` (the
  global memory buffer of ``DotProductAttention`` allocates there too): the shim answers "cpu";
- ``DotProductAttention.forward`` runs its (zero) dropout inside
  ``get_cuda_rng_tracker().fork()``, which needs states seeded by
  ``model_parallel_cuda_manual_seed``, which reads the CUDA RNG: the shim makes ``fork`` a no-op.

The default causal mask is built on ``device="cuda"`` as well, but the backend always passes its
own mask, so that path is never taken. Activation recomputation saves CUDA RNG states too; the
backend refuses it on CPU rather than shimming more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
import torch


def megatron_or_skip():
    """The ``megatron.core`` module, or a pytest skip saying it is not installed."""
    return pytest.importorskip("megatron.core", reason="megatron-core is not installed (megatron-core==0.16.1)")


@contextlib.contextmanager
def cpu_shims() -> Iterator[None]:
    """Within: megatron-core's CUDA-only calls resolve to the CPU (undone on exit)."""
    megatron_or_skip()
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    with (
        mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")),
        mock.patch.object(CudaRNGStatesTracker, "fork", lambda self, name=None: contextlib.nullcontext()),
    ):
        yield


@contextlib.contextmanager
def megatron_scope() -> Iterator[None]:
    """Leave the process as found: the process group and Megatron's model-parallel state that the
    backend starts inside are torn down on exit (a later test may start a group of its own)."""
    megatron_or_skip()
    import torch.distributed as dist
    from megatron.core import parallel_state

    had_group, had_state = dist.is_initialized(), parallel_state.model_parallel_is_initialized()
    try:
        yield
    finally:
        if not had_state and parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if not had_group and dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def megatron_clean() -> Iterator[None]:
    """A test that may create Megatron backends (no shims); state torn down after it."""
    with megatron_scope():
        yield


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """A test under the CPU shims (skipped without megatron-core); state torn down after it."""
    with megatron_scope(), cpu_shims():
        yield
