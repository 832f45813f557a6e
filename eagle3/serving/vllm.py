"""A vLLM OpenAI server, optionally with an EAGLE-3 draft; the lifecycle is ManagedServer's.

    with VLLMServer(target_dir, speculative=eagle3_speculative(draft_dir, 3)) as server:
        POST server.url + "/v1/completions"; GET server.url + "/metrics"

runs ``<vllm python> -m vllm.entrypoints.openai.api_server --model T --dtype D --max-model-len N
--host 127.0.0.1 --port P [--speculative-config JSON]`` in vLLM's own venv (it pins another
transformers): ``$EAGLE3_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python`` (``make vllm``).
The environment (DESIGN.md "vLLM facts", each default kept when the caller's environment sets
it): a 2 GiB KV cache, OpenMP bound to every core this process may use (vLLM's default binds
one), Intel's libiomp5 preloaded (without it speculative decoding loses much speed), a
persistent compile cache under ``~/.cache/eagle3/vllm`` (a warm cache shortens later starts),
and no hub access. When the draft does not load, the error quotes vLLM's own message and names
the draft file and key it points at.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Sequence

from eagle3.errors import InputError
from eagle3.export import draft_is_parallel
from eagle3.serving.process import ManagedServer, last_error_line

MODULE = "vllm.entrypoints.openai.api_server"
CACHE_ROOT = Path.home() / ".cache" / "eagle3" / "vllm"
REPO_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
_MANAGED_FLAGS = {"--model", "--dtype", "--max-model-len", "--host", "--port", "--served-model-name",
                  "--speculative-config", "--enforce-eager"}
# vLLM's names for the draft's parameters (llama_eagle3.load_weights) -> the export's (eagle3.export).
_VLLM_TO_EXPORT = {"draft_id_to_target_id": "d2t", "model.layers.0.": "midlayer.", "model.fc": "fc",
                   "model.norm": "norm", "model.embed_tokens": "embed_tokens"}


def vllm_python() -> str:
    """The interpreter of vLLM's venv."""
    python = os.environ.get("EAGLE3_VLLM_PYTHON") or str(REPO_VENV / "bin" / "python")
    if not Path(python).exists():
        raise InputError(f"vLLM's python {python} does not exist: build its venv with `make vllm`, or point "
                         "EAGLE3_VLLM_PYTHON at a python that has vllm installed")
    return python


def eagle3_speculative(draft_dir: str, steps: int = 3) -> dict:
    """vLLM's --speculative-config for ``steps`` draft tokens of an exported draft: an EAGLE-3 chain, or one
    parallel forward when its config.json says `parallel_drafting` (P-EAGLE, eagle3.export.parallel_keys)."""
    spec = {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": int(steps)}
    if draft_is_parallel(str(draft_dir)):
        spec["parallel_drafting"] = True
    return spec


def _cpu_bind() -> str:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))


class VLLMServer(ManagedServer):
    """One vLLM server process (or a handle on a running one, see ``connect``)."""

    engine = "vLLM"

    def __init__(self, model: str, port: int = 8000, host: str = "127.0.0.1", dtype: str = "float32",
                 max_model_len: int = 2048, speculative: dict | None = None, served_model_name: str | None = None,
                 enforce_eager: bool = False, extra_args: Sequence[str] = (), log_path: str | None = None,
                 env: dict[str, str] | None = None, python: str | None = None):
        """``speculative``: vLLM's --speculative-config (see eagle3_speculative); ``served_model_name``: the
        ``model`` clients send (default: the path); ``enforce_eager`` skips torch.compile and CUDA graphs."""
        clash = sorted({str(a).split("=", 1)[0] for a in extra_args} & _MANAGED_FLAGS)
        if clash:
            raise InputError(f"VLLMServer: extra_args set {', '.join(clash)}, which are managed by the "
                             "model/dtype/max_model_len/host/port/speculative parameters; pass them there")
        super().__init__(port, host, log_path or os.path.join("/tmp", f"vllm-server-{int(port)}.log"), env)
        self.model, self.dtype, self.max_model_len = str(model), dtype, int(max_model_len)
        self.speculative = dict(speculative) if speculative else None
        self.served_model_name = served_model_name or self.model
        self.enforce_eager, self.extra_args = enforce_eager, [str(a) for a in extra_args]
        self.python = python or vllm_python()

    def command(self) -> list[str]:
        """The exact argv the server is started with."""
        cmd = [self.python, "-m", MODULE, "--model", self.model, "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--host", self.host, "--port", str(self.port),
               "--served-model-name", self.served_model_name]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.speculative, sort_keys=True)]
        return cmd + self.extra_args

    def server_env(self) -> dict[str, str]:
        defaults = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": _cpu_bind(),
                    "VLLM_CACHE_ROOT": str(CACHE_ROOT), "HF_HUB_OFFLINE": "1"}
        iomp = Path(self.python).parent.parent / "lib" / "libiomp5.so"
        if iomp.exists():
            defaults["LD_PRELOAD"] = " ".join(p for p in (os.environ.get("LD_PRELOAD"), str(iomp)) if p)
        env = {k: v for k, v in defaults.items() if k not in os.environ or k == "LD_PRELOAD"}
        return {**env, **self.env}

    def diagnose(self, log_text: str) -> str | None:
        """vLLM's last error line, and the draft file and key it points at when the draft is the cause."""
        said = super().diagnose(log_text)
        if said is None or not (self.speculative or {}).get("model"):  # no draft to blame (none, or extraction)
            return said
        return said + "\n" + draft_blame(str(self.speculative.get("model")), last_error_line(log_text)[1])


def draft_blame(draft_dir: str, message: str) -> str:
    """Which file and key of an exported draft a vLLM load error names."""
    config_path, weights = os.path.join(draft_dir, "config.json"), os.path.join(draft_dir, "model.safetensors")
    try:
        config_keys = set(json.loads(Path(config_path).read_text()))
    except (OSError, ValueError):
        config_keys = set()
    for name in re.findall(r"['\"]([\w.]+)['\"]", message):
        if name in config_keys or name in ("eagle_config", "eagle_aux_hidden_state_layer_ids", "draft_vocab_size"):
            return f"draft file {config_path}, key {name!r}"
        for theirs, ours in _VLLM_TO_EXPORT.items():
            if name.startswith(theirs) or name.rstrip(".") == theirs.rstrip("."):
                key = ours + name[len(theirs):] if name.startswith(theirs) else ours
                hint = (" (a full-vocab draft, draft_vocab_size == vocab_size, must not carry d2t for vLLM; "
                        "re-export it with `eagle3 export`)" if ours == "d2t" else "")
                return f"draft file {weights}, tensor {key!r} (vLLM's {name!r}){hint}"
    if re.search(r"safetensors|header|deserializ", message, re.IGNORECASE):
        return f"draft file {weights}"
    return f"draft {draft_dir} (config.json or model.safetensors; vLLM's message names no key)"
