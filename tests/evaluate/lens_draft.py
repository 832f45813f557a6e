"""A draft built, not trained by the trainer, whose acceptance depends on which target layers feed it.

Start from init="target" (norm and lm_head = the target's) and zero the midlayer's attention and MLP
outputs: the draft's guess at position t is the target's final norm and lm_head applied to fc(aux
states of position t). fc reads one aux block (``slot``) through a linear map W, a "logit lens" there.

- ``fit_texts`` given: W is fitted by least squares (ridge) so that W·(that aux state of token t) is
  the EMBEDDING of token t, over the target's own states on those texts. SmolLM2's lm_head is its
  embedding, so the lens then guesses token t itself: right for token t+2 whenever the answer repeats
  with period two ("hello, hello, ..."). A draft trained this way on aux id 0 (the OUTPUT of layer 0)
  is accepted only by an engine that feeds it that output; one that feeds it the input of layer 0
  (vLLM reading the old export's ids as they are) gets another state, and fewer acceptances.
- no ``fit_texts``: W is the identity (the lens of the raw state).

Full vocabulary, so the export carries no d2t (what vLLM needs for a full-vocab draft).
"""

from __future__ import annotations

import json
from pathlib import Path


def fit_to_embedding(target_dir: str, layer: int, texts: list[str], ridge: float = 1e-2, transform=None):
    """W (h×h) with W·(output of ``layer`` at t) ≈ embedding of token t, ridge least squares over ``texts``
    (the states go through ``transform`` first: what the draft applies before fc)."""
    import torch

    from eagle3.target import load_model, load_tokenizer

    tok, model = load_tokenizer(target_dir), load_model(target_dir, precision="float32")
    xs, ys = [], []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok(text)["input_ids"]])
            states = model(ids, output_hidden_states=True).hidden_states  # [0] embeddings, [k+1] layer k
            x = states[layer + 1][0, 1:]  # position 0 is the attention sink: left out
            xs.append((transform(x) if transform else x).double())
            ys.append(states[0][0, 1:].double())
    x, y = torch.cat(xs), torch.cat(ys)
    gram = x.T @ x
    b = torch.linalg.solve(gram + ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=x.dtype), x.T @ y)
    return b.T.float()  # fc(x) = x @ weight.T


def lens_draft(target_dir: str, out: Path, aux: tuple[int, int, int], slot: int = 0, config_aux=None,
               fit_texts: list[str] | None = None, variant: str = "eagle3") -> str:
    """Write DRAFT to ``out``; ``config_aux`` (default ``aux``) is what its config.json claims it was trained on.

    ``variant="eagle3.1"``: the block goes through fc_norm first, whose weight is a gain g with every other sign
    flipped (W is fitted on g * x / rms(x)), so an engine that skipped fc_norm would feed W another vector and
    lose the lens."""
    import torch
    from safetensors.torch import save_file

    from eagle3.draft.build import build_draft
    from eagle3.draft.config import DraftConfig
    from eagle3.export import draft_config_json, export_tensors
    from eagle3.target import vocab_size

    v = vocab_size(target_dir)
    cfg = DraftConfig.from_target_dir(target_dir, draft_vocab_size=v, aux_layers=list(aux), variant=variant)
    draft = build_draft(cfg, target_dir, torch.zeros(v, dtype=torch.long), torch.ones(v, dtype=torch.bool),
                        init="target", seed=1)
    h = cfg.hidden_size
    transform = None
    if cfg.fc_norm:
        k = torch.arange(h, dtype=torch.float32)
        gain = torch.where(k % 2 == 0, 1.0, -1.0) * (1.0 + 0.25 * torch.sin(k))  # half the signs flipped
        with torch.no_grad():
            draft.fc_norm[slot].weight.copy_(gain)
        norm = draft.fc_norm[slot]
        transform = lambda x: norm(x.float()).detach()  # noqa: E731 - what the draft applies before fc
    block = fit_to_embedding(target_dir, aux[slot], fit_texts, transform=transform) if fit_texts else torch.eye(h)
    with torch.no_grad():
        draft.midlayer.self_attn.o_proj.weight.zero_()
        draft.midlayer.mlp.down_proj.weight.zero_()
        draft.fc.weight.zero_()
        draft.fc.weight[:, slot * h:(slot + 1) * h].copy_(block)
    out.mkdir(parents=True, exist_ok=True)
    save_file(export_tensors(draft.state_dict(), "float32", "lens draft", variant), str(out / "model.safetensors"))
    claimed = DraftConfig.from_target_dir(target_dir, draft_vocab_size=v, aux_layers=list(config_aux or aux),
                                          variant=variant)
    (out / "config.json").write_text(json.dumps(draft_config_json(claimed, "float32")))
    return str(out)
