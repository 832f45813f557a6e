"""The sglang engine's answer checks (eagle3.extract.sglang_engine.read_answer) and the codec's TopK seam,
on hand-made /generate answers: no server."""

from __future__ import annotations

import pytest
import torch

from eagle3.extract import codec
from eagle3.extract.served import AnswerError
from eagle3.extract.sglang_engine import read_answer

H, V, K = 4, 50, 3
IDS = [7, 8, 9]


def _answer(aux=None, logprobs=None, **meta) -> dict:
    """A well-formed answer for IDS: aux [3, 3H] rows, and per position a peaked distribution over V."""
    aux = torch.arange(len(IDS) * 3 * H, dtype=torch.float32).reshape(len(IDS), 3 * H) if aux is None else aux
    logprobs = torch.log_softmax(torch.randn(len(IDS), V, generator=torch.Generator().manual_seed(0)) * 4, -1) \
        if logprobs is None else logprobs
    top = logprobs.topk(K, -1)
    entries = [[[v, i, None] for v, i in zip(top.values[t].tolist(), top.indices[t].tolist())] for t in range(len(IDS))]
    base = {"prompt_tokens": len(IDS), "cached_tokens": 0, "hidden_states": [aux.tolist()],
            "input_top_logprobs": [None, *entries[:-1]], "output_top_logprobs": [entries[-1]]}
    return {"text": "x", "meta_info": {**base, **meta}}


def test_a_good_answer_gives_each_positions_own_distribution_and_the_aux_in_the_stores_order():
    logprobs = torch.log_softmax(torch.randn(len(IDS), V) * 4, -1)
    aux = torch.randn(len(IDS), 3 * H)
    got, ids, values = read_answer(_answer(aux, logprobs), "s1", IDS, [1, 3, 5], H, V, K)
    assert torch.equal(got, aux)
    top = logprobs.topk(K, -1)
    assert torch.equal(ids, top.indices) and torch.equal(values, top.values)  # row t: what position t predicts
    # SGLang returns the captured layers in layer order; the store keeps the configured order
    swapped, _, _ = read_answer(_answer(aux, logprobs), "s1", IDS, [5, 1, 3], H, V, K)
    assert torch.equal(swapped, torch.cat([aux[:, 2 * H:], aux[:, :2 * H]], -1))


def _bad_entries(meta_key, change):
    answer = _answer()
    change(answer["meta_info"][meta_key])
    return answer


@pytest.mark.parametrize("answer, message", [
    ({"error": "boom"}, "has no meta_info"),
    (_answer(hidden_states=None), "no meta_info.hidden_states .*--enable-return-hidden-states"),
    (_answer(torch.zeros(3, H)), "rows of 4 values: the final-norm state, not the 3 aux layers"),
    (_answer(torch.zeros(2, 3 * H)), r"shape \[2, 12\], not \[3, 12\]"),
    (_answer(torch.full((3, 3 * H), float("nan"))), "non-finite"),
    (_answer(cached_tokens=2), "reused 2 cached prompt tokens.*--disable-radix-cache"),
    (_answer(prompt_tokens=4), "counts 4 prompt tokens, not the sample's 3"),
    (_answer(input_top_logprobs=[]), "input_top_logprobs of 0 entries, not the sample's 3 with the first null"),
    (_bad_entries("input_top_logprobs", lambda e: e.__setitem__(0, e[1])), "with the first null"),
    (_answer(output_top_logprobs=[]), "no output_top_logprobs"),
    (_bad_entries("input_top_logprobs", lambda e: e[1].pop()), "2 top-logprobs entries at position 0, not"),
    (_bad_entries("output_top_logprobs", lambda e: e[0][0].__setitem__(1, V)), r"outside \[0, 50\)"),
    (_bad_entries("input_top_logprobs", lambda e: e[2][1].__setitem__(0, 0.5)), "NaN or above 0"),
    (_bad_entries("input_top_logprobs", lambda e: e[1].reverse()), "not sorted best first"),
    (_bad_entries("input_top_logprobs", lambda e: e[1].__setitem__(0, "x")), "not \\[logprob, token id, text\\]"),
])
def test_a_bad_answer_names_the_sample_and_what_is_wrong(answer, message):
    with pytest.raises(AnswerError, match=message) as err:
        read_answer(answer, "sample-9", IDS, [1, 3, 5], H, V, K)
    assert str(err.value).startswith("sample sample-9: SGLang's")


def test_ready_top_k_is_stored_as_the_codec_computes_it_from_the_same_distribution():
    """The seam: an engine's TopK (log-softmax over the full vocab, best first) gives the bytes the codec
    writes when it computes the top-k itself from `last` through the lm_head."""
    torch.manual_seed(0)
    last, head = torch.randn(9, 16), torch.randn(200, 16)
    aux = torch.randn(9, 48)
    computed = codec.encode("fp8-topk", aux, last, lm_head=lambda h: h @ head.T)
    top = torch.log_softmax(last @ head.T, -1).topk(codec.TOPK, -1)
    ready = codec.encode("fp8-topk", aux, codec.TopK(top.indices, top.values))
    assert sorted(ready) == sorted(computed)
    for name in computed:
        assert computed[name].dtype == ready[name].dtype and torch.equal(computed[name], ready[name]), name
    with pytest.raises(ValueError, match="fills fp8-topk stores only"):
        codec.encode("bf16", aux, codec.TopK(top.indices, top.values))
    with pytest.raises(ValueError, match=r"\[tokens, 16\]"):
        codec.encode("fp8-topk", aux, codec.TopK(top.indices[:, :4], top.values[:, :4]))
