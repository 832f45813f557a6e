"""Run the target on a padded batch and capture aux-layer outputs and the final-norm hidden state.

Facts checked against transformers 5.24 (tests/extract/test_capture.py):
``output_hidden_states`` gives L+1 entries; entry 0 is the embedding output and
entry i+1 is the output of decoder layer i, except the LAST entry, which is
``last_hidden_state`` — already passed through the final norm (``model.model.norm``),
i.e. exactly what feeds lm_head. So aux layer i is ``hidden_states[i+1]`` for
i < L-1, and ``last`` is ``last_hidden_state``. Selecting indices (a list for
``output_hidden_states``) keeps only those layers alive, which saves memory.

The compute precision comes from ``eagle3.devices.resolve_precision`` (bf16 where the
machine has a bf16 matrix engine, fp32 elsewhere). On CPU, plain Llama targets run
through ``lean_llama`` in either precision (fewer memory passes; in bf16 its residual
stream stays fp32); other models (Gemma 3: GELU, sandwich norms, sliding windows) and
CUDA use the transformers forward, whose hidden states follow the same convention. Whatever the
compute precision, ``lm_head`` gives fp32 logits (they become fp8-topk's stored soft
labels) and the stored tensors are the storage option's (eagle3.storage_options).

We call the base model (not the LM head model): logits over padding would cost
2·H·V FLOPs per padded token for nothing; the ``fp8-topk`` option applies
lm_head to real tokens only.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from eagle3.devices import resolve_precision
from eagle3.errors import InputError
from eagle3.oom import maybe_inject
from eagle3.extract import lean_llama
from eagle3.target import load_model, refuse_capped_logits, resolve_aux_layers, resolve_model, vocab_size

log = logging.getLogger(__name__)

class TargetCapture:
    """The target model, ready to return per-token features of real tokens."""

    def __init__(self, model: str, device: str = "cpu", aux_layers: list[int] | None = None, lean: bool = True,
                 precision: str = "auto"):
        self.device = device
        self.precision = resolve_precision(precision, device)
        self.model = load_model(model, device, self.precision.name)
        self.base = getattr(self.model, self.model.base_model_prefix)
        self._head32 = None
        # The lean forward is a CPU path; CUDA keeps the HF forward.
        why_not = "disabled" if not lean else ("not on CPU" if device != "cpu" else lean_llama.supports(self.model))
        self.lean = lean_llama.LeanLlama(self.model) if why_not is None else None
        self.forward_path = "lean" if self.lean else f"transformers ({why_not})"
        cfg = self.model.config
        refuse_capped_logits(getattr(cfg, "final_logit_softcapping", None), model)
        self.num_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size
        self.vocab_size = vocab_size(resolve_model(model))
        rows = self.model.get_output_embeddings().weight.shape[0]
        if rows != self.vocab_size:
            raise InputError(f"model {model!r}: its lm_head has {rows} rows but config.json vocab_size is "
                             f"{self.vocab_size}; V must be the lm_head rows (fix config.json)")
        self.aux_layers = resolve_aux_layers(aux_layers, self.num_layers, model)

    def params(self) -> int:
        """Parameters the forward pass multiplies with (no embedding lookup, no lm_head)."""
        emb = self.model.get_input_embeddings().weight.numel()
        return sum(p.numel() for p in self.base.parameters()) - emb

    @torch.inference_mode()
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [T, V] whatever the compute precision: bf16 logits (8 bits of mantissa) would flip
        near-tie argmaxes of the soft labels. A bf16 target keeps one fp32 copy of its lm_head for this."""
        head = self.model.get_output_embeddings()
        if self._head32 is None:
            self._head32 = head.weight.detach().float()
        bias = getattr(head, "bias", None)
        with torch.autocast(device_type=self._head32.device.type, enabled=False):  # fp32 inside autocast too
            return F.linear(hidden.to(self._head32.device).float(), self._head32,
                            None if bias is None else bias.float())

    def forward_batches(self, batches, window_tokens: int = 0):
        """:meth:`forward` of each ``(seqs, sample_ids)`` of ``batches``, in order: one forward pass each (the
        served engines' version also sends requests ahead into later batches, within ``window_tokens``)."""
        for seqs, sample_ids in batches:
            yield self.forward(seqs, sample_ids)

    @torch.inference_mode()
    def forward(self, seqs: list[list[int]], sample_ids: list[str] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Right-padded forward pass. ``sample_ids`` is VLLMCapture's (it names samples in its errors);
        unused here, so callers treat both engines alike.

        Returns (aux [ΣT, 3H], last [ΣT, H], lengths) for the real tokens only,
        samples in the given order (on the model's device and dtype).
        """
        lengths = [len(s) for s in seqs]
        width = max(lengths)
        maybe_inject(len(seqs) * width, f"batch of {len(seqs)}x{width}")
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, :len(s)] = 1  # right padding: positions 0..n-1 are the same as unpadded
        keep = mask.bool()
        if self.lean is not None:
            outs, last = self.lean.forward(ids, self.aux_layers)
            return torch.cat([o[keep] for o in outs], dim=-1), last[keep], lengths
        ids, mask = ids.to(self.device), mask.to(self.device)
        # No attention mask: causal attention with right padding never lets a real token
        # see a padded one, and without a mask SDPA runs its causal kernel.
        out = self.base(input_ids=ids, use_cache=False,
                        output_hidden_states=[i + 1 for i in self.aux_layers])
        keep = keep.to(self.device)
        aux = torch.cat([out.hidden_states[i + 1][keep] for i in self.aux_layers], dim=-1)
        return aux, out.last_hidden_state[keep], lengths
