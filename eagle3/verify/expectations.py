"""The gate's expectation checks: the merged folder is the one this run asked for, and its figures add up.

Without them a stale merge (another seed, max_seq_len or drop list, left by an older run) passes a re-run's
gate, because every other check compares the folder only with itself. Checks:
  expectations     manifest seed, max_seq_len, dropped datasets and merged sources equal what the run asked
                   for (VerifyConfig.expect_*; a field left None is not checked, and the check records it so)
  totals           manifest totals equal the sum of its per-source figures, and train.parquet's row count
  dropped_datasets a dataset on the drop list has no row in train.parquet, and if the manifest still lists
                   it under its sources, there with no output
"""

from __future__ import annotations

from collections import Counter

from eagle3.verify.config import VerifyConfig

TOTAL_KEYS = ("samples_in", "samples_out", "tokens_in", "tokens_out", "loss_tokens_in", "loss_tokens_out")


def _check(name: str, passed: bool, detail: str, **numbers) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail, **numbers}


def expected_datasets(cfg: VerifyConfig) -> tuple[set[str] | None, set[str] | None]:
    """(expected merged sources, expected drop list); None where the run did not say.

    The manifest (the datasets a run merges, some marked ``drop: true``) is resolved the way merge resolves
    it (eagle3.merge.config.MergeConfig.resolved), so the two never disagree on what was asked for."""
    if cfg.expect_manifest is None and cfg.expect_drop is None and cfg.expect_sources is None:
        return None, None
    drop = set(cfg.expect_drop or ())
    sources = set(cfg.expect_sources) if cfg.expect_sources is not None else None
    if cfg.expect_manifest:
        from eagle3.merge.config import MergeConfig

        asked = MergeConfig(prepared="", out="", drop=tuple(drop), manifest=cfg.expect_manifest).resolved()
        drop = set(asked.drop)
        if sources is None:
            sources = set(asked.datasets) - drop
    return sources, (drop if cfg.expect_drop is not None or cfg.expect_manifest else None)


def expectation_checks(cfg: VerifyConfig, man: dict, output_sources) -> list[dict]:
    """The three checks above. ``output_sources``: the ``source`` column of train.parquet."""
    rows = Counter(str(s) for s in output_sources)
    listed = man.get("sources", {})
    dropped_names = {d["name"] for d in man.get("dropped_datasets", [])}
    want_sources, want_drop = expected_datasets(cfg)

    asked = {"seed": cfg.expect_seed, "max_seq_len": cfg.expect_max_seq_len,
             "drop": sorted(want_drop) if want_drop is not None else None,
             "sources": sorted(want_sources) if want_sources is not None else None}
    found = {"seed": man.get("seed"), "max_seq_len": man.get("max_seq_len"), "drop": sorted(dropped_names),
             "sources": sorted(listed)}
    wrong = {k: (found[k], v) for k, v in asked.items() if v is not None and found[k] != v}
    unchecked = sorted(k for k, v in asked.items() if v is None)
    checks = [_check(
        "expectations", not wrong,
        ("; ".join(f"{k}: manifest {f} but this run asked for {w}" for k, (f, w) in wrong.items())
         + " (a merge left by another run? re-run `eagle3 merge` with this run's settings)") if wrong else
        f"manifest matches what this run asked for ({', '.join(k for k in asked if k not in unchecked) or 'nothing'})"
        + (f"; not asked, so not checked: {', '.join(unchecked)}" if unchecked else ""),
        expected=asked, found=found, unchecked=unchecked)]

    totals = man.get("totals", {})
    summed = {k: sum(int(s.get(k, 0)) for s in listed.values()) for k in TOTAL_KEYS}
    summed_dropped: Counter = Counter()
    for s in listed.values():
        summed_dropped.update(s.get("dropped", {}))
    off = {k: (totals.get(k), v) for k, v in summed.items() if totals.get(k) != v}
    if dict(totals.get("dropped", {})) != dict(summed_dropped):
        off["dropped"] = (totals.get("dropped"), dict(summed_dropped))
    n_rows = sum(rows.values())
    if totals.get("samples_out") != n_rows:
        off["rows in train.parquet"] = (totals.get("samples_out"), n_rows)
    checks.append(_check(
        "totals", not off,
        "; ".join(f"{k}: totals {t} vs {v}" for k, (t, v) in off.items()) if off else
        f"totals equal the sum over {len(listed)} sources and train.parquet's {n_rows} rows",
        summed={**summed, "dropped": dict(summed_dropped)}, rows=n_rows))

    drop_list = dropped_names | (want_drop or set())
    leaks = {n: rows[n] for n in sorted(drop_list) if rows.get(n)}
    listed_out = {n: listed[n].get("samples_out") for n in sorted(drop_list & set(listed))
                  if listed[n].get("samples_out")}
    problems = [f"{n}: {c} rows in train.parquet" for n, c in leaks.items()]
    problems += [f"{n}: listed under the manifest's sources with samples_out {c}" for n, c in listed_out.items()]
    checks.append(_check(
        "dropped_datasets", not problems,
        "; ".join(problems) + "; the drop list was not applied, re-run `eagle3 merge`" if problems else
        f"no rows from the {len(drop_list)} dropped dataset(s) {sorted(drop_list)}",
        drop_list=sorted(drop_list), rows=leaks))
    return checks
