"""Re-check a merged dataset and write MERGED/verify.json (the gate); exit 3 when a check fails.

  eagle3 verify --merged MERGED --model smollm2-135m-instruct --storage fp8 --store STORE
"""

from eagle3 import storage_options
from eagle3.config import stage_cli
from eagle3.verify import VerifyConfig, verify


def _brief(cfg: VerifyConfig) -> dict:
    result = verify(cfg)
    return {k: result[k] for k in ("passed", "samples", "tokens", "content_hash")}


add_arguments, run = stage_cli(VerifyConfig, _brief, choices={"storage": tuple(storage_options.OPTIONS)})
