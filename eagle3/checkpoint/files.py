"""Atomic training checkpoints: safetensors + JSON only, no pickle.

Layout (docs/CONTRACTS.md)::

    CKPT/step-<n>/model.safetensors      trainable draft weights (fp32) + d2t/t2d
    CKPT/step-<n>/optimizer.safetensors  AdamW moments, "exp_avg.<param>", "exp_avg_sq.<param>", "step.<param>"
    CKPT/step-<n>/train_state.json       step, data position, token_budget, grad_accum, RNG states, schedule,
                                         "checksums" (the sha256 of the two safetensors, checked on every read)
    CKPT/step-<n>/config.json            the draft config
    CKPT/latest.json                     {"step": n, "dir": "step-<n>"}, written last

A local step folder is written under a temporary name and renamed
(:func:`eagle3.storage.atomic_dir`), then ``latest.json`` is replaced atomically,
so a SIGKILL at any moment leaves either the previous or the new checkpoint
complete. On S3 the files of the step folder are uploaded first and
``latest.json`` last, which gives the same guarantee (a half-uploaded step
folder is never pointed at). A step folder is complete when it holds all four
files; every reader finds steps through :func:`list_steps`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

from eagle3 import storage
from eagle3.errors import InputError

LATEST = "latest.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "train_state.json"
CONFIG_FILE = "config.json"


@dataclass
class Checkpoint:
    """A loaded checkpoint: tensors on CPU plus the JSON state."""

    step: int
    uri: str  # the step folder
    model: dict  # name -> tensor
    optimizer: dict  # flattened name -> tensor
    state: dict  # train_state.json
    config: dict  # config.json


STEP_PREFIX = "step-"
FILES = (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, CONFIG_FILE)


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def _step_of(folder: str) -> int | None:
    tail = folder[len(STEP_PREFIX):]
    return int(tail) if folder.startswith(STEP_PREFIX) and tail.isdigit() else None


# ----------------------------------------------------------------- save/load
def save(out: str, step: int, model: dict, optimizer: dict, state: dict, config: dict, keep: int = 2) -> str:
    """Write ``OUT/step-<n>`` atomically, point ``latest.json`` at it, keep the last ``keep``.

    Saving a step that exists (the OOM path re-saves the current step with a smaller micro-batch)
    replaces it in one atomic swap (`storage.atomic_dir`); where the filesystem cannot swap, a kill in between
    leaves latest.json pointing at a missing folder, and :func:`latest_step_dir` then takes the newest
    complete one.
    """
    from safetensors.torch import save_file

    out = str(out)
    name = step_dir_name(step)
    with storage.atomic_dir(storage.join(out, name)) as folder:
        save_file({k: v.detach().cpu().contiguous() for k, v in model.items()}, str(folder / MODEL_FILE))
        save_file(optimizer, str(folder / OPTIMIZER_FILE))
        sums = {f: storage.sha256_file(folder / f) for f in (MODEL_FILE, OPTIMIZER_FILE)}
        for fname, obj in ((STATE_FILE, dict(state, step=step, checksums=sums)), (CONFIG_FILE, config)):
            (folder / fname).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    storage.write_json(storage.join(out, LATEST), {"step": step, "dir": name})
    _prune(out, keep)
    return storage.join(out, name)


def list_steps(out: str) -> list[int]:
    """Steps of the complete step folders: every file of FILES present (temporary folders never count)."""
    seen: dict[int, set[str]] = {}
    for rel in storage.list_files(out):
        parts = rel.split("/")
        step = _step_of(parts[0]) if len(parts) == 2 else None
        if step is not None:
            seen.setdefault(step, set()).add(parts[1])
    return sorted(step for step, names in seen.items() if set(FILES) <= names)


def _prune(out: str, keep: int) -> None:
    latest = storage.read_json(storage.join(out, LATEST))["step"]
    steps = list_steps(out)
    for s in [s for s in steps[: max(0, len(steps) - keep)] if s != latest]:
        d = storage.join(out, step_dir_name(s))
        if storage.is_s3(out):
            for rel in storage.list_files(d):
                storage.delete(storage.join(d, rel))
        else:
            shutil.rmtree(d, ignore_errors=True)
    storage.sweep_tmp(out)  # leftovers of a killed save (never a live run's)


def latest_step_dir(out: str) -> str | None:
    """The step folder to resume from or export: the one latest.json points at when it is complete, else
    the newest complete one (a kill while re-saving a step); None before the first save."""
    out = str(out)
    steps = list_steps(out)
    pointer = storage.join(out, LATEST)
    if storage.exists(pointer):
        try:
            latest = storage.read_json(pointer)
            step = _step_of(str(latest["dir"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"unreadable checkpoint pointer ({e}); delete it to start over", file=pointer) from e
        if step in steps:
            return storage.join(out, step_dir_name(step))
    return storage.join(out, step_dir_name(steps[-1])) if steps else None


def resolve_step(checkpoint: str, step: int | None = None) -> str:
    """The step folder a reader (export, evaluate) uses: CKPT/step-<step>, the latest complete one of CKPT,
    or CKPT itself when it is one step folder."""
    checkpoint = str(checkpoint)
    if step is not None:
        if step not in list_steps(checkpoint):
            raise InputError(f"{checkpoint} has no complete {step_dir_name(step)} folder; complete steps: "
                             f"{list_steps(checkpoint)}")
        return storage.join(checkpoint, step_dir_name(step))
    found = latest_step_dir(checkpoint)
    if found is not None:
        return found
    if all(storage.exists(storage.join(checkpoint, f)) for f in (MODEL_FILE, CONFIG_FILE)):
        return checkpoint
    raise InputError(f"{checkpoint} holds no complete checkpoint (no {STEP_PREFIX}<n>/ folder with "
                     f"{', '.join(FILES)}) and is no step folder itself; pass the train stage's out folder")


def _tensors(step_dir: str, name: str, state: dict | None) -> dict:
    """One safetensors file of a step folder, checked against the sha256 its train_state.json records (a
    checkpoint written before checksums were recorded is read unchecked, but a file that does not parse is
    still named)."""
    from safetensors.torch import load_file

    from eagle3.errors import DamagedFile

    uri = storage.join(step_dir, name)
    hint = ("export an earlier step (--step N), or move this step folder aside so that a resume starts from "
            "the one before it")
    local = storage.check_sha256(uri, ((state or {}).get("checksums") or {}).get(name), hint, STATE_FILE)
    try:
        return load_file(local)
    except Exception as e:  # safetensors' errors (a cut or damaged header) share no base class but Exception
        raise DamagedFile(f"not a readable safetensors file ({e}); {hint}", file=uri) from None


def load_latest(out: str) -> Checkpoint | None:
    """The checkpoint to resume from (see :func:`latest_step_dir`), or None when there is none yet."""
    d = latest_step_dir(out)
    if d is None:
        return None
    state = storage.read_json(storage.join(d, STATE_FILE))
    return Checkpoint(step=int(state["step"]), uri=d, model=_tensors(d, MODEL_FILE, state),
                      optimizer=_tensors(d, OPTIMIZER_FILE, state), state=state,
                      config=storage.read_json(storage.join(d, CONFIG_FILE)))


def read_step(step_dir: str) -> tuple[dict, dict]:
    """(config.json, {name: tensor}) of one step folder: what export and evaluate need."""
    state_uri = storage.join(step_dir, STATE_FILE)
    state = storage.read_json(state_uri) if storage.exists(state_uri) else None
    return storage.read_json(storage.join(step_dir, CONFIG_FILE)), _tensors(step_dir, MODEL_FILE, state)
