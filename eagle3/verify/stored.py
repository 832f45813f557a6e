"""What the hidden-state store already holds of a merged dataset (torch-free, read-only).

Extraction skips every sample a store's indexes list (``StoreWriter.done_ids``), so the gate prices only the
rest: a re-run over an existing store needs space and hours for its new samples, not for all of them again.
Only store.json and the index-*.json files are read (small JSON, also on s3), never a shard.
"""

from __future__ import annotations

from eagle3 import storage
from eagle3.extract.store_format import is_store, read_indexes, read_store_json, store_dirs, store_key


def run_store(cfg) -> tuple[str | None, str]:
    """The store folder extraction fills for this run under ``cfg.store`` (or None), and how it was found."""
    if not cfg.store:
        return None, "no store given"
    if not cfg.model:
        return None, "no target model given, so no store key"
    from eagle3.target import config_int, model_fingerprint, read_config, resolve_aux_layers, resolve_model

    # the aux layers as extract resolves them (eagle3.extract.served): config.json only, no weights
    aux_layers = resolve_aux_layers(list(cfg.aux_layers) if cfg.aux_layers else None,
                                    config_int(read_config(cfg.model), "num_hidden_layers", cfg.model), cfg.model)
    fp = None if storage.is_s3(cfg.model) else model_fingerprint(resolve_model(cfg.model), compute=False)
    if fp:  # hashed on this machine before (an extract or train task ran here)
        key = store_key(fp, aux_layers, cfg.storage_option)
        uri = storage.join(cfg.store, key)
        return (uri, f"store {key}") if is_store(uri) else (None, f"no store {key} yet")
    # The fingerprint hashes the weights, which the gate would have to read (an s3 target's: download) on this
    # CPU worker, a 1 TB target's for many minutes: match the store by the model name, layers and option its
    # store.json records instead.
    found = [d for d in store_dirs(cfg.store) if _describes(read_store_json(d), cfg.model, aux_layers,
                                                             cfg.storage_option)]
    if len(found) == 1:
        key = found[0].rsplit("/", 1)[-1]
        return found[0], f"store {key} (matched by model name: the target's fingerprint needs its weights hashed)"
    return None, ("no store of this model name, aux layers and option yet" if not found else
                  f"{len(found)} stores of this model name (its weights changed?): none counted")


def _describes(info: dict, model: str, aux_layers: list[int], storage_option: str) -> bool:
    return (info.get("model_name") == model and list(info.get("aux_layers") or []) == list(aux_layers)
            and info.get("storage_option") == storage_option)


def stored_ids(cfg) -> tuple[set[str], str | None, str]:
    """(ids the store of this run holds, its folder or None, a few words on how it was found)."""
    uri, how = run_store(cfg)
    return (set(read_indexes(uri)[1]) if uri else set()), uri, how
