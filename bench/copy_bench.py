"""How much τ the draft loses where the target copies from the prompt, and what a prompt lookup would win back.

For each HumanEval prompt: the target's greedy answer (--max-new-tokens), then one target forward over prompt +
answer (aux states and logits), then the draft teacher-forced over the same tokens: its TTT chain (the decoder's
steps, eagle3/draft/ttt.py alignment) predicts, from each answer position t, the tokens t+1 .. t+k. An answer token
is "copied" when the bigram ending at it occurs in the prompt (the stub's names, argument names, doctest values:
what prompt-lookup decoding exploits), else "generated". Reported per class: the draft's accuracy at each chain
step (teacher-forced: the chain is fed the true tokens) and the simulated τ (1 + leading correct steps, capped at
k, averaged over the answer's start positions, as docs/evaluate.md counts a verification), and two counterfactuals:

- oracle copy: every copied token counted correct (the most any copy mechanism could add);
- draft + prompt lookup (PLD, Saxena 2023; vLLM's `ngram` method): at each chain step, when the last two tokens
  (true ones: teacher-forced) occur in the prompt, propose the token that followed their latest occurrence there,
  else the draft's token (eagle3.evaluate.lookup). This is offline arithmetic on the same forward; the project
  decoder runs the same rule for real with `eagle3 evaluate --proposer lookup+draft`.

Also per class: the share of answer tokens outside the draft vocab (d2t), which no draft step can propose; and, with
`--prompts stubs`, the same measurement on held-out `code_completion` stubs (new draws of the demo's families, from
a seed the demo corpus never uses) instead of HumanEval: the draft on its own training distribution, so the two runs
separate what the distribution shift costs from what the draft or the decoder would lose anywhere.

usage: .venv/bin/python bench/copy_bench.py --draft DRAFT [--model smollm2-135m-instruct] [--limit 20]
       [--max-new-tokens 64] [--steps 3] [--precision float32] [--prompts humaneval|stubs|chat|FILE.jsonl]
       .venv/bin/python bench/copy_bench.py --write-stubs FILE.jsonl [--limit 20]   (the stubs, for eagle3 evaluate)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STUBS = "stubs"
STUBS_SEED = "heldout:code_completion"  # the corpus seeds its datasets "<int>:<name>": never this one


def heldout_stubs(n: int) -> list:
    """n `code_completion` prompts (eagle3.demo.code_tasks) drawn from STUBS_SEED, as evaluate's Prompts."""
    import random

    from eagle3.demo.code_tasks import code_completion
    from eagle3.evaluate.prompts import Prompt

    rng = random.Random(STUBS_SEED)
    return [Prompt(f"stub/{i}", tuple(code_completion(rng)["messages"][:1])) for i in range(n)]


def teacher_forced_logits(draft, ids: list[int], aux, k: int):
    """[k, T, Vd]: row t of step i is the draft's logits for token t+2+i, having read the true tokens up to t+1
    and the aux states up to t (the TTT chain of eagle3/draft/ttt.py: step i at t reads x_{t+1+i}; a P-EAGLE
    draft's slots i >= 1 read the mask token and mask_hidden instead): the decoder's proposals from that prefix,
    with the true tokens fed to its chain."""
    import torch

    from eagle3.draft.ttt import positions_in_sample, step0_mask

    x = torch.tensor(ids)[None]
    seg = torch.ones_like(x)
    pos, mask0 = positions_in_sample(seg), step0_mask(seg)
    steps, history = [], []
    with torch.no_grad():
        hidden = draft.project_aux(aux[None].float())
        for i in range(k):
            shifted = torch.cat([x[:, 1 + i:], torch.zeros_like(x[:, :1 + i])], dim=1)
            if i and draft.config.parallel_drafting:
                shifted, hidden = draft.mask_inputs(tuple(shifted.shape))
            logits, hidden = draft.ttt_step(shifted, hidden, pos + i, history, mask0)
            steps.append(logits[0])
    return torch.stack(steps)


def main() -> None:
    import torch

    from eagle3 import target as target_mod
    from eagle3.draft.build import load_target_embedding
    from eagle3.evaluate.lookup import prompt_lookup
    from eagle3.evaluate.prompts import encode_prompt, load_prompt_sets
    from eagle3.evaluate.spec_decode import TargetRunner, eos_token_ids, greedy_generate
    from eagle3.export import load_exported_draft, trained_aux_layers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", help="the exported draft folder (all but --write-stubs need it)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--prompts", default="humaneval",
                    help="one prompt set: humaneval, chat, a JSONL file, or 'stubs' (held-out code_completion stubs)")
    ap.add_argument("--write-stubs", metavar="FILE.jsonl",
                    help="write --limit held-out stubs as a prompt file (for `eagle3 evaluate --prompts FILE`) and exit")
    args = ap.parse_args()
    if args.write_stubs:
        with open(args.write_stubs, "w", encoding="utf-8") as f:
            for p in heldout_stubs(args.limit):
                f.write(json.dumps({"messages": list(p.messages)}) + "\n")
        print(args.write_stubs)
        return
    if not args.draft:
        ap.error("--draft is required (unless --write-stubs)")
    k = args.steps
    tdir = target_mod.resolve_model(args.model)
    tok, model = target_mod.load_tokenizer(tdir), target_mod.load_model(tdir, precision=args.precision)
    cfg = json.loads((Path(args.draft) / "config.json").read_text())
    runner = TargetRunner(model, trained_aux_layers(cfg, args.draft))
    draft = load_exported_draft(args.draft, load_target_embedding(tdir)).eval()
    eos = eos_token_ids(model, tok)
    # per class: correct[step], total[step]; tau sums for actual / oracle / hybrid
    stats = {c: {"correct": [0] * k, "total": [0] * k, "outside_vocab": 0} for c in ("copied", "generated")}
    in_vocab = draft.t2d.bool().tolist()
    tau = {"draft": [], "oracle_copy": [], "draft+lookup": []}
    by_class_tau = {"copied": [], "generated": []}
    prompts = (heldout_stubs(args.limit) if args.prompts == STUBS
               else next(iter(load_prompt_sets(args.prompts, args.limit).values())))
    for prompt in prompts:
        p_ids = encode_prompt(tok, prompt)
        out = greedy_generate(runner, p_ids, args.max_new_tokens, eos).tokens
        ids = p_ids + out
        with torch.no_grad():
            _, aux = runner.forward(ids, runner.new_cache(rollback=False), all_logits=True, aux=True)
        preds = draft.draft_to_target(teacher_forced_logits(draft, ids, aux, k).argmax(-1)).tolist()
        n_p = len(p_ids)
        prompt_bigrams = set(zip(p_ids, p_ids[1:]))
        copied = [(ids[j - 1], ids[j]) in prompt_bigrams for j in range(len(ids))]
        # a verification whose root sits at answer position r (the target just emitted ids[r]): the draft at
        # t = r - 1 proposes ids[r+1] at step 0, ids[r+2] at step 1, ...
        for r in range(n_p, len(ids) - 1):
            t = r - 1
            lead = {"draft": 0, "oracle_copy": 0, "draft+lookup": 0}
            alive = dict.fromkeys(lead, True)
            for i in range(k):
                j = t + 2 + i  # the token step i predicts
                if j >= len(ids):
                    break
                ok = preds[i][t] == ids[j]
                cls = "copied" if copied[j] else "generated"
                stats[cls]["correct"][i] += ok
                stats[cls]["total"][i] += 1
                stats[cls]["outside_vocab"] += i == 0 and not in_vocab[ids[j]]
                hit = prompt_lookup(p_ids, ids[j - 2], ids[j - 1])
                for name, good in (("draft", ok), ("oracle_copy", ok or copied[j]),
                                   ("draft+lookup", (hit == ids[j]) if hit is not None else ok)):
                    alive[name] = alive[name] and good
                    lead[name] += alive[name]
            for name in lead:
                tau[name].append(1 + lead[name])
            by_class_tau["copied" if copied[r + 1] else "generated"].append(1 + lead["draft"])
    report = {
        "prompt_set": args.prompts, "prompts": len(prompts), "steps": k, "max_new_tokens": args.max_new_tokens,
        "accuracy": {c: [round(s["correct"][i] / max(s["total"][i], 1), 3) for i in range(k)] for c, s in stats.items()},
        "tokens": {c: s["total"][0] for c, s in stats.items()},
        "outside_draft_vocab": {c: round(s["outside_vocab"] / max(s["total"][0], 1), 3) for c, s in stats.items()},
        "copied_share": round(stats["copied"]["total"][0] / max(1, sum(s["total"][0] for s in stats.values())), 3),
        "tau": {name: round(sum(v) / max(len(v), 1), 3) for name, v in tau.items()},
        "tau_by_first_token_class": {c: round(sum(v) / max(len(v), 1), 3) for c, v in by_class_tau.items()},
    }
    print(json.dumps(report, indent=1))
    print(f"copied tokens: {100 * report['copied_share']:.0f}% of the answers; draft accuracy by step: copied "
          f"{report['accuracy']['copied']}, generated {report['accuracy']['generated']}")
    out = report["outside_draft_vocab"]
    print(f"outside the draft vocab (no draft step can propose them): {100 * out['copied']:.1f}% of the copied "
          f"tokens, {100 * out['generated']:.1f}% of the generated")
    print(f"simulated tau (teacher-forced, k={k}): draft {report['tau']['draft']:.3f}, every copy right "
          f"{report['tau']['oracle_copy']:.3f}, draft + prompt lookup {report['tau']['draft+lookup']:.3f}")


if __name__ == "__main__":
    main()
