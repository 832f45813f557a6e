"""Drop, truncate, dedupe and shuffle prepared datasets into one train.parquet.

  eagle3 merge --prepared PREP --out MERGED --max-seq-len 2048 --seed 42 --drop long_reports
"""

from eagle3.config import stage_cli
from eagle3.merge import MergeConfig, merge

add_arguments, run = stage_cli(MergeConfig, merge)
