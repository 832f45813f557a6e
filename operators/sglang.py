"""SGLang operators for GPU deployments: regeneration against a managed server,
and the baseline-vs-EAGLE3 serving benchmark.

Neither has run against a live SGLang server (none can run on the CPU machines
this project is tested on); see docs/evaluate.md and docs/regenerate.md.
"""

from __future__ import annotations

from typing import Any

from operators.base import Eagle3Operator
from operators.stages import RegenerateOperator


def _lease_gpus(n: int):
    from eagle3.devices import lease_device

    return lease_device(n)


class SGLangRegenerateOperator(RegenerateOperator):
    """Regenerate one dataset through an SGLang server that this task owns.

    The server is started on leased GPUs, the generation stage talks to its
    OpenAI-compatible API, and the server is stopped by PID in `finally` and
    `on_kill`. With `server_conn_id`, an already-running server named by that
    Airflow connection (host = base URL) is used instead and left running.

    :param model_path: model for `--model-path` (defaults to `model`).
    :param tp: tensor-parallel size; also the number of GPUs leased.
    :param server_args: extra `sglang.launch_server` flags.
    :param server_module: the module run as `python -m MODULE` (default `sglang.launch_server`); the
        interpreter is $EAGLE3_SGLANG_PYTHON (the GPU image's SGLang venv) or this one.
    """

    def __init__(self, *, model_path: str | None = None, tp: int = 1, port: int = 30000,
                 server_args: list[str] | None = None, server_conn_id: str | None = None,
                 server_module: str = "sglang.launch_server", **kwargs: Any):
        kwargs["backend"] = "openai"
        super().__init__(**kwargs)
        self.model_path, self.tp, self.port = model_path, tp, port
        self.server_args, self.server_conn_id = list(server_args or []), server_conn_id
        self.server_module = server_module
        self._server = None

    def stage_env(self) -> dict[str, str]:
        env = Eagle3Operator.stage_env(self)
        env["EAGLE3_OPENAI_BASE_URL"] = self._server.url + "/v1"
        env.setdefault("EAGLE3_OPENAI_API_KEY", "EMPTY")
        return env

    def execute(self, context):
        from eagle3.sglang_server import SGLangServer

        if self.server_conn_id:
            from airflow.sdk import BaseHook

            self._server = SGLangServer.connect(BaseHook.get_connection(self.server_conn_id).host)
            self._server.wait_healthy(timeout=60)
            return super().execute(context)
        with _lease_gpus(self.tp) as gpus:
            self._server = SGLangServer(self.model_path or self.model, tp=self.tp, port=self.port,
                                        extra_args=self.server_args, gpus=None if gpus == "cpu" else gpus,
                                        module=self.server_module)
            try:
                self._server.start().wait_healthy(timeout=1800)
                return super().execute(context)
            finally:
                self._server.stop()

    def on_kill(self) -> None:
        super().on_kill()
        if self._server is not None:
            self._server.stop()


class SGLangBenchmarkOperator(Eagle3Operator):
    """Serve the target twice with SGLang — baseline, then EAGLE3 with the draft — on
    leased GPUs, and measure τ (Σ completion_tokens / Σ spec_verify_ct, cross-checked
    with /get_server_info) and throughput. Servers stop in `finally` and `on_kill`.

    :param speculative_num_steps / speculative_eagle_topk / speculative_num_draft_tokens:
        the `--speculative-*` flags.
    :param server_module: as for SGLangRegenerateOperator.
    """

    template_fields = ("target", "draft", "out", "prompts", "limit", "max_new_tokens")

    def __init__(self, *, target: str, draft: str, out: str, prompts: str = "humaneval", limit: int | str = 80,
                 max_new_tokens: int | str = 256, tp: int = 1, port: int = 30000,
                 speculative_num_steps: int = 3, speculative_eagle_topk: int = 1,
                 speculative_num_draft_tokens: int = 4, server_args: list[str] | None = None,
                 server_module: str = "sglang.launch_server", **kwargs: Any):
        super().__init__(**kwargs)
        self.server_module = server_module
        self.target, self.draft, self.out, self.prompts = target, draft, out, prompts
        self.limit, self.max_new_tokens, self.tp, self.port = limit, max_new_tokens, tp, port
        self.num_steps, self.topk, self.num_draft = (speculative_num_steps, speculative_eagle_topk,
                                                     speculative_num_draft_tokens)
        self.server_args = tuple(server_args or ())
        self._bench = None

    def execute(self, context):
        from eagle3.evaluate.sglang_bench import SGLangBenchConfig, SGLangBenchmark

        self.stage_env()
        with _lease_gpus(self.tp) as gpus:
            cfg = SGLangBenchConfig(
                target=self.target, draft=self.draft, out=self.out, prompts=self.prompts, limit=int(self.limit),
                max_new_tokens=int(self.max_new_tokens), num_steps=self.num_steps, eagle_topk=self.topk,
                num_draft_tokens=self.num_draft, tp=self.tp, port=self.port, extra_args=self.server_args,
                gpus=None if gpus == "cpu" else list(gpus), module=self.server_module,
            )
            self._bench = SGLangBenchmark(cfg)
            try:
                return self.summary(self._bench.run())
            finally:
                self._bench.stop()

    def on_kill(self) -> None:
        if self._bench is not None:
            self._bench.stop()
