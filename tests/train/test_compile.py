"""TrainConfig.compile: the torch.compile'd TTT forward gives the eager loss, gradients and counts."""

from __future__ import annotations

import pytest
import torch

from eagle3.draft import ttt
from eagle3.train import objective
from tests.draft.tiny import make_tiny_draft, tiny_batch

pytestmark = pytest.mark.slow  # one inductor compile: ~45 s of CPU


def test_compiled_ttt_equals_eager():
    torch.set_num_threads(1)
    model = make_tiny_draft()
    batch = tiny_batch(model.config, b=2, t=12)
    norm = torch.tensor([10.0, 9.0, 8.0], dtype=torch.float64)
    assert objective.ttt_function(False) is ttt.ttt_forward
    compiled = objective.ttt_function(True)
    assert compiled is objective.ttt_function(True) is not ttt.ttt_forward  # one compile per process
    results = []
    for fn in (ttt.ttt_forward, compiled):
        model.zero_grad(set_to_none=True)
        r = fn(model, **batch, ttt_length=3, normalizer=norm)
        r.loss.backward()
        results.append((r, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (eager, g_eager), (comp, g_comp) = results
    torch.testing.assert_close(comp.loss, eager.loss, rtol=1e-5, atol=1e-6)
    assert comp.counts.tolist() == eager.counts.tolist() and comp.correct.tolist() == eager.correct.tolist()
    for name in g_eager:
        torch.testing.assert_close(g_comp[name], g_eager[name], rtol=1e-4, atol=1e-6)
