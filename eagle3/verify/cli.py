"""Re-check a merged dataset and write MERGED/verify.json (the gate); exit 3 when a check fails.

  eagle3 verify --merged MERGED --model smollm2-135m-instruct --storage fp8 --store STORE
"""

from eagle3 import storage_options
from eagle3.config import stage_cli
from eagle3.verify import VerifyConfig, verify
from eagle3.verify.mode import MODES


add_arguments, run = stage_cli(VerifyConfig, verify, choices={"storage": tuple(storage_options.OPTIONS),
                                                          "training_mode": MODES})
