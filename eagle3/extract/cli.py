"""Run the target over the merged dataset and store aux-layer / final-norm hidden states.

Writes STORE/<model_fp>-L<a>_<b>_<c>-<storage>/ (see docs/extract.md). Samples
already in the store are skipped, so a re-run resumes after a crash and extracts
only new data. Exit code 75 after an out-of-memory: the halved token budget is
saved, and a re-run continues with it.

  eagle3 extract --merged MERGED --model smollm2-135m-instruct --out STORE --shard 0/4
"""

from eagle3 import storage_options
from eagle3.config import stage_cli
from eagle3.devices import PRECISIONS
from eagle3.extract import ExtractConfig, extract

add_arguments, run = stage_cli(ExtractConfig, extract,
                               choices={"storage": tuple(storage_options.OPTIONS), "precision": PRECISIONS})
