"""Target capture: which hidden state is which in transformers 5.24, padding, layer checks."""

from __future__ import annotations

import pytest
import torch

from eagle3.errors import InputError
from eagle3.errors import is_oom
from eagle3.extract.capture import TargetCapture


# Every fact below holds in both compute precisions; bf16 (what the policy picks on an AMX/AVX512-BF16 CPU or a
# recent GPU) compares within its rounding: 8 bits of mantissa, so ~2^-8 relative per value.
TOL = {"float32": dict(atol=1e-5, rtol=1e-5), "bfloat16": dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cap(request, tiny_llama_dir):
    return TargetCapture(tiny_llama_dir, "cpu", lean=False, precision=request.param)  # the transformers facts


def _hooked(cap, seq):
    """Outputs of every decoder layer, captured by forward hooks (independent of hidden_states)."""
    outs, hooks = {}, []
    for i, layer in enumerate(cap.base.layers):
        hooks.append(layer.register_forward_hook(
            lambda m, a, o, i=i: outs.__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach())))
    try:
        with torch.no_grad():
            full = cap.base(input_ids=torch.tensor([seq]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    return outs, full


def test_default_layers_and_the_asked_precision_on_cpu(cap):
    assert cap.num_layers == 8 and cap.aux_layers == [1, 3, 4]
    assert next(cap.model.parameters()).dtype == getattr(torch, cap.precision.name)
    assert cap.precision.requested == cap.precision.name  # forced, whatever this machine has


def test_auto_precision_is_the_policys_choice(tiny_llama_dir):
    from eagle3.devices import resolve_precision

    auto = TargetCapture(tiny_llama_dir, "cpu", lean=False)
    assert next(auto.model.parameters()).dtype == getattr(torch, resolve_precision("auto", "cpu").name)


def test_last_hidden_state_entry_is_already_final_normed(cap):
    tol = TOL[cap.precision.name]
    seq = list(range(5, 30))
    outs, full = _hooked(cap, seq)
    pre_norm = outs[cap.num_layers - 1]
    # transformers 5.24: hidden_states[-1] is last_hidden_state = norm(output of the last layer)
    assert torch.equal(full.hidden_states[-1], full.last_hidden_state)
    assert torch.allclose(full.hidden_states[-1], cap.base.norm(pre_norm), **tol)
    assert not torch.allclose(full.hidden_states[-1], pre_norm, atol=1e-1)
    # ...while hidden_states[i+1] is the raw output of layer i for the others
    for i in range(cap.num_layers - 1):
        assert torch.equal(full.hidden_states[i + 1], outs[i])
    aux, last, lengths = cap.forward([seq])
    assert lengths == [len(seq)]
    assert torch.allclose(last, cap.base.norm(pre_norm)[0], **tol)
    assert torch.equal(aux, torch.cat([outs[i][0] for i in cap.aux_layers], dim=-1))
    # and `last` is what feeds lm_head: the model's own logits come from it, in fp32 whatever the precision
    with torch.no_grad():
        logits = cap.model(input_ids=torch.tensor([seq])).logits[0]
    ours = cap.lm_head(last)
    assert ours.dtype == torch.float32
    assert torch.allclose(ours, logits.float(), **tol)


def test_right_padded_batch_matches_single_samples(cap):
    tol = TOL[cap.precision.name]
    seqs = [list(range(3, 3 + n)) for n in (7, 31, 18)]
    aux, last, lengths = cap.forward(seqs)
    assert aux.shape == (56, 3 * cap.hidden_size) and last.shape == (56, cap.hidden_size)  # no padding rows
    pos = 0
    for s in seqs:
        a1, l1, _ = cap.forward([s])
        assert torch.allclose(aux[pos:pos + len(s)].float(), a1.float(), **tol)
        assert torch.allclose(last[pos:pos + len(s)].float(), l1.float(), **tol)
        pos += len(s)


def test_layer_override_and_bad_layers(tiny_llama_dir):
    assert TargetCapture(tiny_llama_dir, "cpu", [0, 2, 6]).aux_layers == [0, 2, 6]
    with pytest.raises(InputError, match="aux layers"):
        TargetCapture(tiny_llama_dir, "cpu", [1, 2, 7])  # layer 7's output is the normed `last`
    with pytest.raises(InputError, match="aux layers"):
        TargetCapture(tiny_llama_dir, "cpu", [1, 2])


def test_injected_oom(cap, monkeypatch):
    monkeypatch.setenv("EAGLE3_INJECT_OOM_ABOVE_TOKENS", "20")
    cap.forward([[5] * 10, [6] * 10])  # 2x10 = 20 tokens: allowed
    with pytest.raises(torch.OutOfMemoryError) as info:
        cap.forward([[5] * 10, [6] * 11])
    assert is_oom(info.value)
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(RuntimeError("shape mismatch"))
