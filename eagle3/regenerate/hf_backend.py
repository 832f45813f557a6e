"""The ``hf`` backend: the target itself, in-process, with transformers ``generate``.

Requests from the conversations in flight are gathered into one left-padded
batch and generated together, in the precision of eagle3.devices.resolve_precision
(bf16 where the machine has a bf16 matrix engine; fp32 elsewhere, e.g. on an
AVX2-only CPU, where bf16 matmuls run ~100x slower); each caller gets its own answer back. Greedy when
temperature is 0, else sampled with ``top_p`` from a generator seeded once
with ``seed`` (so a sampled run depends on how requests were batched).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from eagle3.regenerate.replay import Completion, RequestFailed

log = logging.getLogger(__name__)


class HFBackend:
    """Batched local generation; use inside ``async with``, call ``complete`` from many tasks."""

    def __init__(self, model: str, *, batch_size: int = 8, temperature: float = 0.0, top_p: float = 1.0,
                 max_tokens: int = 512, seed: int | None = 0, device: str = "cpu", precision: str = "auto"):
        self.model_name, self.batch_size, self.device = model, batch_size, device
        self.requested_precision = precision
        self.precision = None  # the resolved eagle3.devices.Precision, once loaded
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self.batches = 0
        self.attempts = 0
        self.retries = 0  # nothing to retry in-process; kept so both backends report the same fields

    def _load(self) -> None:
        import torch

        from eagle3 import target

        self.tok = target.load_tokenizer(self.model_name)
        self.tok.padding_side = "left"  # generation continues from the right end of every row
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        from eagle3.devices import resolve_device, resolve_precision

        device = resolve_device(self.device)
        self.precision = resolve_precision(self.requested_precision, device)
        log.info("regenerate: hf backend, %s in %s on %s (%s)", self.model_name, self.precision.name, device,
                 self.precision.reason)
        self.model = target.load_model(self.model_name, device, self.precision.name)
        self.torch = torch
        if self.seed is not None:
            torch.manual_seed(self.seed)

    async def __aenter__(self) -> "HFBackend":
        await asyncio.to_thread(self._load)
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._worker.cancel()
        try:
            await self._worker
        except asyncio.CancelledError:
            pass

    async def complete(self, messages: list[dict], tools: list[dict] | None = None) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put((messages, tools, fut))
        return await fut

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            # Conversations whose turn just finished enqueue their next turn within a
            # few loop iterations: yield briefly so they join this batch.
            for _ in range(3):
                await asyncio.sleep(0)
            while len(batch) < self.batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await asyncio.to_thread(self._generate, [(m, t) for m, t, _ in batch])
            except Exception as e:  # one bad batch fails its requests, not the worker
                results = [RequestFailed(f"generate failed: {type(e).__name__}: {e}")] * len(batch)
            for (_, _, fut), res in zip(batch, results):
                if fut.cancelled():
                    continue
                if isinstance(res, Exception):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)

    def _prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True}
        if tools:
            kwargs["tools"] = tools
        ids = self.tok.apply_chat_template(messages, **kwargs)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def _generate(self, requests: list[tuple[list[dict], list | None]]) -> list[Completion | Exception]:
        torch = self.torch
        self.attempts += len(requests)
        self.batches += 1
        prompts = [self._prompt_ids(m, t) for m, t in requests]
        width = max(map(len, prompts))
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.model.device)
        sample = self.temperature > 0
        gen_kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens, "do_sample": sample, "pad_token_id": pad}
        if sample:
            gen_kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=0)
        else:
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
        eos = self.tok.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        gen_eos = self.model.generation_config.eos_token_id
        eos_ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        results: list[Completion | Exception] = []
        for row, prompt in zip(out[:, width:].tolist(), prompts):
            n, finish = len(row), "length"
            for j, t in enumerate(row):
                if t in eos_ids:  # the end-of-turn token counts, like a server's usage does
                    n, finish = j + 1, "stop"
                    break
            text = self.tok.decode(row[:n], skip_special_tokens=True).strip()
            results.append(Completion(content=text, prompt_tokens=len(prompt), completion_tokens=n,
                                      finish_reason=finish, token_ids=row[:n]))
        return results
