"""The demo's settings: the one owner of what `make demo` runs and of the Airflow trigger form's defaults.

`demo/run_demo.py` writes the corpus with ``SCALE`` and ``REGENERATED`` and triggers the DAG with no
conf beyond the paths; the DAG's Params start from ``PARAMS`` (dags/eagle3_train.py), so a run
triggered from the form with nothing changed is the demo's run. A Param not named here starts from
its stage Config's default. Light: no imports beyond the standard library (the DAG file reads it).
"""

from __future__ import annotations

# Sized for 15 minutes on 2 CPU cores; see README "The demo". Keys are the DAG's Param names.
PARAMS: dict = {
    "model": "smollm2-135m-instruct",
    "drop": ["long_reports"],  # the dataset the stats flag: 6% of the samples, 25% of the tokens
    "max_seq_len": 1024,
    "draft_vocab_size": 2048,
    "ttt_length": 3,
    "epochs": 3,  # what verify's time estimate assumes; the time budget below decides the steps
    "train_time_budget": 150,  # s: steps and LR schedule fixed from the first steps' speed (docs/train.md);
    # 150 s (was ~270 s of training) pays for regenerating chat and instructions within the 15 minutes
    "run_time_budget": 780,  # s from the DAG run's start: train stretches its budget to end by 780 - 270 s, so a
    "after_train_reserve": 270,  # machine that regenerated and extracted fast trains longer (evaluate: ~3.7 min)
    "reserve_tokens_per_s": 750,  # up to this extraction rate (fp32 machines; the AVX2 one ran ~530) the whole
    # reserve is kept; one at 1,107 tok/s keeps 183 s (it used 176) and trains ~2.7 min more (docs/measurements.md)
    "draft_variant": "eagle3",  # eagle3 | eagle3.1: eagle3 won the demo's paired comparison (README "vLLM")
    "lr": 2e-3,
    "extract_token_budget": 1024,
    "train_token_budget": 512,  # 2x the steps of 1024 in the same budget: HumanEval tau +0.09 (docs/measurements.md)
    "extract_shards": 2,
    "extract_tokens_per_s": 750,  # measured here: SmolLM2 fp32 on 2 CPU cores, one shard at a time
    "train_tokens_per_s": 900,  # measured here: this draft (TTT 3, Vd 2048) fp32 on 2 CPU cores
    "benchmark_prompts": "humaneval,chat",
    "benchmark_limit": 5,
    "max_new_tokens": 64,
    "steps": 3,
    "evaluate_compare_with": ["vllm"],  # the project decoder and vLLM on the same prompts (README "vLLM")
    "regenerate_backend": "openai",
    "regenerate_server": "vllm",  # each regenerate task serves SmolLM2 in vLLM: 182 vs 58 tok/s of hf here
    "regenerate_max_tokens": 128,
    "regenerate_concurrency": 48,
    "regenerate_tasks": 1,  # one vLLM server for the four regenerated datasets (a start costs ~30 s here)
}

SCALE = 0.15
"""Demo corpus size multiplier (`eagle3 demo-data --scale`)."""
MORE_ON_BF16: dict[str, float] = {"code_completion": 3.0}
"""The most sample-count factors (`eagle3 demo-data --more`) the demo applies on a machine whose precision policy
picks bf16 (eagle3.devices.resolve_precision: a CPU with a bf16 matrix engine, or a CUDA GPU), sized to its speed
by `more_factors`. Such a machine regenerates and extracts faster, so the minutes it saves go to more
HumanEval-shaped data instead of more epochs over the same: on the AVX512-BF16 machine of session 13, HumanEval
τ 2.17 -> 2.27 (20 prompts, paired 95% interval [+0.05, +0.17]) with 1.1 min less training; 5x was no better
(docs/measurements.md). `demo/run_demo.py --more-data off` writes the plain corpus."""
MORE_GFLOPS_PER_X = 125.0
"""bf16 torch.mm GFLOP/s per CPU-second (the precision probe's) that pay for one more copy of a dataset in
MORE_ON_BF16: regenerating and extracting 180 more `code_completion` samples cost ~35 s on session 13's machine
(3x, the demo 10.3-10.7 min) but ~108 s on session 15's (vLLM regenerated at 265 tok/s, extraction 931 tok/s),
where 3x took the demo to 15.1 min. Their probes read 756 and 408, but a probe of single ~1-ms products, which
counted one of the 2 threads' CPU time (eagle3.devices.mm_peak ``window_s``): per CPU-second ~378 and ~204 (3x
and 2x here, as there); session 16's machine reads 219 windowed (430 in single products) → 2x."""


def more_factors(bf16_gflops: float | None) -> dict[str, float]:
    """MORE_ON_BF16 sized to a machine whose bf16 torch.mm runs at ``bf16_gflops`` (None: unmeasured, a GPU or
    the probe turned off, gets MORE_ON_BF16 as is): each factor round(bf16_gflops / MORE_GFLOPS_PER_X), at
    least 1 and at most its MORE_ON_BF16 value; factors of 1 are left out."""
    if bf16_gflops is None:
        return dict(MORE_ON_BF16)
    sized = {k: float(min(v, max(1, round(bf16_gflops / MORE_GFLOPS_PER_X)))) for k, v in MORE_ON_BF16.items()}
    return {k: v for k, v in sized.items() if v > 1}


REGENERATED = ("coding", "code_completion", "chat", "instructions")
"""Datasets whose answers SmolLM2 regenerates before tokenizing (so the draft learns its own code and prose)."""
COMPARE: tuple[str, ...] = ()
"""Settings the demo varies after its run, each a second draft trained for the same steps and paired with the
first in vLLM (bench/paired_bench.py VARIES; `make demo DEMO_ARGS='--compare draft_variant'`)."""
FOLDER = "demo"
"""The corpus folder under the storage root: <root>/demo/manifest.yaml is the DAG's default manifest."""
MANIFEST = "manifest.yaml"
MANIFEST_ENV = "EAGLE3_MANIFEST"
"""Overrides the DAG's default manifest (demo/run_demo.py points it at its own artifacts folder)."""


def manifest_path(root: str) -> str:
    """The demo manifest under a storage root (eagle3.layout.default_root() for the DAG's default)."""
    return "/".join([str(root).rstrip("/"), FOLDER, MANIFEST])
