"""What the vllm engine does with vLLM's hidden-state files: check each one, split it into the store's
``aux`` and ``last``, with the target's own final norm applied once.

A file (``eagle3.serving.hidden_states``, written by vLLM's server through
``eagle3.serving.hidden_states_connector``) holds one sample: ``hidden_states`` [T, len(ids), H] for vLLM's
layer ids in ascending order, and the prompt's ``token_ids``. Our aux layer i (output of layer i) is vLLM's
id i+1; id L is the last layer's output BEFORE the final norm, so ``last`` = final_norm(states[id L]).

The final norm is the module transformers builds for the target's architecture (its convention: Llama's
w·x/rms(x), Gemma's (1+w)·x/rms(x)), built on the meta device with only its own weights read from the
checkpoint: a target too big for transformers still has a norm that fits. It runs in fp32.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import torch

from eagle3.errors import Eagle3Error, InputError
from eagle3.evaluate.lossless import first_difference
from eagle3.extract.served import check_states
from eagle3.serving.hidden_states import FORMAT, STATES, TOKENS


class StatesFileError(Eagle3Error):
    """A hidden-state file from vLLM is missing or does not hold what its sample needs."""


def read_states(path: str, sample_id: str, input_ids, layer_ids: list[int], hidden_size: int,
                dtype: torch.dtype) -> torch.Tensor:
    """The [T, len(layer_ids), H] states of one sample from ``path``, after checking that the file is this
    connector's, for these layer ids, in ``dtype``, finite, and for exactly this sample's T tokens."""
    from safetensors import SafetensorError, safe_open

    lock = path + ".lock"
    if os.path.exists(lock):  # the server holds LOCK_EX on it until the file is written
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_SH)

    def bad(what: str) -> StatesFileError:
        return StatesFileError(f"sample {sample_id}: hidden-state file {path} from vLLM {what}")

    if not os.path.exists(path):
        raise bad("does not exist (the server's log says why its connector wrote none)")
    try:
        with safe_open(path, framework="pt") as f:
            meta, keys = f.metadata() or {}, set(f.keys())
            if meta.get("format") != FORMAT:
                raise bad(f"has format {meta.get('format')!r}, not {FORMAT!r} (is the server's kv connector "
                          "eagle3.serving.hidden_states_connector?)")
            if json.loads(meta.get("layer_ids", "null")) != list(layer_ids):
                raise bad(f"holds layer ids {meta.get('layer_ids')}, not the {list(layer_ids)} asked for")
            if not {STATES, TOKENS} <= keys:
                raise bad(f"has tensors {sorted(keys)}, not {STATES!r} and {TOKENS!r}")
            states, tokens = f.get_tensor(STATES), f.get_tensor(TOKENS)
    except (SafetensorError, OSError, ValueError) as e:  # truncated, not safetensors, bad metadata JSON
        raise bad(f"is unreadable ({type(e).__name__}: {e})") from e
    ids = torch.as_tensor(input_ids).long()
    # [tokens of the sample, layer ids, hidden size], finite
    check_states(states, (ids.numel(), len(layer_ids), hidden_size), sample_id,
                 f"hidden-state file {path} from vLLM", StatesFileError)
    if states.dtype != dtype:
        raise bad(f"holds {states.dtype} states, not {dtype} (the server's --dtype)")
    if tokens.numel() != ids.numel() or not torch.equal(tokens.long().flatten(), ids):
        raise bad(f"is for {tokens.numel()} other tokens than the sample's {ids.numel()} "
                  f"(first differing at {first_difference(tokens.long().flatten().tolist(), ids.tolist())})")
    return states


def split_states(states: torch.Tensor, layer_ids: list[int], aux_layers: list[int], num_layers: int,
                 final_norm) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, len(layer_ids), H] states -> (aux [T, 3H] in the aux layers' order, as stored; last [T, H] fp32):
    aux layer i is vLLM id i+1, ``last`` is ``final_norm`` of id ``num_layers`` (applied here, once)."""
    at = {k: j for j, k in enumerate(layer_ids)}
    missing = [i + 1 for i in aux_layers if i + 1 not in at] + ([num_layers] if num_layers not in at else [])
    if missing:
        raise ValueError(f"vLLM layer ids {missing} are not among the extracted {layer_ids}")
    aux = torch.cat([states[:, at[i + 1]] for i in aux_layers], dim=-1)
    with torch.inference_mode():
        last = final_norm(states[:, at[num_layers]].float())
    return aux, last


class TargetTail:
    """The target's final norm and (on demand) its lm_head, without its layers."""

    def __init__(self, model_dir: str, model: str):
        from huggingface_hub.errors import StrictDataclassError  # transformers' config validation
        from transformers import AutoConfig, AutoModelForCausalLM

        self.model_dir, self.model = model_dir, model
        try:
            # the architecture's modules, no memory; never the checkpoint's own code (and no y/N prompt for it)
            with torch.device("meta"):
                self._meta = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(model_dir, trust_remote_code=False), trust_remote_code=False)
        except (ValueError, KeyError, StrictDataclassError) as e:  # an input error: a retry cannot fix it
            raise unknown_architecture(model_dir, model, e) from e
        self._names = {id(m): n for n, m in self._meta.named_modules()}
        base = getattr(self._meta, self._meta.base_model_prefix, None)
        norm = getattr(base, "norm", None)
        if not isinstance(norm, torch.nn.Module):
            raise InputError(f"model {model!r}: no final norm at {self._meta.base_model_prefix}.norm of "
                             f"{type(self._meta).__name__}; the vllm engine applies it to vLLM's last state itself")
        self._files: dict[str, str] | None = None
        self.final_norm = self._materialize(norm).eval()
        self._head: tuple | None = None

    def _materialize(self, module: torch.nn.Module) -> torch.nn.Module:
        name = self._names[id(module)]
        weights = {k: self.checkpoint_tensor(f"{name}.{k}") for k in module.state_dict()}
        module = module.to_empty(device="cpu")
        module.load_state_dict(weights)
        return module.float()

    def checkpoint_tensor(self, key: str, fallback: str | None = None) -> torch.Tensor:
        """One tensor of the target's safetensors checkpoint, fp32 (``fallback``: a key to try when ``key``
        is absent, e.g. the tied embedding for lm_head)."""
        from safetensors import safe_open

        if self._files is None:
            self._files = _checkpoint_files(self.model_dir, self.model)
        files = self._files
        for want in (key, fallback):
            if want is None:
                continue
            hits = [k for k in files if k == want] or [k for k in files if k.endswith("." + want)]
            if len(hits) == 1:
                with safe_open(files[hits[0]], framework="pt") as f:
                    return f.get_tensor(hits[0]).float()
        raise InputError(f"model {self.model!r}: its safetensors checkpoint in {self.model_dir} has no tensor "
                         f"{key!r}" + (f" nor {fallback!r}" if fallback else ""))

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [T, V] (what fp8-topk's soft labels need), the weight read once."""
        if self._head is None:
            head = self._meta.get_output_embeddings()
            name = self._names[id(head)]
            tied = self._names[id(self._meta.get_input_embeddings())] + ".weight"
            bias = f"{name}.bias" if getattr(head, "bias", None) is not None else None
            self._head = (self.checkpoint_tensor(f"{name}.weight", tied if self._meta.config.tie_word_embeddings
                                                 else None), bias and self.checkpoint_tensor(bias))
        weight, bias = self._head
        return torch.nn.functional.linear(hidden.float(), weight, bias)


def unknown_architecture(model_dir: str, model: str, err: Exception) -> InputError:
    """What to do when transformers cannot build the target's architecture (a newer or custom-code model_type
    that vLLM itself may serve)."""
    import transformers

    path = os.path.join(model_dir, "config.json")
    try:
        model_type = json.loads(Path(path).read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    said = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return InputError(f"model {model!r}: transformers {transformers.__version__} cannot build model_type "
                      f"{model_type!r} ({said}); the vllm engine applies the target's final norm (and reads "
                      "fp8-topk's lm_head) through the module transformers builds for it, never running the "
                      "checkpoint's own code. Install a transformers that knows this model_type in this project's "
                      "venv, or extract with --engine sglang --storage-option fp8-topk, which needs neither",
                      file=path)


def _checkpoint_files(model_dir: str, model: str) -> dict[str, str]:
    """{tensor name: safetensors file} of a model folder (its index, else every *.safetensors' header)."""
    from safetensors import safe_open

    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        return {k: str(root / v) for k, v in json.loads(index.read_text())["weight_map"].items()}
    out: dict[str, str] = {}
    for p in sorted(root.glob("*.safetensors")):
        with safe_open(str(p), framework="pt") as f:
            out.update({k: str(p) for k in f.keys()})
    if not out:
        raise InputError(f"model {model!r}: no *.safetensors in {model_dir} (the vllm engine reads the final "
                         "norm from them; pickled .bin checkpoints are not read)")
    return out
