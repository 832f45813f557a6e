"""Golden losses: a seeded tiny draft, seeded synthetic data, 5 AdamW steps on CPU.

If this fails after an intended change to the model or loss, print the new
values with `python -m tests.draft.test_golden_loss` and update GOLDEN in the
same commit, saying why.
"""

from __future__ import annotations

import torch

from tests.draft.tiny import make_tiny_draft, tiny_batch

GOLDEN = [7.6685791015625, 7.332908630371094, 7.042203903198242, 6.797481536865234, 6.5903801918029785]
TOLERANCE = 1e-4  # relative; fp32 on CPU with one thread is bit-stable in practice


def run_five_steps() -> list[float]:
    from eagle3.draft.ttt import ttt_forward

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # matmul blocking depends on the thread count
    try:
        model = make_tiny_draft(seed=11)
        batch = tiny_batch(model.config, b=2, t=16, seed=12)
        batch["loss_mask"][:, :4] = 0  # a prompt part
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            result = ttt_forward(model, **batch, ttt_length=3)
            result.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            losses.append(result.loss.item())
        return losses
    finally:
        torch.set_num_threads(threads)


def test_golden_losses():
    losses = run_five_steps()
    assert losses[-1] < losses[0]  # it learns at all
    for step, (got, want) in enumerate(zip(losses, GOLDEN, strict=True)):
        assert abs(got - want) <= TOLERANCE * abs(want), f"step {step}: loss {got!r} != golden {want!r}"


if __name__ == "__main__":
    print(run_five_steps())
