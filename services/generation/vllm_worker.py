"""The vLLM worker extension the ``vllm`` engine installs (``worker_extension_cls``).

vLLM mixes this class into its worker; the engine calls its methods by name through
``collective_rpc``. Kept in its own light module: vLLM imports it by qualified name.
(vLLM reserves ``update_weights``, hence the prefixed name.)
"""

from __future__ import annotations


class WeightReloader:
    def braid_reload_weights(self, named: list) -> None:
        """Reload Hugging Face–named tensors in place (layer-wise reload; the CPU backend's repacked
        kernels included). ``named``: [(name, tensor), ...] in the serving dtype."""
        self.model_runner.reload_weights(weights_iterator=iter(named))  # type: ignore[attr-defined]
