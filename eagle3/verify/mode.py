"""Offline or online training: what each costs, and which one a run takes (torch-free).

Offline extracts the hidden-state store once (bytes on disk, hours of target forward),
then trains every epoch from it. Online writes no store and runs the target's forward
inside training, once per sample per epoch. Both skip the samples the store already holds
(extract does not redo them; online reads them from the store). With E epochs, N tokens of
which S already stored, extraction speed X tok/s (the target's forward) and draft training
speed D tok/s::

    offline  bytes = storage_options.store_bytes(N-S ...)   hours = (N-S)/X + E*N/D
    online   bytes = 0                                      hours = E*(N-S)/X + E*N/D

``auto`` takes offline when the store fits the destination's free space with the gate's
headroom, online otherwise; the verdict says why. A destination whose free space is
unknown (an object store) counts as fitting.
"""

from __future__ import annotations

from eagle3 import storage_options
from eagle3.errors import InputError

MODES = ("offline", "online", "auto")
DEFAULT = "offline"
DEFAULT_TRAIN_TOKENS_PER_S = 50_000.0
"""Draft training speed the hour estimates assume unless told (one decoder layer with TTT, one GPU)."""


def check_mode(mode: str, where: str = "training_mode") -> str:
    if mode not in MODES:
        raise InputError(f"{where}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def costs(storage_option: str, hidden_size: int, tokens: int, samples: int, epochs: int,
          extract_tokens_per_s: float, train_tokens_per_s: float, stored_tokens: int = 0,
          stored_samples: int = 0) -> dict:
    """Bytes and hours of both modes for ``epochs`` passes over ``tokens`` tokens in ``samples`` samples, of which
    ``stored_tokens`` in ``stored_samples`` the store already holds (the target computes only the rest)."""
    new_tokens = tokens - stored_tokens
    est = storage_options.extraction_estimate(storage_option, hidden_size, new_tokens, samples - stored_samples,
                                              extract_tokens_per_s)
    train_h = epochs * tokens / train_tokens_per_s / 3600
    target_h = epochs * new_tokens / extract_tokens_per_s / 3600
    return {
        "epochs": epochs, "tokens": tokens, "samples": samples, "stored_tokens": stored_tokens,
        "stored_samples": stored_samples, "extract_tokens_per_s": extract_tokens_per_s,
        "train_tokens_per_s": train_tokens_per_s,
        "offline": {"bytes": est["bytes"], "bytes_per_token": est["bytes_per_token"],
                    "storage_option": storage_option, "extract_hours": est["hours"], "train_hours": train_h,
                    "hours": est["hours"] + train_h},
        "online": {"bytes": 0, "target_hours": target_h, "train_hours": train_h, "hours": target_h + train_h},
    }


def choose(requested: str, cost: dict, free_bytes: int | None, headroom: float, dest: str) -> dict:
    """The mode a run takes, and why: {"mode", "requested", "reason", "costs"}."""
    check_mode(requested)
    need = cost["offline"]["bytes"] * headroom
    fits = free_bytes is None or need <= free_bytes
    note = stored_note(cost)
    space = (f"the store needs {need / 1e9:.3f} GB (x{headroom} headroom{f'; {note}' if note else ''}), "
             + ("free space unknown (object store)" if free_bytes is None else f"{free_bytes / 1e9:.3f} GB free")
             + f" at {dest}")
    if requested != "auto":
        mode, reason = requested, f"requested; {space}"
    elif fits:
        mode, reason = "offline", f"auto: {space}, so the store fits"
    else:
        mode, reason = "online", f"auto: {space}, so the store does not fit; the target runs inside training"
    saved = cost["offline"]["hours"] - cost["online"]["hours"]
    reason += (f"; offline {cost['offline']['hours']:.2f} h + {cost['offline']['bytes'] / 1e9:.3f} GB, "
               f"online {cost['online']['hours']:.2f} h ({'+' if saved < 0 else '-'}{abs(saved):.2f} h)")
    return {"mode": mode, "requested": requested, "fits": fits, "reason": reason, "costs": cost}


def stored_note(cost: dict) -> str:
    """The words "M of N samples already stored", or "" when the store holds none of them."""
    return f"{cost['stored_samples']} of {cost['samples']} samples already stored" if cost["stored_samples"] else ""


def describe(cost: dict) -> list[str]:
    """Two lines for the log, one per mode."""
    off, on = cost["offline"], cost["online"]
    return [
        f"offline: extract {cost['tokens'] - cost['stored_tokens']} tokens"
        f"{f' ({stored_note(cost)})' if cost['stored_samples'] else ''} x {off['bytes_per_token']} B/token "
        f"({off['storage_option']}) = {off['bytes'] / 1e9:.3f} GB in {off['extract_hours']:.2f} h at "
        f"{cost['extract_tokens_per_s']:g} tok/s, then train {cost['epochs']} epoch(s) in "
        f"{off['train_hours']:.2f} h = {off['hours']:.2f} h",
        f"online:  no store; train {cost['epochs']} epoch(s) with the target's forward each epoch: "
        f"{on['target_hours']:.2f} h target + {on['train_hours']:.2f} h draft = {on['hours']:.2f} h",
    ]
