"""Replace the assistant turns of `regenerate: true` datasets with the target's own answers.

Examples:
  eagle3 regenerate --manifest m.yaml --out regen                      # hf backend, SmolLM2 on CPU
  eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url http://127.0.0.1:30000/v1 --model default --concurrency 64   # an SGLang server
  EAGLE3_OPENAI_API_KEY=sk-... eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url https://openrouter.ai/api/v1 --model meta-llama/llama-3.1-8b-instruct \\
      --price-prompt 0.02 --price-completion 0.05

Then tokenize the derived manifest: eagle3 tokenize --manifest regen/manifest.yaml ...
Killed and re-run with the same --out, it resumes (finished conversations are kept).
"""

from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("--manifest", required=True, help="dataset manifest YAML")
    p.add_argument("--out", required=True, help="output folder (local or s3://)")
    p.add_argument("--backend", choices=("hf", "openai"), default="hf", help="default: hf (in-process)")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="hf: model dir or alias; openai: the served model name (default: %(default)s)")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="only this dataset (repeatable); default: all with regenerate: true")
    p.add_argument("--base-url", help="openai: server URL; default $EAGLE3_OPENAI_BASE_URL")
    p.add_argument("--api-key-env", default="EAGLE3_OPENAI_API_KEY",
                   help="openai: environment variable holding the API key (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight; hf: batch size")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per answer (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="openai: seconds per request")
    p.add_argument("--max-retries", type=int, default=6, help="openai: retries on 429/5xx/timeouts")
    p.add_argument("--max-error-share", type=float, default=0.05,
                   help="fail when more than this share of conversations failed (default: %(default)s)")
    p.add_argument("--price-prompt", type=float, default=0.0, help="USD per million prompt tokens")
    p.add_argument("--price-completion", type=float, default=0.0, help="USD per million completion tokens")
    p.add_argument("--device", default="cpu", help="hf: torch device (default: cpu)")
    p.add_argument("--restart", action="store_true", help="discard earlier output instead of resuming")


def run(args) -> int:
    from eagle3.regenerate.stage import RegenerateConfig, regenerate

    cfg = RegenerateConfig(
        manifest=args.manifest, out=args.out, backend=args.backend, model=args.model,
        datasets=tuple(args.dataset), base_url=args.base_url, api_key_env=args.api_key_env,
        concurrency=args.concurrency, temperature=args.temperature, top_p=args.top_p,
        max_tokens=args.max_tokens, seed=args.seed, timeout_s=args.timeout, max_retries=args.max_retries,
        max_error_share=args.max_error_share, price_prompt_per_m=args.price_prompt,
        price_completion_per_m=args.price_completion, device=args.device, restart=args.restart,
    )
    summary = regenerate(cfg)
    brief = {name: {k: s[k] for k in ("done", "failed", "bad_records", "prompt_tokens", "completion_tokens",
                                      "cost_usd", "this_run")} for name, s in summary["datasets"].items()}
    print(json.dumps({"manifest": summary["manifest"], "datasets": brief}, indent=2))
    return 0
