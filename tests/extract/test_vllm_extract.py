"""`eagle3 extract --engine vllm` on the real SmolLM2 against the transformers engine (the independent
capture), both at the precision policy's choice, on 474 tokens of real chat samples, and both against an fp32
transformers forward of the same tokens.

One vLLM start (~1-2 min on 2 CPU cores) serves the whole module. What is asserted, and why these bounds:

- the two stores are the same store to every reader: same key folder, sample ids, ids and masks, tensor
  names, dtypes and shapes, shard layout; store.json differs only in ``engine``, which names vllm;
- aux (per token and aux layer) and last (per token) agree within BOUNDS. In fp32 the engines agree to the
  bf16 rounding of the stores. In bf16 they round differently (vLLM keeps the residual stream in bf16, the
  lean forward in fp32), so they are two independent bf16 approximations of the same fp32 numbers: measured
  here, vLLM's mean relative error against fp32 is 1.1% (aux) and 2.0% (last), ours 0.8% and 1.4%, and the
  worst row (one token of layer 14) is at cosine 0.990 between them. The wrong layer would be far off:
  vLLM's aux against fp32 layers one off (measured on these samples) is at mean cosine 0.914 (one too
  early) and 0.955 (one too late), median relative error 0.32 and 0.30, so an id off by one fails the
  mean-cosine and median bounds tenfold;
- vLLM is as close to fp32 as our engine is: its mean relative error is at most twice ours (+0.002);
- the argmax of last @ lm_head.T agrees on >= 99.5% of the positions where fp32's top token leads by
  NEAR_TIE logits or more, and overall on >= 99.5% in fp32, >= 98.5% in bf16. In bf16 a near-tie flips
  either way: measured, 470/474 positions agree, and each engine differs from fp32 on 4 positions (different
  ones), all with fp32's top two within 0.11 logits; vLLM may not flip more than ours (+2).
"""

from __future__ import annotations

import pytest
import torch

from eagle3.devices import resolve_precision
from eagle3.errors import InputError
from eagle3.extract import ExtractConfig, extract
from eagle3.extract.store import HiddenStateStore
from eagle3.target import SMOLLM2_ALIAS, load_model, load_tokenizer

from extract_testdata import write_merged

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# Bounds per precision (see the module doc). bf16, measured here on these samples: aux cosine min 0.990 / mean
# 0.99990, relative error median 0.012 / max 0.139; last 0.9986 / 0.99972, 0.021 / 0.056. fp32: relative
# error <= 0.0014 on every row (what is left is the bf16 rounding of the stores, which is the same in both).
BOUNDS = {"bfloat16": {"cos_min": 0.98, "cos_mean": 0.9995, "rel_max": 0.2, "rel_median": 0.03},
          "float32": {"cos_min": 0.9999, "cos_mean": 0.99999, "rel_max": 0.01, "rel_median": 0.002}}
NEAR_TIE = 0.25  # logits: every bf16 argmax flip measured here had fp32's top two within 0.11

CHATS = [
    ("How does a bicycle stay upright?", "A moving bicycle stays upright because the rider keeps steering "
                                         "the wheels back under the centre of mass."),
    ("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"),
    ("What is the capital of France?", "The capital of France is Paris, known for the Eiffel Tower."),
    ("Give me a haiku about rain.", "Soft rain on the roof,\nthe garden drinks in silence,\nmorning smells of earth."),
    ("Translate 'good morning' to Spanish.", "'Good morning' in Spanish is 'buenos días'."),
    ("List three primary colours.", "The three primary colours are red, yellow and blue."),
    ("Why is the sky blue?", "Sunlight scatters off air molecules, and blue light scatters the most, so the "
                             "sky looks blue from every direction."),
    ("Sort [3, 1, 2] in Python.", "sorted([3, 1, 2]) returns [1, 2, 3]; list.sort() sorts in place."),
]


def _vllm_or_skip() -> None:
    from eagle3.serving.vllm import vllm_python

    try:
        vllm_python()
    except InputError as e:
        pytest.skip(f"no vLLM venv: {e}")


@pytest.fixture(scope="module")
def stores(tmp_path_factory, smollm2_dir):
    _vllm_or_skip()
    tmp = tmp_path_factory.mktemp("vllm-extract")
    tok = load_tokenizer(SMOLLM2_ALIAS)
    samples = []
    for i, (user, answer) in enumerate(CHATS):
        ids = tok.apply_chat_template([{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                                      tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        samples.append({"id": f"chat{i}", "input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8)})
    merged = write_merged(tmp / "merged", samples)
    precision = resolve_precision("auto", "cpu").name  # the policy's choice, the same for both engines
    # Small batches and shards: several requests in flight per batch, several shards, as a real run has.
    common = dict(merged=merged, model=SMOLLM2_ALIAS, device="cpu", precision=precision, token_budget=128,
                  shard_mb=0.5)
    runs = {engine: extract(ExtractConfig(out=str(tmp / engine), engine=engine, **common))
            for engine in ("vllm", "transformers")}
    again = extract(ExtractConfig(out=str(tmp / "vllm"), engine="vllm", **common))
    return ({engine: HiddenStateStore(run["store"]) for engine, run in runs.items()}, runs, again, samples,
            precision)


def test_the_two_stores_are_the_same_store_but_for_the_engine_they_name(stores):
    by_engine, runs, again, samples, precision = stores
    ours, theirs = by_engine["transformers"], by_engine["vllm"]
    assert theirs.uri.rsplit("/", 1)[1] == ours.uri.rsplit("/", 1)[1]  # same key: model, layers, storage
    engine = theirs.info["engine"]
    assert engine["name"] == "vllm" and engine["version"][0].isdigit(), engine
    assert engine["tensor_parallel_size"] == engine["pipeline_parallel_size"] == engine["data_parallel_size"] == 1
    assert ours.info["engine"]["name"] == "transformers"
    assert {k: v for k, v in theirs.info.items() if k != "engine"} == {k: v for k, v in ours.info.items()
                                                                        if k != "engine"}
    tokens = sum(len(s["input_ids"]) for s in samples)
    assert theirs.engines() == {"vllm": tokens} and ours.engines() == {"transformers": tokens}
    assert 300 <= tokens <= 1000 and theirs.aux_layers == [1, 14, 26]
    assert runs["vllm"]["precision"]["name"] == runs["transformers"]["precision"]["name"] == precision
    strip = {"sha256", "engine"}
    assert ({n: {k: v for k, v in e.items() if k not in strip} for n, e in theirs.shards.items()}
            == {n: {k: v for k, v in e.items() if k not in strip} for n, e in ours.shards.items()})
    assert len(theirs.shards) >= 2 and theirs.sample_ids() == ours.sample_ids()
    for sid in ours.sample_ids():
        a, b = theirs.get_raw(sid), ours.get_raw(sid)
        assert sorted(a) == sorted(b)
        for k in a:
            x, y = a[k][:], b[k][:]
            assert (x.dtype, x.shape) == (y.dtype, y.shape), (sid, k)
        assert torch.equal(a["input_ids"][:], b["input_ids"][:]) and torch.equal(a["loss_mask"][:], b["loss_mask"][:])
    # a re-run finds everything stored and starts no server
    assert again["samples_extracted"] == 0 and again["samples_skipped"] == len(samples)
    assert "server_start_s" not in again and runs["vllm"]["server_start_s"] > 0


def _rows(store: HiddenStateStore, key: str) -> torch.Tensor:
    """Every stored row of ``key`` in store order, fp32; aux as one row per token and aux layer."""
    return torch.cat([store.get(sid)[key].float() for sid in store.sample_ids()]).reshape(-1, store.hidden_size)


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1), (a - b).norm(dim=-1) / b.norm(dim=-1)


@pytest.fixture(scope="module")
def fp32_reference(stores):
    """The fp32 transformers forward of the same samples: aux and last rows, and lm_head's weight."""
    store = stores[0]["transformers"]
    model = load_model(SMOLLM2_ALIAS, "cpu", "float32")
    aux, last = [], []
    with torch.no_grad():
        for sid in store.sample_ids():
            out = model.model(input_ids=store.get(sid)["input_ids"][:].long()[None], output_hidden_states=True)
            aux.append(torch.cat([out.hidden_states[i + 1][0] for i in store.aux_layers], dim=-1))
            last.append(out.last_hidden_state[0])
    return {"aux": torch.cat(aux).reshape(-1, store.hidden_size), "last": torch.cat(last),
            "lm_head": model.lm_head.weight.detach()}


@pytest.mark.parametrize("key", ["aux", "last"])
def test_aux_and_last_agree_with_the_transformers_engine(stores, key):
    by_engine, precision = stores[0], stores[4]
    cos, rel = _agreement(_rows(by_engine["vllm"], key), _rows(by_engine["transformers"], key))
    print(f"\n{key} ({precision}): cosine min {cos.min():.5f} mean {cos.mean():.6f}; relative error median "
          f"{rel.median():.4f} max {rel.max():.4f} over {len(cos)} rows")
    bound = BOUNDS[precision]
    assert cos.min() >= bound["cos_min"] and cos.mean() >= bound["cos_mean"], (float(cos.min()), float(cos.mean()))
    assert rel.max() <= bound["rel_max"] and rel.median() <= bound["rel_median"], (float(rel.max()),
                                                                                   float(rel.median()))


def test_vllm_is_as_close_to_fp32_as_our_engine(stores, fp32_reference):
    by_engine = stores[0]
    for key in ("aux", "last"):
        _, theirs = _agreement(_rows(by_engine["vllm"], key), fp32_reference[key])
        _, ours = _agreement(_rows(by_engine["transformers"], key), fp32_reference[key])
        print(f"\n{key} vs fp32: relative error mean vllm {theirs.mean():.4f}, transformers {ours.mean():.4f}")
        assert theirs.mean() <= 2 * ours.mean() + 0.002, (key, float(theirs.mean()), float(ours.mean()))


def test_the_stored_argmax_agrees(stores, fp32_reference):
    by_engine, precision = stores[0], stores[4]
    head, ref = fp32_reference["lm_head"], fp32_reference["last"] @ fp32_reference["lm_head"].T
    picks = {e: (_rows(s, "last") @ head.T).argmax(-1) for e, s in by_engine.items()}
    same = picks["vllm"] == picks["transformers"]
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= NEAR_TIE  # fp32's top token leads by at least NEAR_TIE logits
    flips = {e: int((p != ref.argmax(-1)).sum()) for e, p in picks.items()}
    print(f"\nargmax of last @ lm_head.T ({precision}): {int(same.sum())}/{len(same)} positions agree, "
          f"{int(same[clear].sum())}/{int(clear.sum())} of those without a near-tie; against fp32 "
          f"{flips['vllm']} (vllm) and {flips['transformers']} (transformers) differ")
    assert same[clear].float().mean() >= 0.995
    if precision == "float32":
        assert same.float().mean() >= 0.995
        assert flips["vllm"] <= flips["transformers"] + 2  # vLLM's near-tie flips are no more than ours
    else:
        # bf16: each engine's kernels round differently (on an AMX machine vLLM's bf16 flipped 9 positions,
        # torch's 5, 466/474 agreeing); what must hold is that every flip is a near-tie: where fp32's top token
        # leads clearly, both engines pick it.
        for engine, p in picks.items():
            assert (p[clear] == ref.argmax(-1)[clear]).float().mean() >= 0.995, engine
        assert same.float().mean() >= 0.97
