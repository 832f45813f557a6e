"""Inference servers a stage starts and stops: one lifecycle (process.ManagedServer), one class per engine.

- `eagle3.serving.vllm.VLLMServer`: vLLM's OpenAI server (runs here on CPU, and on GPU clusters);
- `eagle3.serving.sglang.SGLangServer`: SGLang (GPU clusters only; tested here against a fake).
"""

from eagle3.serving.process import ManagedServer, ServerFailed, ServerPhases, ServerStopped, free_port

__all__ = ["ManagedServer", "ServerFailed", "ServerPhases", "ServerStopped", "free_port"]
