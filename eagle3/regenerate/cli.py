"""Replace the assistant turns of `regenerate: true` datasets with the target's own answers.

Examples:
  eagle3 regenerate --manifest m.yaml --out regen                      # hf backend, SmolLM2 on CPU
  eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url http://127.0.0.1:8000/v1 --model default --concurrency 64   # a vLLM or SGLang server
  EAGLE3_OPENAI_API_KEY=sk-... eagle3 regenerate --manifest m.yaml --out regen --backend openai \\
      --base-url https://openrouter.ai/api/v1 --model meta-llama/llama-3.1-8b-instruct \\
      --price-prompt 0.02 --price-completion 0.05

Then tokenize the derived manifest: eagle3 tokenize --manifest regen/manifest.yaml ...
Killed and re-run with the same --out, it resumes (finished conversations are kept).
"""

from eagle3.config import stage_cli
from eagle3.regenerate import RegenerateConfig, regenerate
from eagle3.devices import PRECISIONS
from eagle3.regenerate.config import BACKENDS, SERVERS

add_arguments, run = stage_cli(
    RegenerateConfig, regenerate, skip=("extra_body",),
    choices={"backend": BACKENDS, "server": SERVERS, "precision": PRECISIONS},
    aliases={"datasets": ["--dataset"], "timeout_s": ["--timeout"], "price_prompt_per_m": ["--price-prompt"],
             "price_completion_per_m": ["--price-completion"]})
