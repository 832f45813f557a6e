"""What the served extract engines share: a target server this task starts and stops, one request per sample.

``ServedCapture`` stands where ``eagle3.extract.capture.TargetCapture`` stands in the stage and in online
training (same ``aux_layers``, ``hidden_size``, ``vocab_size``, ``precision``, ``forward_path``, ``lm_head`` and
``forward``), so planning, resume, progress and the store writer stay the stage's own. A subclass (the vllm
engine, eagle3.extract.vllm_engine; the sglang engine, eagle3.extract.sglang_engine) says how its server is
built (:meth:`_new_server`), what one sample's request returns (:meth:`_one`) and how the answers become
``(aux, target side)`` (:meth:`_assemble`). Here: the server's lifecycle (started once, on first use or by the
stage before its clocks; ``close()`` on every exit, from any thread: the CLI turns SIGTERM, Airflow's on_kill,
into an exit through it), the pool of ``requests_in_flight`` requests, the HTTP call, the diagnosis of a
server that died mid-request (its exit code and the engine's own last error line), and the checks every
answer's tensors pass (shape, finiteness) with errors that name the sample.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor

from eagle3.devices import resolve_precision
from eagle3.errors import Eagle3Error
from eagle3.extract.config import ExtractConfig
from eagle3.serving import ServerFailed, ServerStopped
from eagle3.target import (config_int, read_config, refuse_capped_logits, resolve_aux_layers, resolve_model,
                           vocab_size)

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1800.0  # a cold start of a big target on a busy node is slow; a dead server fails at once
REQUEST_TIMEOUT_S = 3600.0
DEATH_WAIT_S = 15.0  # how long a request that got no answer waits for the server's exit before calling it alive


class AnswerError(Eagle3Error):
    """A served engine answered a sample's request with an error, or with states that are not the sample's."""


def check_states(states, shape: tuple, sample: str, source: str, error: type[Exception] = AnswerError) -> None:
    """Refuse states of another shape than ``shape`` or with a non-finite value; the error names the sample
    and where the states came from."""
    import torch

    if tuple(states.shape) != tuple(shape):
        raise error(f"sample {sample}: {source} holds states of shape {list(states.shape)}, not {list(shape)}")
    if not torch.isfinite(states).all():
        raise error(f"sample {sample}: {source} holds non-finite values")


class ServedCapture:
    """A target served by an engine for one extract task (or one online training run)."""

    engine_name = "served"
    label = "a server"  # the engine's name in messages, e.g. "vLLM"

    def __init__(self, cfg: ExtractConfig, device: str, longest: int):
        """``longest``: the task's longest sample in tokens."""
        import torch

        self.cfg, self.device, self.longest = cfg, device, max(int(longest), 1)
        self.model_dir = resolve_model(cfg.model)
        self.config = read_config(cfg.model)
        refuse_capped_logits(self.config.get("final_logit_softcapping"), cfg.model)
        self.num_layers = config_int(self.config, "num_hidden_layers", cfg.model)
        self.hidden_size = config_int(self.config, "hidden_size", cfg.model)
        self.vocab_size = vocab_size(cfg.model)
        self.aux_layers = resolve_aux_layers(list(cfg.aux_layers) if cfg.aux_layers else None, self.num_layers,
                                             cfg.model)
        self.precision = resolve_precision(cfg.precision, device)
        self.dtype = getattr(torch, self.precision.name)
        self.start_s: float | None = None
        self.work_dir = tempfile.mkdtemp(prefix=f"eagle3-{self.engine_name}-extract-")  # server.log stays
        self._lock = threading.Lock()
        self._server = None
        self._closed = False
        self.server_env: dict[str, str] = {}  # added to the server's environment (online training: its GPUs)

    # -- what a subclass provides --------------------------------------------------------------------------
    def _new_server(self):
        """The engine's ManagedServer for this target (not started)."""
        raise NotImplementedError

    def _one(self, ids: list[int], name: str):
        """One sample's request and its checked answer (runs in the request pool)."""
        raise NotImplementedError

    def _assemble(self, answers: list):
        """(aux [ΣT, 3H], target side: ``last`` [ΣT, H] or a codec.TopK) of the answers, in order."""
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Remove what only the running server needed (after it stopped)."""

    # -- the shared part -----------------------------------------------------------------------------------
    def parallel_args(self, sizes: dict[str, int]) -> list[str]:
        """``[flag, n]`` for each parallel size above 1 ({engine flag: size}), then ``--quantization`` and the
        config's ``server_args``."""
        args = []
        for flag, n in sizes.items():
            if n > 1:
                args += [flag, str(n)]
        if self.cfg.quantization:
            args += ["--quantization", self.cfg.quantization]
        return args + list(self.cfg.server_args)

    def start(self) -> None:
        """Start the server and wait for /health (once; a no-op when it runs)."""
        with self._lock:
            if self._closed:
                raise ServerStopped(f"the {self.engine_name} extract engine was closed (stopped) before its server "
                                    "started")
            if self._server is not None:
                return
            self._server = server = self._new_server()
        t0 = time.monotonic()
        server.start()
        server.wait_healthy(timeout=HEALTH_TIMEOUT_S, stopped=lambda: self._closed)
        self.start_s = round(time.monotonic() - t0, 1)
        log.info("%s extract engine: server up in %.0f s (%s; log %s)", self.engine_name, self.start_s,
                 self.forward_path, server.log_path)

    def close(self) -> None:
        """Stop the server and remove its temporary files; later calls do nothing, later forwards raise."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.stop()
        self._cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def forward(self, seqs: list, sample_ids: list[str] | None = None):
        """One request per sample, ``requests_in_flight`` at a time. Returns (aux [ΣT, 3H], the target side,
        lengths), samples in the given order; ``sample_ids`` name them in errors."""
        names = list(sample_ids) if sample_ids is not None else [f"#{i}" for i in range(len(seqs))]
        return next(self.forward_batches([(seqs, names)], 0))

    def forward_batches(self, batches, window_tokens: int):
        """:meth:`forward` of each ``(seqs, sample_ids)`` of ``batches``, in order, without waiting at batch
        boundaries: up to ``requests_in_flight`` requests are in flight at a time, and while a batch's
        answers come in, the samples of the next batches are already sent, as long as the samples sent and
        not yet handed back hold at most ``window_tokens`` tokens (their states wait here; a batch's own
        samples are always sent). A per-batch pool idled the server at every batch's tail and while the
        caller encoded and stored each batch, and capped the requests in flight at the batch's samples."""
        self.start()
        pool = ThreadPoolExecutor(max_workers=self.cfg.requests_in_flight)
        samples = ((b, seq, name) for b, (seqs, names) in enumerate(batches) for seq, name in zip(seqs, names))
        sent: dict[int, list] = collections.defaultdict(list)  # batch -> [(future, tokens)], in order
        held, nxt = 0, next(samples, None)
        try:
            b = 0
            while nxt is not None or sent:
                while nxt is not None and (nxt[0] <= b or held + len(nxt[1]) <= window_tokens):
                    ids = [int(t) for t in nxt[1]]
                    sent[nxt[0]].append((pool.submit(self._one, ids, nxt[2]), len(ids)))
                    held += len(ids)
                    nxt = next(samples, None)
                mine = sent.pop(b, [])
                answers = [f.result() for f, _ in mine]
                held -= sum(n for _, n in mine)
                aux, target = self._assemble(answers)
                yield aux, target, [n for _, n in mine]
                b += 1
        finally:  # on an error or SIGTERM, do not wait for the other requests: close() stops the server next
            pool.shutdown(wait=False, cancel_futures=True)

    def post(self, path: str, payload: dict, name: str) -> dict:
        """POST ``payload`` as JSON to the server for sample ``name``; its JSON answer. An HTTP error status
        raises AnswerError with the server's answer; no answer at all, the diagnosis of :meth:`dead`."""
        from eagle3.serving.process import http_request

        server = self._server
        if server is None:
            raise ServerStopped(f"sample {name}: the {self.engine_name} extract engine was stopped")
        try:
            return json.loads(http_request(server.url + path, payload, REQUEST_TIMEOUT_S, AnswerError))
        except (urllib.error.URLError, OSError) as e:
            raise self.dead(server, name, e) from e

    def dead(self, server, name: str, err: Exception) -> Exception:
        """The error for a request that got no answer: the server's exit and its own last error line, if it died."""
        if self._closed:
            return ServerStopped(f"sample {name}: the {self.engine_name} extract engine was stopped")
        proc, code = server.proc, None
        if proc is not None:  # a crashing server drops its connections a moment before it exits
            try:
                code = proc.wait(timeout=DEATH_WAIT_S)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            return AnswerError(f"sample {name}: no answer from {self.label} at {server.url} ({err}); "
                               f"log {server.log_path}")
        text = server.log_text()
        said = server.diagnose(text)
        tail = "\n".join(text.splitlines()[-30:])
        return ServerFailed(f"{self.label} server exited with code {code} while extracting sample {name}"
                            + (f":\n{said}" if said else "") + f"\nlast lines of {server.log_path}:\n{tail}")


def package_version(python: str, names: tuple[str, ...]) -> str:
    """The version of the first installed distribution of ``names`` in the venv of ``python``, without
    importing it (an engine's own venv; "unknown" when none is installed)."""
    code = (f"import importlib.metadata as m\nfor n in {list(names)!r}:\n    try:\n        print(m.version(n))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or "unknown"


def served_capture(cfg: ExtractConfig, device: str, longest: int) -> ServedCapture:
    """The served engine ``cfg.engine`` names (its server starts on first use)."""
    if cfg.engine == "sglang":
        from eagle3.extract.sglang_engine import SGLangCapture

        return SGLangCapture(cfg, device, longest)
    from eagle3.extract.vllm_engine import VLLMCapture

    return VLLMCapture(cfg, device, longest)


def remove_tree(path: str) -> None:
    """Remove a temporary folder a server wrote into, if it is there."""
    if path and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
