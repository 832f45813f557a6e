"""The ``openai`` backend: any OpenAI-compatible ``/v1/chat/completions`` endpoint.

SGLang, vLLM, llama.cpp's server and OpenRouter all speak it. At most
``concurrency`` requests are in flight. A 429, a 5xx, a timeout or a dropped
connection is retried with exponential backoff (honouring ``Retry-After``);
other 4xx answers cannot improve by retrying and fail at once. The API key is
sent as a bearer token and appears in no log line, error or file.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from typing import Any

from eagle3.regenerate.replay import Completion, RequestFailed

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 524, 529}


def chat_completions_url(base_url: str) -> str:
    """``http://h:p``, ``http://h:p/v1`` and ``.../v1/chat/completions`` all name the same endpoint."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if not re.search(r"/v\d+$", url):  # OpenRouter's base already ends in /api/v1
        url += "/v1"
    return url + "/chat/completions"


class OpenAIBackend:
    """Async chat-completions client with bounded concurrency and retries.

    Use inside ``async with``; ``complete(messages, tools)`` returns a Completion
    or raises RequestFailed with the last reason.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, concurrency: int = 8,
                 temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 512, seed: int | None = 0,
                 timeout_s: float = 120.0, max_retries: int = 6, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, extra_body: dict[str, Any] | None = None):
        self.url = chat_completions_url(base_url)
        self.model, self._api_key = model, api_key
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        if seed is not None:
            self.sampling["seed"] = seed
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._client = None
        self.attempts = 0  # every HTTP attempt, retries included
        self.retries = 0

    async def __aenter__(self) -> "OpenAIBackend":
        import httpx

        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout_s, limits=limits)
        return self

    async def __aexit__(self, *exc) -> None:
        await self._client.aclose()

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        # Full jitter keeps many workers that failed together from retrying together.
        return random.uniform(0.5, 1.0) * min(self.backoff_s * 2 ** attempt, self.max_backoff_s)

    async def complete(self, messages: list[dict], tools: list[dict] | None = None) -> Completion:
        import httpx

        body = {"model": self.model, "messages": messages, **self.sampling, **self.extra_body}
        if tools:
            body["tools"] = tools
        reason = "no attempt made"
        for attempt in range(self.max_retries + 1):
            retry_after = None
            async with self._slots:
                self.attempts += 1
                try:
                    r = await self._client.post(self.url, json=body)
                except httpx.TimeoutException as e:
                    reason = f"timeout after {self.timeout_s:.0f} s ({type(e).__name__})"
                except httpx.TransportError as e:  # refused, reset: the server may be restarting
                    reason = f"connection error: {type(e).__name__}: {e}"
                else:
                    if r.status_code == 200:
                        return self._parse(r, attempt + 1)
                    reason = f"HTTP {r.status_code}: {r.text[:300]}"
                    if r.status_code not in RETRY_STATUS:
                        raise RequestFailed(f"{reason} (not retried: a {r.status_code} cannot improve)",
                                            attempt + 1)
                    retry_after = r.headers.get("retry-after")
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                self.retries += 1
                log.warning("request to %s failed (%s); retry %d/%d in %.1f s", self.url, reason[:120],
                            attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
        raise RequestFailed(f"{reason} (gave up after {self.max_retries + 1} attempts)", self.max_retries + 1)

    @staticmethod
    def _parse(r, attempts: int) -> Completion:
        try:
            data = r.json()
            choice = data["choices"][0]
            msg = choice["message"]
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RequestFailed(f"malformed response ({type(e).__name__}: {e}): {r.text[:300]}", attempts)
        if "prompt_tokens" not in usage or "completion_tokens" not in usage:
            raise RequestFailed(f"response has no usage.prompt_tokens/completion_tokens: {r.text[:300]}", attempts)
        # SGLang/vLLM/DeepSeek say reasoning_content; OpenRouter says reasoning.
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
        return Completion(content=msg.get("content") or "", prompt_tokens=int(usage["prompt_tokens"]),
                          completion_tokens=int(usage["completion_tokens"]),
                          finish_reason=choice.get("finish_reason"), reasoning_content=reasoning,
                          tool_calls=msg.get("tool_calls") or None, attempts=attempts)
