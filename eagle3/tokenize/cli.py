"""Tokenize the datasets of a manifest with the tokenizer's chat template and exact loss masks.

For each dataset (or only --dataset NAME) this writes PREP/<name>/:
  tokenized.parquet  id, input_ids, loss_mask, num_tokens, num_loss_tokens, source
  stats.json         counts, reject reasons, fingerprint
  rejects.jsonl      every refused input line: {"file", "line", "reason", "detail"}
  fingerprint.json   input hash + tokenizer + chat template + settings

The loss mask is 1 on each assistant turn's generated text and its end-of-turn
token, 0 on role headers, system, user and tool turns. A dataset whose
fingerprint is unchanged is skipped (use --force to redo it). The task fails if
more than --max-reject-share of a dataset's records are refused.

example:
  eagle3 tokenize --manifest data/manifest.yaml --tokenizer smollm2-135m-instruct --out prep/
"""

from eagle3.config import stage_cli
from eagle3.tokenize import TokenizeConfig, tokenize

add_arguments, run = stage_cli(TokenizeConfig, tokenize, aliases={"model": ["--tokenizer"]})
