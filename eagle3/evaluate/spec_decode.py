"""Greedy chain speculative decoding on the transformers backend.

One round, with the target having consumed x_0..x_m and produced the "root"
token x_{m+1} (not yet fed to it), follows docs/CONTRACTS.md "Alignment":

1. draft *extend*: the positions the draft has not seen with real features,
   token x_{t+1} paired with the target's aux_t, appended to the draft cache;
   the last row proposes d_1.
2. draft *chain*: k-1 more single-position steps, each fed its own previous
   token and output hidden, propose d_2..d_k; their cache rows are dropped
   again right after (they were built from draft hiddens, not real aux).
   P-EAGLE drafts (parallel drafting) replace 1-2 with ONE draft forward over the
   extend rows plus k-1 mask slots, which proposes d_1..d_k at once; the slots'
   cache rows are dropped the same way.
3. ONE target forward over [root, d_1..d_k] (k+1 positions, KV cache kept):
   g_i = argmax after position i. The longest prefix with d_i == g_{i-1} is
   accepted (a tokens) and g_a is the bonus token, so a round emits a+1 <= k+1
   tokens. The target cache is cropped to the accepted positions; the aux of
   [root, d_1..d_a] feed the next round's extend. The prefix is never re-run.

Greedy verification is lossless by construction: every emitted token is the
target's argmax given the emitted prefix. `greedy_generate` is the plain
KV-cache baseline that the benchmark compares against token for token.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol, Sequence

import torch

from eagle3.evaluate.lookup import prompt_lookup
from eagle3.target import resolve_aux_layers


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One target verification."""

    drafted: int
    """k_i: draft tokens proposed this round (always k, also near max_new_tokens, as in vLLM)."""
    accepted: int
    """a_i: leading draft tokens equal to the target's argmax, all of them, also past a stop."""
    emitted: int
    """a_i + 1 (the bonus): what this verification produced before a stop (eos, max_new_tokens) trims
    the output. vLLM's counters count acceptances before that trim too (v1 scheduler: the accepted
    count is taken from the sampled ids, then check_stop cuts them), so on the same output both
    engines report the same per-prompt counts."""
    looked_up: tuple[int, ...] = ()
    """Draft positions (0-based) whose token came from the prompt lookup (`proposer: lookup+draft`)."""


@dataclasses.dataclass
class Generation:
    """Output of one decode of one prompt."""

    tokens: list[int]
    """generated token ids (the prompt excluded; a final eos included)."""
    seconds: float
    """wall time of the whole decode, prefill included."""
    stop: str
    """"eos" or "length"."""
    steps: list[StepRecord] = dataclasses.field(default_factory=list)
    """verification rounds (speculative decoding only; the prefill's first token is not one)."""


class DraftStepper(Protocol):
    """What the decoder needs from a draft model: a KV cache it can extend and roll back."""

    def reset(self) -> None:
        """Start a new sequence (empty cache)."""

    def __len__(self) -> int:
        """Positions in the draft cache."""

    def extend(self, token_ids: Sequence[int], aux: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Append positions len..len+T-1 (token x_{t+1} with target aux_t [T, 3H]);
        return the target-vocab token proposed by the last row and its output hidden [H]."""

    def chain(self, token_id: int, hidden: torch.Tensor) -> tuple[int, torch.Tensor]:
        """Append one position fed the previous proposal and output hidden; return the next proposal."""

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cache positions."""

    parallel: bool
    """P-EAGLE: `propose` drafts the whole round in one forward (then `extend` and `chain` are not used)."""

    def propose(self, token_ids: Sequence[int], aux: torch.Tensor, k: int) -> list[int]:
        """`extend` plus k-1 parallel slots in one forward: the k target-vocab proposals; the cache keeps only
        the extended positions."""


class Eagle3DraftStepper:
    """`DraftStepper` over `eagle3.draft.model.Eagle3Draft` and its `DraftCache`.

    Positions grow by one per chain step, as in SGLang's EAGLE worker.
    """

    def __init__(self, draft):
        from eagle3.draft.model import DraftCache

        self.draft = draft.eval()
        self._cache_cls = DraftCache
        self.cache = DraftCache()
        self.device = draft.fc.weight.device

    def reset(self) -> None:
        self.cache = self._cache_cls()

    def __len__(self) -> int:
        return len(self.cache)

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[int, torch.Tensor]:
        start = len(self.cache)
        pos = torch.arange(start, start + ids.shape[0], device=self.device)[None]
        logits, out = self.draft.step(ids[None].to(self.device), hidden[None].to(self.device), pos, self.cache)
        best = logits[0, -1].argmax()
        return int(self.draft.draft_to_target(best)), out[0, -1]

    @torch.no_grad()
    def extend(self, token_ids: Sequence[int], aux: torch.Tensor) -> tuple[int, torch.Tensor]:
        return self._run(torch.as_tensor(list(token_ids), dtype=torch.long), aux)

    @torch.no_grad()
    def chain(self, token_id: int, hidden: torch.Tensor) -> tuple[int, torch.Tensor]:
        return self._run(torch.tensor([token_id], dtype=torch.long), hidden[None])

    @property
    def parallel(self) -> bool:
        return bool(self.draft.config.parallel_drafting)

    @torch.no_grad()
    def propose(self, token_ids: Sequence[int], aux: torch.Tensor, k: int) -> list[int]:
        ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=self.device)
        start = len(self.cache)
        pos = torch.arange(start, start + ids.shape[0], device=self.device)[None]
        best = self.draft.propose_parallel(ids[None], aux[None].to(self.device), pos, k, self.cache).argmax(-1)
        self.cache.truncate(start + ids.shape[0])
        return self.draft.draft_to_target(best[0]).tolist()

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)


class TargetRunner:
    """A Hugging Face causal LM run incrementally over a DynamicCache, capturing
    the outputs of the aux layers (layer id i = the output of decoder layer i,
    SGLang's meaning; HF's hidden_states[i + 1])."""

    def __init__(self, model, aux_layers: Sequence[int] = ()):
        self.model = model.eval()
        layers = model.get_decoder().layers
        # the extraction's rule (one validator): no ids means a target-only run with nothing captured
        self.aux_layers = (resolve_aux_layers([int(i) for i in aux_layers], len(layers),
                                              getattr(model, "name_or_path", "target")) if len(aux_layers) else [])
        self.device = next(model.parameters()).device
        self.tokens_fed = 0  # every token that went through a target forward (tests: no prefix re-runs)
        self._captured: dict[int, torch.Tensor] = {}
        self._capture = False
        for i in self.aux_layers:
            layers[i].register_forward_hook(self._hook(i))

    def _hook(self, layer_id: int):
        def hook(_module, _args, output):
            if self._capture:
                self._captured[layer_id] = output[0] if isinstance(output, tuple) else output
        return hook

    def new_cache(self, rollback: bool = True):
        """A DynamicCache for this target. Sliding-window layers (Gemma 3: 5 of every 6, window 512)
        keep only the last window-1 positions, and such a layer refuses to roll back once the window
        is full; with ``rollback`` (speculative decoding) they record the rows of the latest forward
        until `crop_cache` trims them. The plain baseline never rolls back."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if rollback:
            cache.activate_past_recording()
        return cache

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int], cache, *, all_logits: bool, aux: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``token_ids`` after what ``cache`` holds. Returns logits [T or 1, V]
        (fp32) and, when ``aux``, the concatenated aux features [T, 3H]."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=self.device)[None]
        self._capture, self._captured = aux, {}
        try:
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=0 if all_logits else 1)
        finally:
            self._capture = False
        self.tokens_fed += ids.shape[1]
        feats = torch.cat([self._captured[i][0] for i in self.aux_layers], dim=-1) if aux else None
        return out.logits[0].float(), feats


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of a transformers DynamicCache (transformers 5 `crop` takes
    a negative count of tokens to drop). Called after every verification even with nothing to drop:
    `crop(0)` is what trims a recording sliding-window layer back to its window."""
    extra = cache.get_seq_length() - length
    if extra < 0:
        raise ValueError(f"crop_cache({length}) beyond the cache's {cache.get_seq_length()} positions")
    cache.crop(-extra)


def accepted_prefix(drafts: Sequence[int], best: Sequence[int]) -> int:
    """How many leading drafts equal the target's argmax after the position before each (best[i] follows
    drafts[i-1]; best[0] follows the root)."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == best[accepted]:
        accepted += 1
    return accepted


def _stop_after(token: int, produced: int, max_new_tokens: int, eos_ids: frozenset[int]) -> str | None:
    if token in eos_ids:
        return "eos"
    return "length" if produced >= max_new_tokens else None


@torch.no_grad()
def greedy_generate(target: TargetRunner, prompt_ids: Sequence[int], max_new_tokens: int,
                    eos_ids: frozenset[int]) -> Generation:
    """The baseline: plain greedy decoding with a KV cache, one token per forward."""
    start = time.perf_counter()
    cache = target.new_cache(rollback=False)
    logits, _ = target.forward(prompt_ids, cache, all_logits=False, aux=False)
    out: list[int] = []
    while True:
        token = int(logits[-1].argmax())
        out.append(token)
        stop = _stop_after(token, len(out), max_new_tokens, eos_ids)
        if stop:
            return Generation(out, time.perf_counter() - start, stop)
        logits, _ = target.forward([token], cache, all_logits=False, aux=False)


@torch.no_grad()
def speculative_generate(target: TargetRunner, draft: DraftStepper, prompt_ids: Sequence[int],
                         max_new_tokens: int, eos_ids: frozenset[int], steps: int = 3,
                         lookup: bool = False) -> Generation:
    """Greedy chain speculative decoding with ``steps`` draft tokens per verification. ``lookup``: at each chain
    step a prompt lookup hit (eagle3.evaluate.lookup) replaces the draft's token, and the draft's chain goes on
    from the token proposed."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1 (draft tokens per target verification)")
    start = time.perf_counter()
    prompt_ids = list(prompt_ids)
    cache = target.new_cache()
    logits, aux = target.forward(prompt_ids, cache, all_logits=False, aux=True)
    root = int(logits[-1].argmax())
    out, records = [root], []
    stop = _stop_after(root, 1, max_new_tokens, eos_ids)
    draft.reset()
    # The draft's input at position t is (x_{t+1}, aux_t): the prompt shifted by one, then the root.
    pending_ids, pending_aux = prompt_ids[1:] + [root], aux
    parallel = bool(getattr(draft, "parallel", False))
    while not stop:
        seen = len(draft)
        if parallel:  # P-EAGLE: the whole round from one draft forward
            proposed = draft.propose(pending_ids, pending_aux, steps)
            token = proposed[0]
        else:
            token, hidden = draft.extend(pending_ids, pending_aux)
        drafts, looked_up = [], []
        before, last = (out[-2] if len(out) > 1 else prompt_ids[-1]), out[-1]  # the lookup reads two tokens
        for i in range(steps):
            hit = prompt_lookup(prompt_ids, before, last) if lookup else None
            if hit is not None:
                token = hit
                looked_up.append(i)
            drafts.append(token)
            before, last = last, token
            if i < steps - 1 and parallel:
                token = proposed[i + 1]
            elif i < steps - 1:
                token, hidden = draft.chain(token, hidden)
        draft.truncate(seen + len(pending_ids))  # drop the chain rows
        verified_from = cache.get_seq_length()
        logits, ver_aux = target.forward([root, *drafts], cache, all_logits=True, aux=True)
        best = logits.argmax(dim=-1).tolist()
        accepted = accepted_prefix(drafts, best)
        for token in [*drafts[:accepted], best[accepted]]:
            out.append(token)
            stop = _stop_after(token, len(out), max_new_tokens, eos_ids)
            if stop:
                break
        records.append(StepRecord(drafted=steps, accepted=accepted, emitted=accepted + 1, looked_up=tuple(looked_up)))
        # Keep root + accepted drafts in the target cache; the bonus is the next root.
        crop_cache(cache, verified_from + 1 + accepted)
        pending_ids, pending_aux = [*drafts[:accepted], best[accepted]], ver_aux[: accepted + 1]
        root = best[accepted]
    return Generation(out, time.perf_counter() - start, stop, records)


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """Stop tokens: the generation config's eos id(s) plus the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
