"""``trainer.backend: megatron``: a megatron-core ``GPTModel`` behind the learner's backend interface.

Importing this package registers the backend (``services.trainer.backends.create_backend``
imports it when the config asks for it). ``bridge`` converts Hugging Face Qwen2/Llama models to
Megatron and back; ``backend`` sets up Megatron's single-rank state and the trained module.
See docs/megatron.md.
"""

from __future__ import annotations

import warnings

# megatron-core warns at import, once per module, that TransformerEngine/Apex are absent and it
# falls back to plain torch: exactly the local spec this backend uses, so the warnings say nothing
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed", category=UserWarning)
    import megatron.core.models.gpt.gpt_layer_specs
    import megatron.core.models.gpt.gpt_model
    import megatron.core.parallel_state
    import megatron.core.tensor_parallel  # noqa: F401

from services.trainer.megatron.backend import MegatronBackend, MegatronDeviceError

__all__ = ["MegatronBackend", "MegatronDeviceError"]
