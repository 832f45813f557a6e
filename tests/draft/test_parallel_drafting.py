"""P-EAGLE (parallel drafting): one draft forward proposes a round's k tokens as vLLM 0.32's parallel drafter
computes them (a reference written from its source), TTT trains exactly what that forward runs (its loss,
recomputed from the decoding forward, equals the trainer's under every attention layout), and the setting
survives checkpoints and the export."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from eagle3.draft.config import DraftConfig
from eagle3.draft.model import DraftCache
from eagle3.draft.ttt import ttt_forward
from eagle3.errors import InputError
from tests.draft.test_variant import vllm_combine, vllm_pass
from tests.draft.tiny import make_tiny_draft, tiny_batch

K = 4


def vllm_parallel_reference(model, ids, aux, k: int) -> torch.Tensor:
    """vLLM's parallel drafter (v1/spec_decode/llm_base_proposer.py, _copy_and_expand_eagle_inputs): the real
    rows (the shifted ids with the bonus last, the target's hidden), then k-1 slots of token `mask_token_id`,
    hidden combine_hidden_states(mask_hidden), positions continuing by one; ONE causal forward; the k
    proposals are sampled from the last real row and the slots. Returns their logits [k, Vd]."""
    hidden = torch.cat([vllm_combine(model, aux), vllm_combine(model, model.mask_hidden.detach()[None])
                        .expand(k - 1, -1)])
    tokens = ids.tolist() + [model.config.mask_token_id] * (k - 1)
    logits, _, _ = vllm_pass(model, tokens, hidden, torch.arange(len(tokens)), [], [])
    return logits[-k:]


def _parallel(variant="eagle3", seed=0):
    model = make_tiny_draft(seed=seed, variant=variant, parallel_drafting=True, mask_token_id=7)
    with torch.no_grad():  # a mask_hidden unlike the ones of build_draft, so a slot that ignores it shows
        model.mask_hidden.copy_(torch.randn(model.mask_hidden.shape, generator=torch.Generator().manual_seed(5)))
    return model


@pytest.mark.parametrize("variant", ["eagle3", "eagle3.1"])
def test_one_forward_equals_vllms_parallel_drafter(variant):
    model = _parallel(variant).eval()
    torch.manual_seed(3)
    ids, aux = torch.randint(0, 50, (9,)), torch.randn(9, 96)
    want = vllm_parallel_reference(model, ids, aux, K)
    with torch.no_grad():
        cache = DraftCache()
        got = model.propose_parallel(ids[None], aux[None], torch.arange(9)[None], K, cache)
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-5)
    assert len(cache) == 9 + K - 1  # the slots' rows are the caller's to drop
    # The slots read mask_hidden and the mask token: change either and the later proposals' logits move.
    other = _parallel(variant, seed=0)
    with torch.no_grad():
        other.mask_hidden.mul_(-1)
    assert not torch.allclose(vllm_parallel_reference(other, ids, aux, K)[1:], want[1:], atol=1e-3)
    torch.testing.assert_close(vllm_parallel_reference(other, ids, aux, K)[0], want[0])


def _decoding_loss(model, batch, decay: float, k: int) -> torch.Tensor:
    """The TTT loss recomputed from decoding: step i at t is slot i of a round whose real rows are 0..t (the
    proposal forward, plain causal attention over a cache), against the target at t+1+i."""
    ids, aux, target = batch["input_ids"], batch["aux"], batch["target_logits_draft"]
    b, t = ids.shape
    total = 0.0
    for i in range(k):
        terms = []
        for row in range(b):
            for pos in range(t - 2 - i):  # a target token x_{pos+2+i} exists
                ids_in = ids[row:row + 1, 1:pos + 2]
                mask_ids = torch.full((1, i), model.config.mask_token_id)
                slot_hidden = model.project_aux(model.mask_hidden).expand(1, i, -1)
                logits, _ = model.step(torch.cat([ids_in, mask_ids], 1),
                                       torch.cat([model.project_aux(aux[row:row + 1, :pos + 1]), slot_hidden], 1),
                                       torch.arange(pos + 1 + i)[None], DraftCache())
                p = target[row, pos + 1 + i].float().softmax(-1)
                terms.append(-(p * F.log_softmax(logits[0, -1].float(), -1)).sum())
        total = total + decay ** i * torch.stack(terms).mean()
    return total


@pytest.mark.parametrize("layout", [dict(attention="dense"), dict(attention="blockwise", sparse=False),
                                    dict(attention="blockwise", sparse=True),
                                    dict(attention="blockwise", checkpoint_steps=True)])
def test_ttt_trains_what_the_parallel_forward_runs(layout):
    model = _parallel("eagle3.1")
    batch = tiny_batch(model.config, b=2, t=10)
    want = _decoding_loss(model, batch, 0.8, K)
    got = ttt_forward(model, **batch, ttt_length=K, step_decay=0.8, **layout)
    torch.testing.assert_close(got.loss, want, rtol=1e-4, atol=1e-5)
    grads = torch.autograd.grad(got.loss, [model.mask_hidden, model.fc.weight])
    want_grads = torch.autograd.grad(want, [model.mask_hidden, model.fc.weight])
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)
    assert grads[0].abs().sum() > 0  # mask_hidden is trained


def test_chain_and_parallel_train_different_steps_from_the_same_weights():
    """Step 0 is the same computation; steps 1.. differ (the slots are not fed the next token)."""
    par = _parallel()
    chain = make_tiny_draft(seed=0)
    chain.load_state_dict({k: v for k, v in par.state_dict().items() if k != "mask_hidden"})
    batch = tiny_batch(par.config, b=1, t=10)
    with torch.no_grad():
        one_p, one_c = (ttt_forward(m, **batch, ttt_length=1).loss for m in (par, chain))
        many_p, many_c = (ttt_forward(m, **batch, ttt_length=3).loss for m in (par, chain))
    torch.testing.assert_close(one_p, one_c)
    assert not torch.allclose(many_p, many_c)


def test_the_setting_is_kept_by_the_config_and_refused_when_wrong():
    cfg = _parallel().config
    assert DraftConfig.from_dict(cfg.to_dict()) == cfg and cfg.parallel_drafting and cfg.mask_token_id == 7
    assert "mask_hidden" in _parallel().state_dict() and "mask_hidden" not in make_tiny_draft().state_dict()
    old = {k: v for k, v in make_tiny_draft().config.to_dict().items()
           if k not in ("parallel_drafting", "mask_token_id")}  # a checkpoint from before the field
    assert DraftConfig.from_dict(old).parallel_drafting is False
    with pytest.raises(InputError, match="mask_token_id"):
        DraftConfig.from_dict({**cfg.to_dict(), "mask_token_id": cfg.vocab_size})
    with pytest.raises(InputError, match="parallel_drafting"):
        DraftConfig.from_dict({**cfg.to_dict(), "parallel_drafting": "yes"})
    with pytest.raises(ValueError, match="parallel_drafting"):
        make_tiny_draft().propose_parallel(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 96),
                                           torch.arange(2)[None], K, DraftCache())


def test_export_carries_what_vllm_reads_and_loads_back(tmp_path):
    from safetensors.torch import save_file

    from eagle3.export import draft_config_json, export_tensors, load_exported_draft
    from eagle3.serving.vllm import eagle3_speculative

    model = _parallel("eagle3.1")
    cfg = model.config
    tensors = export_tensors(model.state_dict(), "float32", "test", cfg.variant, cfg.parallel_drafting)
    assert tensors["mask_hidden"].shape == (96,)
    with pytest.raises(InputError, match="mask_hidden"):  # a chain draft's tensors under the P-EAGLE names
        export_tensors(make_tiny_draft().state_dict(), "float32", "test", "eagle3", True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = draft_config_json(cfg, "float32")
    assert (config["parallel_drafting"], config["mask_token_id"]) == (True, 7)
    assert "parallel_drafting" not in draft_config_json(make_tiny_draft().config, "float32")
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = eagle3_speculative(str(tmp_path), 3)
    assert spec["parallel_drafting"] is True and spec["num_speculative_tokens"] == 3
    back = load_exported_draft(str(tmp_path), model.embed_weight)
    assert back.config.parallel_drafting and back.config.mask_token_id == 7
    torch.manual_seed(4)
    ids, aux = torch.randint(0, 50, (1, 6)), torch.randn(1, 6, 96)
    with torch.no_grad():
        a = model.propose_parallel(ids, aux, torch.arange(6)[None], K, DraftCache())
        b = back.propose_parallel(ids, aux, torch.arange(6)[None], K, DraftCache())
    torch.testing.assert_close(a, b)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "mask_token_id"}))
    with pytest.raises(InputError, match="mask_token_id"):
        load_exported_draft(str(tmp_path), model.embed_weight)
    with pytest.raises(InputError, match="mask_token_id"):  # the server is refused the same way
        eagle3_speculative(str(tmp_path), 3)
    (tmp_path / "config.json").write_text(json.dumps({**config, "parallel_drafting": "true"}))
    with pytest.raises(InputError, match="true or false"):  # not read as a chain draft
        eagle3_speculative(str(tmp_path), 3)
    (tmp_path / "config.json").unlink()
    assert "parallel_drafting" not in eagle3_speculative(str(tmp_path), 3)  # a folder without a config


def test_training_refuses_p_eagle_without_a_slot_to_train():
    from eagle3.train.config import TrainConfig

    with pytest.raises(InputError, match="ttt-length 2"):
        TrainConfig(store="/s", vocab="/v", out="/o", parallel_drafting=True, ttt_length=1)
    assert TrainConfig(store="/s", vocab="/v", out="/o", parallel_drafting=True, ttt_length=2).parallel_drafting
