"""Build the draft vocab map d2t/t2d from the loss-token frequencies of a merged dataset.

  eagle3 vocab --merged MERGED --draft-vocab-size 8192 --out VOCAB
"""

from eagle3.config import stage_cli
from eagle3.vocab import VocabConfig, vocab


add_arguments, run = stage_cli(VocabConfig, vocab)
