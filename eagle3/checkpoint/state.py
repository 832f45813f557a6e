"""What a checkpoint keeps besides the weights: RNG states and the AdamW state, as JSON and named tensors."""

from __future__ import annotations

import json
import random
from typing import Any


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
