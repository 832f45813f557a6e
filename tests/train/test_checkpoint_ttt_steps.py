"""TrainConfig.checkpoint_ttt_steps: recomputing each TTT step in backward trains exactly as keeping it."""

from __future__ import annotations

from eagle3.train.loop import train

from tests.train.test_loop import cfg_for, losses


def test_checkpointed_ttt_steps_give_the_same_loss_curve(tiny_store, tmp_path):
    curves = []
    for ckpt in (False, True):
        out = tmp_path / f"ckpt-{ckpt}"
        train(cfg_for(tiny_store, out, max_steps=4, checkpoint_ttt_steps=ckpt))
        curves.append(losses(out))
    plain, checkpointed = curves
    assert len(plain) == 4
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(plain, checkpointed)), (plain, checkpointed)
