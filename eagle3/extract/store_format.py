"""The hidden-state store's file rules, torch-free: what its files are called, what store.json must agree on,
and how the per-task indexes are read. The writer and reader (eagle3.extract.store), online training's
write-back (eagle3.train.online) and the UI's report tab (plugins/eagle3_report) all use these; the layout is
documented in eagle3/extract/store.py and docs/CONTRACTS.md "Hidden-state store".
"""

from __future__ import annotations

from eagle3 import storage as st
from eagle3.config import renamed_keys
from eagle3.errors import InputError
from eagle3.storage_options import option

FORMAT = "eagle3-hidden-states/1"
STORE_JSON = "store.json"
IDENTITY = ("format", "model_fingerprint", "aux_layers", "hidden_size", "vocab_size", "storage_option")
"""The store.json keys every writer of one store folder must agree on (the rest describe how it was computed)."""


def engine_quantization(info: dict) -> str | None:
    """The server's runtime --quantization (e.g. fp8) of the engine that filled a store (store.json's or an
    index entry's ``engine``): it changes the target, so one store holds one. None: the checkpoint as it is
    (the vllm and sglang engines always record the key; the transformers engine, and stores from before
    engines were recorded, never quantize)."""
    return (info.get("engine") or {}).get("quantization")


def store_key(model_fp: str, aux_layers: list[int], storage_option: str) -> str:
    """Folder name of one store: model fingerprint, aux layer ids and storage option (unchanged by the rename of
    store.json's keys: existing stores keep their folders)."""
    return f"{model_fp}-L{'_'.join(str(i) for i in aux_layers)}-{option(storage_option).name}"


def read_store_json(uri: str) -> dict:
    """A store folder's store.json. One written before the keys were renamed (``layers``, ``storage``) reads
    with the new names (``aux_layers``, ``storage_option``) and a deprecation message."""
    path = st.join(uri, STORE_JSON)
    return upgraded_store_json(st.read_json(path), path)


def upgraded_store_json(info: dict, path: str) -> dict:
    """store.json's content ``info`` (read from ``path``) under the keys' current names (eagle3.config.RENAMED)."""
    return renamed_keys(info, IDENTITY, path,
                        fix="re-run `eagle3 extract` on this store, which rewrites the file, or rename the key there")


def index_name(task: str) -> str:
    return f"index-{task}.json"


def is_index_name(name: str) -> bool:
    """An index file directly in a store folder (``name`` relative to it)."""
    return "/" not in name and name.startswith("index-") and name.endswith(".json")


def shard_name(task: str, seq: int) -> str:
    return f"shard-{task}-{seq:05d}.safetensors"


def shard_seq(name: str) -> int:
    """The sequence number in a shard's name (:func:`shard_name`)."""
    return int(name.rsplit("-", 1)[1].split(".")[0])


def adapt_name(task: str) -> str:
    """Written after an out-of-memory: the token budget the task's next run uses."""
    return f"adapt-{task}.json"


def is_store(uri: str) -> bool:
    return st.exists(st.join(uri, STORE_JSON))


def identity_diff(stored: dict, wanted: dict) -> dict:
    """{key: (stored, wanted)} for the identity keys on which two store.json documents differ."""
    return {k: (stored.get(k), wanted.get(k)) for k in IDENTITY if stored.get(k) != wanted.get(k)}


def read_indexes(uri: str) -> tuple[dict, dict]:
    """All index-*.json of a store -> ({shard: entry}, {sample_id: (shard, position)}).

    Tasks are read in name order, so a sample stored twice resolves the same way every time.
    """
    shards, where = {}, {}
    for name in sorted(st.list_files(uri)):
        if not is_index_name(name):
            continue
        for shard, entry in sorted(st.read_json(st.join(uri, name)).items()):
            shards[shard] = entry
            for i, sid in enumerate(entry["sample_ids"]):
                where.setdefault(sid, (shard, i))
    return shards, where


def store_dirs(root: str) -> list[str]:
    """The store folders directly under ``root`` (or ``root`` itself when it is one)."""
    if is_store(root):
        return [root]
    names = st.list_files(root)
    keys = sorted({n.rsplit("/", 1)[0] for n in names if n.count("/") == 1 and n.endswith("/" + STORE_JSON)})
    return [st.join(root, k) for k in keys]


def resolve_store_dir(uri: str, key: str | None = None) -> str:
    """A store key folder, given itself, or a root and the key (:func:`store_key`) of the store wanted in it,
    or a root that holds exactly one store."""
    if is_store(uri):
        return uri
    keys = [d.rsplit("/", 1)[-1] for d in store_dirs(uri)]
    if key is not None:
        if key in keys:
            return st.join(uri, key)
        raise InputError(f"no hidden-state store {key} under {uri} (it holds {', '.join(keys) or 'none'}); run "
                         "`eagle3 extract` for this model, aux layers and storage option first")
    if len(keys) == 1:
        return st.join(uri, keys[0])
    if not keys:
        raise InputError(f"no hidden-state store at {uri}: expected {STORE_JSON} there or in one subfolder; "
                         "run `eagle3 extract --out` first")
    raise InputError(f"{uri} holds several stores ({', '.join(keys)}); pass one of those folders")
