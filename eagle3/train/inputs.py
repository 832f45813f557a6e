"""Everything a training run reads before its first step, checked up front.

Bad input raises InputError naming the file and the fix (exit code 2, never
retried): a missing store or vocab, a vocab map built for another vocabulary,
a target that is not the model the store was extracted from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from eagle3 import layout, storage
from eagle3.draft import DraftConfig
from eagle3.errors import InputError
from eagle3.extract.store_format import STORE_JSON, store_key
from eagle3.train import data
from eagle3.train.config import TrainConfig
from eagle3.train.source import SampleSource, StoreSource

log = logging.getLogger(__name__)


@dataclass
class TrainInputs:
    cfg: TrainConfig
    source: SampleSource  # the store (offline) or the target online
    target_dir: str
    draft_config: DraftConfig
    d2t: torch.Tensor
    t2d: torch.Tensor
    lengths: dict[str, int]
    train_ids: list[str]
    heldout_ids: list[str]

    def loss_mask(self, sample_id: str) -> torch.Tensor:
        """One sample's loss_mask read alone (not its hidden states): the loss denominators need only this."""
        return self.source.loss_mask(sample_id)

    def fresh_draft(self):
        from eagle3.draft import build_draft

        return build_draft(self.draft_config, self.target_dir, self.d2t, self.t2d, init=self.cfg.init,
                           seed=self.cfg.seed)

    def draft_from_checkpoint(self, ckpt):
        """The checkpoint's draft, with ITS d2t/t2d: an lm_head's rows mean something only under its own map."""
        from eagle3.draft import Eagle3Draft, load_target_embedding

        cfg = DraftConfig.from_dict(ckpt.config, where=storage.join(ckpt.uri, "config.json"))
        # The TrainConfig settings that shape a fresh draft; a resumed run keeps the checkpoint's (config.py).
        asked, held = ({"draft_variant": c.variant, "parallel_drafting": c.parallel_drafting,
                        "draft_window": c.sliding_window} for c in (self.draft_config, cfg))
        differ = [k for k in asked if asked[k] != held[k]]
        if differ:
            log.warning("%s holds a draft with %s; this run asked for %s and continues the checkpoint's draft "
                        "(train into a new --out for the other one)", ckpt.uri,
                        {k: held[k] for k in differ}, {k: asked[k] for k in differ})
        if not torch.equal(ckpt.model["d2t"], self.d2t):
            log.warning("%s holds another vocab map than %s; keeping the checkpoint's d2t/t2d",
                        ckpt.uri, self.cfg.vocab)
        return Eagle3Draft.from_state_dict(cfg, ckpt.model, load_target_embedding(self.target_dir))

    def target_head(self, device) -> torch.Tensor | None:
        """The target's lm_head [V,H] when the store keeps `last` states (None for top-k stores)."""
        from eagle3.draft import load_target_head
        from eagle3.storage_options import option

        if option(self.source.storage_option).target != "last":
            return None
        return load_target_head(self.target_dir).to(device)


def load_vocab(uri: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocab stage's (d2t, t2d) as torch tensors."""
    from eagle3.vocab import load_vocab as load

    d2t, t2d = load(uri)
    return torch.from_numpy(d2t), torch.from_numpy(t2d)


def store_key_of(cfg: TrainConfig) -> str | None:
    """Which store of a root to train on: the one extraction filled for this model, aux layers and option."""
    if not cfg.model:
        return None
    from eagle3.target import config_int, default_aux_layers, model_fingerprint, read_config, resolve_model

    aux_layers = cfg.aux_layers or default_aux_layers(config_int(read_config(cfg.model), "num_hidden_layers",
                                                                 cfg.model))
    return store_key(model_fingerprint(resolve_model(cfg.model)), list(aux_layers), cfg.storage_option)


def load_inputs(cfg: TrainConfig, device: str = "cpu") -> TrainInputs:
    """What the run trains on; with ``cfg.online`` the target is loaded on ``device`` (eagle3.train.online)."""
    from eagle3.extract.store import HiddenStateStore
    from eagle3.target import config_vocab_size, model_fingerprint, read_config, resolve_model

    if cfg.online:
        from eagle3.train.online import open_source

        store = open_source(cfg, device)
    else:
        store = StoreSource(HiddenStateStore(cfg.store, store_key_of(cfg)))
    d2t, t2d = load_vocab(cfg.vocab)
    name = cfg.model or store.info.get("model_name")
    if not name:
        raise InputError(f"{store.uri}/{STORE_JSON} names no model_name; pass --model")
    target_dir = resolve_model(name)
    target_cfg = read_config(target_dir)
    vocab_size = config_vocab_size(target_cfg, f"{target_dir}/config.json")
    if t2d.shape[0] != vocab_size:
        raise InputError(f"vocab map t2d has {t2d.shape[0]} entries but the target {name} has vocab_size "
                         f"{vocab_size}; rebuild the map for this target with `eagle3 vocab`", file=cfg.vocab)
    if int(store.info.get("vocab_size", vocab_size)) != vocab_size:
        raise InputError(f"store vocab_size {store.info['vocab_size']} != target {name} vocab_size {vocab_size}",
                         file=storage.join(store.uri, STORE_JSON))
    stored_fp = store.info.get("model_fingerprint")
    if stored_fp and stored_fp != model_fingerprint(target_dir):
        raise InputError(f"the store was extracted from model {stored_fp}, but --target {name} is "
                         f"{model_fingerprint(target_dir)}; pass the target the store was built from",
                         file=storage.join(store.uri, STORE_JSON))
    dcfg = DraftConfig.from_target(target_cfg, int(d2t.shape[0]), list(store.aux_layers), cfg.draft_variant,
                                   sliding_window=cfg.draft_window, parallel_drafting=cfg.parallel_drafting,
                                   target_model=name, target_fingerprint=stored_fp)
    if dcfg.hidden_size != int(store.hidden_size):
        raise InputError(f"store hidden_size {store.hidden_size} != target hidden_size {dcfg.hidden_size}",
                         file=storage.join(store.uri, STORE_JSON))
    ids = store.sample_ids()
    if cfg.merged:
        ids = _merged_ids(cfg.merged, store)
    if not ids:
        raise InputError(f"the store {store.uri} holds no samples; run `eagle3 extract` first")
    store.check(ids)  # sha256 of every shard it reads, before the first step
    lengths = {sid: store.num_tokens(sid) for sid in ids}
    train_ids, heldout = data.heldout_split(ids, cfg.heldout_share)
    if not train_ids:  # a few samples, all hashed into the held-out split: nothing to train on
        raise InputError(f"all {len(ids)} samples fell into the held-out split (heldout_share {cfg.heldout_share}); "
                         "train on more samples, or pass --heldout-share 0")
    return TrainInputs(cfg, store, target_dir, dcfg, d2t, t2d, lengths, train_ids, heldout)


def _merged_ids(merged: str, store) -> list[str]:
    """The sample ids of MERGED/train.parquet, all of which the store must hold."""
    import pyarrow.parquet as pq

    path = storage.join(merged, layout.MERGED_PARQUET)
    if not storage.exists(path):
        raise InputError(f"no merged dataset at {path}; run `eagle3 merge --out {merged}` first")
    ids = [str(x) for x in pq.read_table(storage.local_path(path), columns=["id"]).column("id").to_pylist()]
    missing = [sid for sid in ids if sid not in store]
    if missing:
        raise InputError(f"{len(missing)} of {len(ids)} samples of {path} are not in the store {store.uri} "
                         f"(first: {missing[0]}); run `eagle3 extract --merged {merged}` to add them")
    return ids
