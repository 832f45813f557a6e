"""vLLM's hidden-states KV connector, made to run on CPU too; imported by vLLM's server, never by the project.

vLLM (>= 0.18) serves a target in extraction mode with
``--speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [...]}}}'``: every forward stacks
the states of those layer ids into a cache-only "attention" layer, [tokens, ids, H] per request, and a KV
connector writes them out when the request finishes (its path comes back in the completion's
``kv_transfer_params.hidden_states_path``). The stock ``ExampleHiddenStatesConnector``
(``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``) copies the rows on
a CUDA stream into pinned memory, so on CPU it fails at the write (``pin_memory=True requires a CUDA or
other accelerator backend``). This subclass, when the cache is on CPU, copies the request's rows out of
the cache synchronously (the same ``extract_from_kv_cache`` over the request's slot mapping: no streams,
events or pinned memory) and hands the file write to the stock writer threads; on a GPU it keeps the
stock path. Either way the file is written to a temporary name and renamed, so a reader never sees half
of one, and it carries the layer ids it holds in its metadata.

The flags, the layer ids and the file format are owned by ``eagle3.serving.hidden_states``; the server
needs the repository root on its PYTHONPATH. This module imports vllm and torch: it is loaded in vLLM's
venv only (the project's venv has no vllm), and imports nothing of the project beyond this package, whose
``__init__`` is standard library only.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)

from eagle3.serving.hidden_states import FORMAT, STATES, TOKENS


class CopyDone:
    """The "done" object the stock writer and ``get_finished`` wait on, for a copy that already happened:
    ``_write_tensors`` calls ``synchronize()`` before writing, ``get_finished`` polls ``query()``."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class HiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` that also runs on a CPU KV cache and writes each file atomically."""

    def _layer_ids(self) -> list[int]:
        hf = self._vllm_config.speculative_config.draft_model_config.hf_config
        return sorted(int(i) for i in getattr(hf, "eagle_aux_hidden_state_layer_ids", []))

    def _write_tensors(self, tensors: dict, event, filename: str, lock_fd: int | None) -> None:
        """Wait for the copy, write ``filename`` under a temporary name, rename it, release the lock."""
        try:
            event.synchronize()
            tmp = f"{filename}.{os.getpid()}.tmp"
            save_file(tensors, tmp, metadata={"format": FORMAT, "layer_ids": json.dumps(self._layer_ids())})
            os.replace(tmp, filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: readers waiting on LOCK_SH go on

    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.device.type != "cpu":
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        # The request's slots: every offset of every block it holds, in order (as the stock path computes).
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size, dtype=torch.long).reshape(1, -1)
                 + blocks.reshape(-1, 1) * self._block_size).flatten()
        # clone: the blocks are freed (and reused) once get_finished reports the request done.
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {STATES: states, TOKENS: pending.token_ids.clone()}
        if pending.req_id in self._req_futures:
            raise RuntimeError(f"hidden states of request {pending.req_id} are already being written")
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            import fcntl

            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = CopyDone()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(lambda f, req_id=pending.req_id: self._on_write_done(req_id, f))
