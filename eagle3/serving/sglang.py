"""An SGLang server (GPU clusters): the command line from SGLang's documented flags.

    with SGLangServer("/models/llama-8b", tp=2, gpus=[0, 1]) as server:
        regenerate(cfg_with(base_url=server.url))

builds and runs

    python -m sglang.launch_server --model-path /models/llama-8b --tp-size 2 --host 127.0.0.1 --port P

with ``CUDA_VISIBLE_DEVICES=0,1``; the lifecycle is `eagle3.serving.process.ManagedServer`.
The flags come from SGLang's ``python/sglang/srt/server_args.py``: ``--model-path``,
``--tp-size`` (alias ``--tensor-parallel-size``), ``--host``, ``--port`` and the speculative
group ``--speculative-algorithm``, ``--speculative-draft-model-path``, ``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``. SGLang cannot run on this
machine (no GPU), so the command line and the lifecycle are tested against a fake
``sglang.launch_server`` module that speaks ``/health`` (``$EAGLE3_SGLANG_MODULE`` names another module
to run instead of SGLang's, as the tests do).

The sglang extract engine's flags and request (eagle3/extract/sglang_engine.py) are owned here too:
:data:`HIDDEN_STATE_FLAGS` and :func:`states_request`.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from eagle3.errors import InputError
from eagle3.serving.process import ManagedServer

# speculative dict key -> SGLang flag (server_args.py, section "Speculative decoding")
SPECULATIVE_FLAGS = {
    "algorithm": "--speculative-algorithm",
    "draft_model_path": "--speculative-draft-model-path",
    "num_steps": "--speculative-num-steps",
    "eagle_topk": "--speculative-eagle-topk",
    "num_draft_tokens": "--speculative-num-draft-tokens",
}
# Flags this class sets itself; passing them again in extra_args would be ambiguous.
_MANAGED_FLAGS = {"--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--tp", "--host", "--port",
                  *SPECULATIVE_FLAGS.values()}


MODULE_ENV = "EAGLE3_SGLANG_MODULE"

# The sglang extract engine serves the target of an EAGLE-3 draft (only then does SGLang capture the aux
# layers, set_eagle3_layers_to_capture) with hidden states on in /generate; an answer's prefill entry holds
# one row per prompt token only when the whole prompt is computed in one forward: no prefix from the radix
# cache, no chunked prefill (scheduler: the entry is sliced by the prompt's length from that forward's rows).
# fp32 logits (LogitsProcessor._get_logits casts the hidden state and lm_head to fp32): the soft labels'
# top-k, as the transformers engine computes them; bf16 logits would move log-probs by ~0.1 and flip ties.
HIDDEN_STATE_FLAGS = ("--enable-return-hidden-states", "--disable-radix-cache", "--chunked-prefill-size", "-1",
                      "--enable-fp32-lm-head")


def states_request(input_ids: list[int], top_logprobs: int) -> dict:
    """The /generate body that returns one sample's aux states and top-k log-probs (io_struct.GenerateReqInput):
    one greedy token, hidden states, and the top-k of every position from the first (``logprob_start_len``
    0: ``input_top_logprobs`` then has an entry per prompt token, the first null; the last position's is
    ``output_top_logprobs[0]``)."""
    return {"input_ids": [int(t) for t in input_ids],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_hidden_states": True, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": int(top_logprobs)}


def default_module() -> str:
    """The module run as SGLang's server: ``$EAGLE3_SGLANG_MODULE``, else ``sglang.launch_server``."""
    return os.environ.get(MODULE_ENV) or "sglang.launch_server"


def eagle3_speculative(draft_dir: str, steps: int = 3, topk: int = 1) -> dict:
    """The speculative settings for an EAGLE-3 draft; with topk 1, draft tokens = steps + 1."""
    return {"algorithm": "EAGLE3", "draft_model_path": draft_dir, "num_steps": steps, "eagle_topk": topk,
            "num_draft_tokens": steps + 1 if topk == 1 else steps * topk + 1}


class SGLangServer(ManagedServer):
    """One SGLang server process (or a handle on a running one, see ``connect``)."""

    engine = "SGLang"

    def __init__(self, model_path: str, tp: int = 1, port: int = 30000, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), speculative: dict | None = None,
                 gpus: Sequence[int] | None = None, log_path: str | None = None,
                 env: dict[str, str] | None = None, python: str | None = None,
                 module: str | None = None):
        """``extra_args`` go verbatim after the managed flags (e.g. ``["--mem-fraction-static", "0.8"]``);
        ``gpus`` becomes CUDA_VISIBLE_DEVICES; ``env`` is added to the server's environment;
        ``log_path`` receives the server's stdout and stderr (default: a file in /tmp)."""
        if not isinstance(tp, int) or tp < 1:
            raise InputError(f"SGLangServer: tp={tp!r} must be a positive integer (the tensor-parallel size)")
        if gpus is not None and len(gpus) < tp:
            raise InputError(f"SGLangServer: tp={tp} needs at least {tp} GPUs, got gpus={list(gpus)}")
        clash = sorted({a.split("=", 1)[0] for a in extra_args} & _MANAGED_FLAGS)
        if clash:
            raise InputError(f"SGLangServer: extra_args set {', '.join(clash)}, which are managed by the "
                             "model_path/tp/host/port/speculative parameters; pass them there instead")
        unknown = sorted(set(speculative or {}) - set(SPECULATIVE_FLAGS))
        if unknown:
            raise InputError(f"SGLangServer: unknown speculative key(s) {', '.join(unknown)}; "
                             f"valid keys: {', '.join(SPECULATIVE_FLAGS)}")
        super().__init__(port, host, log_path or os.path.join("/tmp", f"sglang-server-{int(port)}.log"), env)
        self.model_path, self.tp = model_path, tp
        self.extra_args, self.speculative = list(extra_args), dict(speculative or {})
        self.gpus = None if gpus is None else [int(g) for g in gpus]
        # The GPU image installs SGLang in its own venv (its torch pin differs from ours).
        self.python = python or os.environ.get("EAGLE3_SGLANG_PYTHON") or sys.executable
        self.module = module or default_module()

    def command(self) -> list[str]:
        """The exact argv the server is started with."""
        cmd = [self.python, "-m", self.module, "--model-path", str(self.model_path), "--tp-size", str(self.tp),
               "--host", self.host, "--port", str(self.port)]
        for key, flag in SPECULATIVE_FLAGS.items():
            if key in self.speculative and self.speculative[key] is not None:
                cmd += [flag, str(self.speculative[key])]
        return cmd + [str(a) for a in self.extra_args]

    def server_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        return env
