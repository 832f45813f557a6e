"""The extract stage's sglang engine: the target served by SGLang as the target of an EAGLE-3 draft.

UNTESTED AGAINST A REAL SGLANG: built from SGLang's source and documented interfaces, tested against a fake
server (tests/evaluate/fake_sglang_server.py) that computes what SGLang defines from a real transformers model.

SGLang's documented way to return hidden states (``--enable-return-hidden-states``, ``return_hidden_states``
in ``/generate``) gives, per prompt token, the state its LogitsProcessor would store: the final-norm state,
or, when the model captures EAGLE-3 aux states (``set_eagle3_layers_to_capture``: SGLang serves it as the
target of an EAGLE-3 draft), the captured layers concatenated instead. So the server gets a *capture draft*
(eagle3.export.write_capture_draft: zero weights, built from the target's config.json alone) whose
``eagle_config.eagle_aux_hidden_state_layer_ids`` are the store's aux layers; SGLang adds 1 and captures
the input of layer i+1 = the output of layer i, the store's convention, in layer order. ``last`` is not
returned, so the target side comes as SGLang's own top-k log-probs (``input_top_logprobs``, log-softmax over
the full vocab of fp32 logits, and ``output_top_logprobs[0]`` for the last position): this engine fills
``fp8-topk`` stores only (ExtractConfig refuses the others).

One ``/generate`` per sample (eagle3.serving.sglang.states_request), ``requests_in_flight`` at a time;
every answer is checked before use (:func:`read_answer`). The lifecycle, the pool and the diagnosis of a
server that dies are eagle3.extract.served's, shared with the vllm engine.
"""

from __future__ import annotations

import os

import torch

from eagle3.errors import InputError
from eagle3.extract.codec import TopK
from eagle3.extract.config import ExtractConfig
from eagle3.extract.served import AnswerError, ServedCapture, check_states, package_version, remove_tree
from eagle3.serving import free_port
from eagle3.storage_options import NUM_AUX, TOPK


class SGLangCapture(ServedCapture):
    """The target served by SGLang for one extract task; ``close()`` stops the server (safe from any thread)."""

    engine_name, label = "sglang", "SGLang"
    lm_head = None  # the top-k come from the server: no lm_head here

    def __init__(self, cfg: ExtractConfig, device: str, longest: int):
        """``longest``: the task's longest sample in tokens."""
        import sys

        super().__init__(cfg, device, longest)
        if len(set(self.aux_layers)) != NUM_AUX:
            raise InputError(f"aux layers {self.aux_layers}: the sglang engine needs {NUM_AUX} different layers "
                             "(SGLang captures each layer once, in layer order)")
        self.python = os.environ.get("EAGLE3_SGLANG_PYTHON") or sys.executable  # SGLangServer's choice too
        self.engine = {"name": "sglang", "version": package_version(self.python, ("sglang",)),
                       "tensor_parallel_size": cfg.tensor_parallel_size,
                       "data_parallel_size": cfg.data_parallel_size, "quantization": cfg.quantization}
        self.forward_path = (f"sglang {self.engine['version']} (EAGLE-3 target capture of layers "
                             f"{sorted(self.aux_layers)}; tp {cfg.tensor_parallel_size}, dp {cfg.data_parallel_size})")
        self.draft_dir = os.path.join(self.work_dir, "capture-draft")

    def server_args(self) -> list[str]:
        """Flags beyond SGLangServer's own: hidden states on, no radix cache, no chunked prefill, the precision
        policy's dtype, data parallelism, the quantization, and the config's ``server_args``."""
        from eagle3.serving.sglang import HIDDEN_STATE_FLAGS

        return [*HIDDEN_STATE_FLAGS, "--dtype", self.precision.name,
                *self.parallel_args({"--dp-size": self.cfg.data_parallel_size})]

    def _new_server(self):
        from eagle3.export import write_capture_draft
        from eagle3.serving.sglang import SGLangServer, eagle3_speculative

        write_capture_draft(self.config, sorted(self.aux_layers), self.draft_dir, self.cfg.tensor_parallel_size)
        return SGLangServer(self.model_dir, tp=self.cfg.tensor_parallel_size, port=free_port(),
                            extra_args=self.server_args(), speculative=eagle3_speculative(self.draft_dir, steps=1),
                            python=self.python, env=dict(self.server_env),
                            log_path=os.path.join(self.work_dir, "server.log"))

    def _cleanup(self) -> None:
        remove_tree(self.draft_dir)

    def _one(self, ids: list[int], name: str):
        from eagle3.serving.sglang import states_request

        body = self.post("/generate", states_request(ids, TOPK), name)
        return read_answer(body, name, ids, self.aux_layers, self.hidden_size, self.vocab_size, TOPK)

    def _assemble(self, answers: list):
        """(aux [ΣT, 3H] fp32, TopK [ΣT, K])."""
        return (torch.cat([a for a, _, _ in answers]),
                TopK(torch.cat([i for _, i, _ in answers]), torch.cat([v for _, _, v in answers])))


LOGPROB_SLACK = 1e-4
"""How far above 0 a returned log-prob may be (a fused log-softmax kernel's rounding), and how far one may
exceed the previous one in a row that must be sorted best first."""


def read_answer(body, sample: str, input_ids: list[int], aux_layers: list[int], hidden_size: int, vocab: int,
                k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One /generate answer -> (aux [T, 3H] fp32 in ``aux_layers``' order, top-k ids [T, k] int64, log-probs
    [T, k] fp32), after checking it is this sample's: the prefill entry of ``meta_info.hidden_states`` has
    T rows of 3H finite values, nothing came from a cached prefix, and every position's top-k has k entries
    of in-vocab ids with log-probs <= 0, best first. Row t's top-k is the distribution position t predicts
    (``input_top_logprobs[t + 1]``; the last position's ``output_top_logprobs[0]``)."""
    t = len(input_ids)

    def bad(what: str) -> AnswerError:
        return AnswerError(f"sample {sample}: SGLang's /generate answer {what}")

    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        raise bad(f"has no meta_info: {str(body)[:300]}")
    if meta.get("prompt_tokens") not in (None, t):
        raise bad(f"counts {meta.get('prompt_tokens')} prompt tokens, not the sample's {t}")
    if meta.get("cached_tokens"):
        raise bad(f"reused {meta['cached_tokens']} cached prompt tokens, whose states it does not return (is the "
                  "server's radix cache off, --disable-radix-cache?)")
    entries = meta.get("hidden_states")
    if not isinstance(entries, list) or not entries:
        raise bad("has no meta_info.hidden_states (was the server started with --enable-return-hidden-states?)")
    try:
        aux = torch.tensor(entries[0], dtype=torch.float32)
    except (TypeError, ValueError) as e:
        raise bad(f"has a prefill hidden-state entry that is not a [tokens, width] array of numbers ({e})") from e
    width = NUM_AUX * hidden_size
    if aux.ndim == 2 and aux.shape[0] == t and aux.shape[1] == hidden_size:
        raise bad(f"has prefill rows of {hidden_size} values: the final-norm state, not the {NUM_AUX} aux layers "
                  "(does the server serve the target of an EAGLE-3 draft, and does SGLang's model class for this "
                  "target implement set_eagle3_layers_to_capture?)")
    check_states(aux, (t, width), sample, "SGLang's prefill entry of meta_info.hidden_states")
    order = sorted(aux_layers)  # SGLang appends the captured layers in layer order
    aux = torch.cat([aux[:, order.index(i) * hidden_size:(order.index(i) + 1) * hidden_size] for i in aux_layers], -1)
    ids, values = _top_logprobs(meta, t, k, bad)
    if ((ids < 0) | (ids >= vocab)).any():
        raise bad(f"has top-k token ids outside [0, {vocab}) (the target's vocab_size)")
    if torch.isnan(values).any() or (values > LOGPROB_SLACK).any():
        raise bad("has top-k log-probs that are NaN or above 0")
    if (values[:, 1:] > values[:, :-1] + LOGPROB_SLACK).any():
        raise bad("has top-k log-probs that are not sorted best first")
    return aux, ids, values


def _top_logprobs(meta: dict, t: int, k: int, bad) -> tuple[torch.Tensor, torch.Tensor]:
    """[t, k] ids and log-probs from input_top_logprobs[1:] (positions 0..t-2) and output_top_logprobs[0]."""
    given = meta.get("input_top_logprobs")
    out = meta.get("output_top_logprobs")
    if not isinstance(given, list) or len(given) != t or given[0] is not None:
        raise bad(f"has input_top_logprobs of {len(given) if isinstance(given, list) else given!r} entries, not "
                  f"the sample's {t} with the first null (return_logprob with logprob_start_len 0?)")
    if not isinstance(out, list) or not out:
        raise bad("has no output_top_logprobs")
    rows = [*given[1:], out[0]]
    try:
        pairs = [[(float(e[0]), int(e[1])) for e in row] for row in rows]
    except (TypeError, ValueError, IndexError) as e:
        raise bad(f"has a top-logprobs entry that is not [logprob, token id, text] ({e})") from e
    short = [p for p, row in enumerate(pairs) if len(row) != k]
    if short:
        raise bad(f"has {len(pairs[short[0]])} top-logprobs entries at position {short[0]}, not top_logprobs_num={k}")
    table = torch.tensor(pairs, dtype=torch.float64).reshape(t, k, 2)
    return table[..., 1].long(), table[..., 0].float()
