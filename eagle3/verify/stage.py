"""The verify gate: re-read what `eagle3 merge` wrote and check it before extraction.

Every check is recorded with its numbers in MERGED/verify.json, which is
written whether the gate passes or not; a failed check raises GateFailed (the
CLI exits non-zero, the DAG fails without retry). Checks:
  checksums          files match the sha256 in manifest.json
  accounting         per source: samples/tokens/loss tokens in = out + cut + dropped,
                     recomputed from the prepared Parquet and from train.parquet
  lengths            every sample has at most max_seq_len tokens; num_tokens is right
  masks              loss_mask only 0/1, as long as input_ids, >= 1 loss token, num_loss_tokens right
  ids                ids unique and equal to the content hash of each row
  matches_source     each sample equals its prepared source sample truncated (lookup by source_id)
  shuffled           output order is not the input order
  uniform_positions  per source, positions are uniform over the file (Kolmogorov-Smirnov)
  reproducible       re-running the seeded permutation gives the same order and content hash
  extraction_space   estimated hidden-state bytes (and hours, at the engine's rate measured by earlier runs) of
                     the samples the store does not hold yet (extract skips the others) fit the free space at the
                     store (and max_hours); online training waives the space, not max_hours
  memory             the target fits the extraction engine, one longest sample fits a training device; the
                     training token budget that fits (eagle3.verify.sizing, eagle3.memory)
  expectations, totals, dropped_datasets: what this run asked for (eagle3.verify.expectations)

Example:
  eagle3 verify --merged MERGED --model smollm2-135m-instruct --storage-option fp8 --store STORE --tokens-per-s 3000
"""

from __future__ import annotations

import hashlib
import logging
import math

import numpy as np

from eagle3 import layout, storage, storage_options
from eagle3.errors import GateFailed, InputError
from eagle3.verify import sizing, stored
from eagle3.verify.config import VerifyConfig
from eagle3.verify.expectations import expectation_checks
from eagle3.merge.arrays import content_id, list_parts, read_batches, segment_sums, shuffle_order

log = logging.getLogger(__name__)


def ks_uniform(u: np.ndarray) -> tuple[float, float]:
    """One-sample Kolmogorov-Smirnov test of u against Uniform(0, 1): (D, p-value).

    The p-value uses the asymptotic Kolmogorov distribution with Stephens'
    small-sample correction; scipy is not needed.
    """
    n = len(u)
    u = np.sort(u)
    i = np.arange(1, n + 1)
    d = float(max((i / n - u).max(), (u - (i - 1) / n).max()))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    k = np.arange(1, 101)
    p = 2 * np.sum((-1.0) ** (k - 1) * np.exp(-2 * k**2 * lam**2))
    return d, float(min(max(p, 0.0), 1.0))


def _check(name: str, passed: bool, detail: str, **numbers) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail, **numbers}


BATCH_ROWS = 1024
"""Rows read at a time from train.parquet and the prepared files (merge's batch_rows). The checks keep per-row
numbers only, so memory follows a batch, not the dataset (a whole list<int32> column past 2^31 tokens cannot even
be concatenated: Arrow's "offset overflow")."""


class _Output:
    """train.parquet read one record batch at a time into what the checks need: per-row columns, lengths, loss
    sums and content hashes; the tokens themselves are not kept."""

    def __init__(self, path: str):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering would read every column chunk at once
        need = {"id", "input_ids", "loss_mask", "num_tokens", "num_loss_tokens", "source", "source_id"}
        if not need <= set(pf.schema_arrow.names):
            raise GateFailed(f"{path}: columns {sorted(need - set(pf.schema_arrow.names))} missing; re-run "
                             "`eagle3 merge`")
        cols = {k: [] for k in ("id", "source", "source_id", "num_tokens", "num_loss", "lens", "mask_lens", "loss")}
        self.hash, self.bad_mask_values = [], 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=sorted(need)):
            ioff, ids = list_parts(batch.column("input_ids"), np.int32)
            moff, mask = list_parts(batch.column("loss_mask"), np.uint8)
            used = mask[moff[0]:moff[-1]]
            self.bad_mask_values += int(((used != 0) & (used != 1)).sum())
            cols["lens"].append(np.diff(ioff))
            cols["mask_lens"].append(np.diff(moff))
            cols["loss"].append(segment_sums(mask, moff))
            self.hash += [content_id(ids[ioff[r]:ioff[r + 1]], mask[moff[r]:moff[r + 1]])
                          for r in range(batch.num_rows)]
            for name in ("id", "source", "source_id"):
                cols[name] += batch.column(name).to_pylist()
            cols["num_tokens"].append(batch.column("num_tokens").to_numpy())
            cols["num_loss"].append(batch.column("num_loss_tokens").to_numpy())
        for name in ("id", "source", "source_id"):
            setattr(self, name, np.array(cols[name], dtype=object))
        for name in ("num_tokens", "num_loss", "lens", "mask_lens", "loss"):
            setattr(self, name, np.concatenate(cols[name]) if cols[name] else np.zeros(0, np.int64))
        self.hash = np.array(self.hash, dtype=object)
        self.n = len(self.id)

    def key(self, r: int) -> tuple:
        """What matches_source compares: the row's lengths and content hash (equal hashes, equal tokens)."""
        return int(self.lens[r]), int(self.mask_lens[r]), self.hash[r]


def _prepared(uri: str, L: int, wanted: set) -> tuple[dict, dict]:
    """One prepared file, batch by batch: its accounting numbers, and {id: (row, key)} of the rows in ``wanted``
    (the ``_Output.key`` the row has cut to L)."""
    got = {"samples_in": 0, "tokens_in": 0, "tokens_cut": 0, "loss_tokens_in": 0, "loss_tokens_cut": 0}
    index, row = {}, 0
    for batch in read_batches(uri, BATCH_ROWS):
        off, vals = list_parts(batch.column("input_ids"), np.int32)
        moff, mvals = list_parts(batch.column("loss_mask"), np.uint8)
        lens, used = np.diff(off), mvals[moff[0]:moff[-1]]
        # loss tokens past the cut: position-in-row >= L (a different method from merge's gather)
        pos_in_row = np.arange(moff[-1] - moff[0]) - np.repeat(moff[:-1] - moff[0], np.diff(moff))
        got["samples_in"] += batch.num_rows
        got["tokens_in"] += int(lens.sum())
        got["tokens_cut"] += int(np.maximum(lens - L, 0).sum())
        got["loss_tokens_in"] += int(used.sum())
        got["loss_tokens_cut"] += int(used[pos_in_row >= L].sum())
        for i, sid in enumerate(batch.column("id").to_pylist()):
            if sid in wanted:  # a repeated id: its last row, as in a lookup of every row
                n = min(int(lens[i]), L)
                ids, mask = vals[off[i]:off[i] + n], mvals[moff[i]:moff[i] + n]
                index[sid] = (row + i, (len(ids), len(mask), content_id(ids, mask)))
        row += batch.num_rows
    return got, index


def _source_checks(out: _Output, man: dict, prepared: str | None) -> tuple[list, dict]:
    """accounting + matches_source, one prepared file at a time; also returns input ranks."""
    L = man["max_seq_len"]
    problems, mismatches, numbers, rank = [], 0, {}, {}
    base = 0
    for name in sorted(man["sources"]):
        rec = man["sources"][name]
        sel = np.flatnonzero(out.source == name)
        counted, index = _prepared(storage.join(prepared, name, layout.PREPARED_PARQUET) if prepared else rec["file"],
                                   L, set(out.source_id[sel]))
        got = {"samples_in": counted["samples_in"], "samples_out": len(sel), "tokens_in": counted["tokens_in"],
               "tokens_out": int(out.num_tokens[sel].sum()), "tokens_cut": counted["tokens_cut"],
               "loss_tokens_in": counted["loss_tokens_in"], "loss_tokens_out": int(out.num_loss[sel].sum()),
               "loss_tokens_cut": counted["loss_tokens_cut"]}
        dropped = rec.get("dropped", {})
        drops_listed = sum(1 for d in man.get("drops", []) if d["source"] == name)
        balance = {
            "samples": got["samples_in"] - got["samples_out"] - sum(dropped.values()),
            "tokens": got["tokens_in"] - got["tokens_out"] - got["tokens_cut"] - sum(rec["dropped_tokens"].values()),
            "loss_tokens": got["loss_tokens_in"] - got["loss_tokens_out"] - got["loss_tokens_cut"]
            - sum(rec["dropped_loss_tokens"].values()),
            "drops_listed": drops_listed - sum(dropped.values()),
        }
        for key in ("samples_in", "samples_out", "tokens_in", "tokens_out", "loss_tokens_in", "loss_tokens_out"):
            if rec[key] != got[key]:
                problems.append(f"{name}.{key}: manifest {rec[key]} vs recomputed {got[key]}")
        problems += [f"{name}: {k} off by {v}" for k, v in balance.items() if v]
        numbers[name] = {**got, "imbalance": balance}
        for r in sel:
            hit = index.get(out.source_id[r])
            if hit is None:
                mismatches += 1
                continue
            rank[r] = base + hit[0]
            if out.key(r) != hit[1]:
                mismatches += 1
        base += got["samples_in"]
    unknown = sorted(set(out.source) - set(man["sources"]))
    if unknown:
        problems.append(f"rows from sources not in the manifest: {unknown}")
    checks = [
        _check("accounting", not problems, "; ".join(problems[:10]) or
               "per source: in = out + cut by truncation + dropped, for samples, tokens and loss tokens",
               sources=numbers),
        _check("matches_source", mismatches == 0,
               f"{mismatches} of {out.n} samples differ from their prepared source truncated to {L}"
               if mismatches else f"all {out.n} samples equal their source truncated to {L}", mismatches=mismatches),
    ]
    return checks, rank


def _row_checks(out: _Output, L: int) -> list:
    lens = out.lens
    too_long = int((lens > L).sum())
    bad_num = int((lens != out.num_tokens).sum())
    bad_vals = out.bad_mask_values
    bad_len = int((lens != out.mask_lens).sum())
    no_loss = int((out.loss == 0).sum())
    bad_numloss = int((out.loss != out.num_loss).sum())
    bad_ids = int((out.hash != out.id).sum()) if bad_len == 0 else out.n
    dup = out.n - len(set(out.id))
    return [
        _check("lengths", too_long == 0 and bad_num == 0,
               f"{too_long} samples longer than max_seq_len {L}; {bad_num} num_tokens wrong; max length "
               f"{int(lens.max()) if out.n else 0}", too_long=too_long, bad_num_tokens=bad_num),
        _check("masks", bad_vals == bad_len == no_loss == bad_numloss == 0,
               f"{bad_vals} mask values not 0/1; {bad_len} masks of another length than their ids; "
               f"{no_loss} samples without loss tokens; {bad_numloss} num_loss_tokens wrong",
               bad_values=bad_vals, bad_lengths=bad_len, no_loss=no_loss, bad_num_loss_tokens=bad_numloss),
        _check("ids", bad_ids == 0 and dup == 0,
               f"{dup} duplicate ids; {bad_ids} ids that are not the content hash of their row",
               duplicates=dup, bad_ids=bad_ids),
    ]


def _order_checks(out: _Output, man: dict, rank: dict, p_threshold: float) -> list:
    n = out.n
    ranks = np.array([rank.get(r, -1) for r in range(n)])
    in_order = float(np.mean(np.diff(ranks) > 0)) if n > 1 else 1.0
    monotone = n >= 8 and bool((np.diff(ranks) > 0).all())
    checks = [_check("shuffled", not monotone,
                     f"share of neighbours in input order {in_order:.3f} (a uniform shuffle gives ~0.5)"
                     + ("; the output is in input order" if monotone else ""), in_order_share=in_order)]
    names = sorted(set(out.source))
    tested = {s: np.flatnonzero(out.source == s) for s in names}
    tested = {s: p for s, p in tested.items() if len(p) >= 5 and len(p) < n}
    alpha = p_threshold / max(len(tested), 1)
    results = {s: ks_uniform((p + 0.5) / n) for s, p in tested.items()}
    bad = {s: r for s, r in results.items() if r[1] < alpha}
    checks.append(_check(
        "uniform_positions", not bad,
        (f"positions not uniform for {', '.join(f'{s} (KS D={d:.3f}, p={p:.2g} < {alpha:.2g})' for s, (d, p) in bad.items())}"
         if bad else f"KS test of each source's positions against uniform: all p >= {alpha:.2g} "
         f"({len(tested)} sources tested)"),
        alpha=alpha, sources={s: {"n": len(tested[s]), "ks_d": d, "p_value": p} for s, (d, p) in results.items()}))
    try:
        cids = out.id.astype("S32")
        expected = cids[shuffle_order(cids, man["seed"])]
    except (ValueError, UnicodeEncodeError):  # an id that is no content hash: `ids` reports it
        cids = expected = np.array([str(x).encode() for x in out.id], dtype=object)
    differ = int((expected != cids).sum())
    h = hashlib.sha256()
    h.update(b"".join(bytes(c) + b"\n" for c in expected))
    same_hash = h.hexdigest() == man.get("content_hash")
    checks.append(_check("reproducible", differ == 0 and same_hash,
                         f"re-running the seed-{man['seed']} permutation: {differ} positions differ; content hash "
                         f"{'matches' if same_hash else 'differs from'} the manifest", positions_differ=differ,
                         content_hash=h.hexdigest()))
    return checks


def _stored(cfg: VerifyConfig, out: _Output) -> dict:
    """The samples of train.parquet that the store of this run already holds: extract skips them."""
    ids, uri, how = stored.stored_ids(cfg)
    have = np.fromiter((i in ids for i in out.id), bool, out.n)
    return {"store": uri, "how": how, "samples": int(have.sum()), "tokens": int(out.num_tokens[have].sum())}


def _space_check(cfg: VerifyConfig, tokens: int, samples: int, kept: dict) -> dict:
    """Bytes and hours of extracting what the store lacks (``kept``: what it holds, from ``_stored``)."""
    hidden = cfg.resolved_hidden_size()
    todo = tokens - kept["tokens"]
    engines = sizing.engine_hours(cfg, todo)
    rate = engines[cfg.target_engine]["tokens_per_s"]
    est = storage_options.extraction_estimate(cfg.storage_option, hidden, todo, samples - kept["samples"], rate)
    need, hours = est["bytes"], est["hours"]
    dest = cfg.store or cfg.merged
    free = storage.free_bytes(dest)
    fits = free is None or need * cfg.headroom <= free
    fast = cfg.max_hours is None or hours <= cfg.max_hours
    detail = (f"{todo} of {tokens} tokens to extract ({kept['samples']} of {samples} samples already stored: "
              f"{kept['how']}) x {est['bytes_per_token']} B/token ({cfg.storage_option}, H={hidden}) = "
              f"{need / 1e9:.3f} GB "
              f"(x{cfg.headroom} headroom) vs {'unknown (object store)' if free is None else f'{free / 1e9:.3f} GB'} "
              f"free at {dest}; ~{hours:.2f} h with {cfg.target_engine} at {rate:g} tok/s ("
              + "; ".join(f"{e}: {v['hours']:.2f} h at {v['tokens_per_s']:g} tok/s, {v['source']}"
                          for e, v in engines.items()) + ")")
    if not fits:
        detail += f"; short by {(need * cfg.headroom - free) / 1e9:.3f} GB"
    if not fast:
        detail += f"; over the max_hours limit of {cfg.max_hours} h by {hours - cfg.max_hours:.2f} h"
    return _check("extraction_space", fits and fast, detail, bytes_per_token=est["bytes_per_token"], bytes=need,
                  free_bytes=free, hours=hours, hidden_size=hidden, storage_option=cfg.storage_option,
                  tokens_per_s=rate, engine=cfg.target_engine, engines=engines, fits=fits, within_max_hours=fast,
                  samples=samples, stored_samples=kept["samples"], stored_tokens=kept["tokens"], store=kept["store"])


def training_mode(cfg: VerifyConfig, space: dict, tokens: int, samples: int) -> dict:
    """Offline or online (eagle3.verify.mode), with both modes' costs logged before anything runs. Online
    writes no store, so then the store's space no longer fails the gate; max_hours still does (online runs the
    target over the same new tokens, every epoch)."""
    from eagle3.verify import mode

    cost = mode.costs(cfg.storage_option, space["hidden_size"], tokens, samples, cfg.epochs, space["tokens_per_s"],
                      cfg.train_tokens_per_s, space["stored_tokens"], space["stored_samples"])
    verdict = mode.choose(cfg.training_mode, cost, space["free_bytes"], cfg.headroom, cfg.store or cfg.merged)
    for line in mode.describe(cost):
        log.info("verify cost %s", line)
    log.info("verify training mode: %s (%s)", verdict["mode"], verdict["reason"])
    if verdict["mode"] == "online" and not space["passed"]:
        if space["within_max_hours"]:
            space.update(passed=True, detail="not needed, training online (no store): " + space["detail"])
        else:
            space.update(detail="training online (no store), so only max_hours applies: " + space["detail"])
    return verdict


def run(cfg: VerifyConfig) -> dict:
    """Run every check on a merged folder, write verify.json, raise GateFailed if one fails.

    Returns the verify.json content.
    """
    man_uri = storage.join(cfg.merged, layout.MERGED_MANIFEST)
    if not storage.exists(man_uri):
        raise InputError(f"{man_uri} not found; run `eagle3 merge --out {cfg.merged}` first")
    man = storage.read_json(man_uri)
    checks = []
    bad_sums = [f for f, s in man.get("checksums", {}).items()
                if storage.sha256_problem(storage.join(cfg.merged, f), s)]
    checks.append(_check("checksums", not bad_sums, f"changed since merge: {bad_sums}" if bad_sums else
                         f"{len(man.get('checksums', {}))} files match manifest.json", changed=bad_sums))
    if layout.MERGED_PARQUET in bad_sums:  # the other checks would read a damaged file: stop at this one
        result = {"passed": False, "failed": ["checksums"], "samples": None, "tokens": None,
                  "content_hash": man.get("content_hash"), "checks": checks}
        storage.write_json(storage.join(cfg.merged, layout.VERIFY_RESULT), result)
        raise GateFailed(f"verify gate failed: checksums: {checks[-1]['detail']} (the other checks need an intact "
                         f"{layout.MERGED_PARQUET}: run `eagle3 merge --out {cfg.merged}` again)")
    out = _Output(storage.local_path(storage.join(cfg.merged, layout.MERGED_PARQUET)))
    if not out.n:
        raise InputError(f"{layout.MERGED_PARQUET} holds no samples: nothing to train on (see manifest.json's "
                         "totals.dropped for why merge dropped them)", file=cfg.merged)
    source_checks, rank = _source_checks(out, man, cfg.prepared)
    checks += _row_checks(out, man["max_seq_len"]) + source_checks
    checks += _order_checks(out, man, rank, cfg.p_threshold)
    space = _space_check(cfg, int(out.num_tokens.sum()), out.n, _stored(cfg, out))
    mode = training_mode(cfg, space, int(out.num_tokens.sum()), out.n)
    checks.append(space)
    longest = int(out.num_tokens.max()) if out.n else 0
    mem = sizing.memory_check(cfg, longest, man["max_seq_len"], mode["mode"] == "online")
    checks.append(mem)
    checks += expectation_checks(cfg, man, out.source)
    failed = [c for c in checks if not c["passed"]]
    result = {"passed": not failed, "failed": [c["name"] for c in failed], "samples": out.n,
              "tokens": int(out.num_tokens.sum()), "stored_samples": space["stored_samples"],
              "content_hash": man.get("content_hash"), "checks": checks,
              "training_mode": mode, "train_token_budget": mem["train_token_budget"]}
    storage.write_json(storage.join(cfg.merged, layout.VERIFY_RESULT), result)
    for c in checks:
        log.info("verify %-18s %s  %s", c["name"], "ok  " if c["passed"] else "FAIL", c["detail"])
    if failed:
        raise GateFailed("verify gate failed: " + " | ".join(f"{c['name']}: {c['detail']}" for c in failed))
    return result
