"""Atomic training checkpoints: safetensors + JSON only, no pickle.

Layout (docs/CONTRACTS.md)::

    CKPT/step-<n>/model.safetensors      trainable draft weights (fp32) + d2t/t2d
    CKPT/step-<n>/optimizer.safetensors  AdamW moments, "exp_avg.<param>", "exp_avg_sq.<param>", "step.<param>"
    CKPT/step-<n>/train_state.json       step, data position, micro_batch, grad_accum, RNG states, schedule
    CKPT/step-<n>/config.json            the draft config
    CKPT/latest.json                     {"step": n, "dir": "step-<n>"}, written last

A local step folder is written under a temporary name and renamed, then
``latest.json`` is replaced atomically, so a SIGKILL at any moment leaves
either the previous or the new checkpoint complete. On S3 the files of the
step folder are uploaded first and ``latest.json`` last, which gives the same
guarantee (a half-uploaded step folder is never pointed at).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# ---------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """torch / numpy / python RNG states as JSON-able lists."""
    import numpy as np
    import torch

    np_state = np.random.get_state()
    py_state = random.getstate()
    out = {
        "torch": torch.get_rng_state().tolist(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# ---------------------------------------------------------- optimizer state
def optimizer_tensors(optimizer, names: dict) -> tuple[dict, dict]:
    """Flatten an AdamW state into named tensors + JSON hyper-parameters.

    ``names`` maps each parameter object to its module name, so the file is
    readable and does not depend on parameter order.
    """
    import torch

    tensors = {}
    for p, st in optimizer.state.items():
        name = names[p]
        for key, value in st.items():
            t = value if torch.is_tensor(value) else torch.tensor(float(value))
            tensors[f"{key}.{name}"] = t.detach().to("cpu").contiguous().clone()
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [names[p] for p in g["params"]]}
              for g in optimizer.param_groups]
    return tensors, {"param_groups": json.loads(json.dumps(groups, default=_jsonable))}


def _jsonable(x):
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def load_optimizer(optimizer, tensors: dict, meta: dict, names: dict) -> None:
    """Inverse of :func:`optimizer_tensors`."""
    by_name = {n: p for p, n in names.items()}
    for p_name, p in by_name.items():
        st = {}
        for key in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            t = tensors.get(f"{key}.{p_name}")
            if t is not None:
                st[key] = t.to(p.device) if key != "step" else t.clone()
        if st:
            optimizer.state[p] = st
    for group, saved in zip(optimizer.param_groups, meta["param_groups"]):
        for k, v in saved.items():
            if k != "params" and k in group:
                group[k] = tuple(v) if isinstance(group[k], tuple) else v


# ----------------------------------------------------------------- save/load
def save(out: str, step: int, model: dict, optimizer: dict, state: dict, config: dict, keep: int = 2) -> str:
    """Write ``OUT/step-<n>`` atomically, point ``latest.json`` at it, keep the last ``keep``."""
    from safetensors.torch import save_file

    out = str(out)
    name = step_dir_name(step)
    state = dict(state, step=step)
    if storage.is_s3(out):
        with tempfile.TemporaryDirectory(prefix="eagle3-ckpt-") as tmp:
            _write_files(Path(tmp), model, optimizer, state, config, save_file)
            for f in sorted(Path(tmp).iterdir()):
                storage.put_file(f, storage.join(out, name, f.name))
    else:
        root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        final = root / name
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
        _write_files(tmp, model, optimizer, state, config, save_file)
        if final.exists():
            # Same step saved again (the OOM path re-saves the current step with a
            # smaller micro-batch): move the old folder aside first. A kill between
            # the two renames leaves latest.json dangling; load_latest then falls
            # back to the newest complete folder.
            trash = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".old.tmp", dir=root))
            os.rename(final, trash / name)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    storage.write_json(storage.join(out, LATEST), {"step": step, "dir": name})
    _prune(out, keep)
    return storage.join(out, name)


def _write_files(folder: Path, model, optimizer, state, config, save_file) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in model.items()}, str(folder / MODEL_FILE))
    save_file(optimizer, str(folder / OPTIMIZER_FILE))
    for fname, obj in ((STATE_FILE, state), (CONFIG_FILE, config)):
        (folder / fname).write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_steps(out: str) -> list[int]:
    """Steps of the complete step folders (temporary folders are ignored)."""
    steps = set()
    for rel in storage.list_files(out):
        top = rel.split("/")[0]
        if top.startswith("step-") and rel.endswith(STATE_FILE):
            steps.add(int(top[len("step-"):]))
    return sorted(steps)


def _prune(out: str, keep: int) -> None:
    latest = storage.read_json(storage.join(out, LATEST))["step"]
    steps = list_steps(out)
    old = [s for s in steps[: max(0, len(steps) - keep)] if s != latest]
    for s in old:
        d = storage.join(out, step_dir_name(s))
        if storage.is_s3(out):
            for rel in storage.list_files(d):
                storage.delete(storage.join(d, rel))
        else:
            shutil.rmtree(d, ignore_errors=True)
    if not storage.is_s3(out):  # leftovers of a killed save
        for tmp in Path(out).glob(".step-*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)


def latest_dir(out: str) -> str | None:
    """The step folder latest.json points at (None before the first save)."""
    uri = storage.join(str(out), LATEST)
    return storage.join(str(out), storage.read_json(uri)["dir"]) if storage.exists(uri) else None


def load_latest(out: str) -> Checkpoint | None:
    """The checkpoint ``latest.json`` points at, or None when there is none yet."""
    from safetensors.torch import load_file

    out = str(out)
    latest_uri = storage.join(out, LATEST)
    if not storage.exists(latest_uri):
        return None
    try:
        latest = storage.read_json(latest_uri)
        d = storage.join(out, latest["dir"])
    except (ValueError, KeyError) as e:
        raise InputError(f"unreadable checkpoint pointer ({e}); delete it to start over", file=latest_uri) from e
    step = int(latest["step"])
    if not storage.exists(storage.join(d, STATE_FILE)):  # killed mid re-save of the same step
        steps = list_steps(out)
        if not steps:
            return None
        step, d = steps[-1], storage.join(out, step_dir_name(steps[-1]))
    return Checkpoint(
        step=step,
        uri=d,
        model=load_file(storage.local_path(storage.join(d, MODEL_FILE))),
        optimizer=load_file(storage.local_path(storage.join(d, OPTIMIZER_FILE))),
        state=storage.read_json(storage.join(d, STATE_FILE)),
        config=storage.read_json(storage.join(d, CONFIG_FILE)),
    )
