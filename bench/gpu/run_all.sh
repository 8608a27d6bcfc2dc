#!/usr/bin/env bash
# Every GPU check and benchmark in one go, as run on a lent H100 for docs/gpu.md and
# docs/performance.md: the GPU tests, the attention kernels (tessera's flash kernels and cuDNN's
# fused attention) beside PyTorch's, training throughput with each attention beside PyTorch
# eager and torch.compile, and sampling speed with the KV cache, all on the same GPU in the same
# session (about 8 minutes on an H100).
# Binaries come from BIN (default build/...); OUT (default .) receives the logs and JSON lines.
#   bench/gpu/run_all.sh [BIN_DIR]       e.g. BIN_DIR=build holding tests/ and bench/
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build}
out=${OUT:-.}
test_bin=$bin/tests/tessera_gpu
[ -x "$test_bin" ] || test_bin=$bin/tessera_gpu
bench=$bin/bench
[ -x "$bench/bench_gpu_train" ] || bench=$bin
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, 'cuDNN', torch.backends.cudnn.version())"
echo "== GPU tests"
TESSERA_FIXTURES=$PWD/tests/fixtures timeout 150 "$test_bin" 2>&1 | tee "$out/gpu_tests.log" |
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|^\[ .*(fp32|bf16|trainer)|FAILED|Failure|rror" | head -60
echo "== attention: tessera (bf16 flash, cuDNN, fp32 reference) and PyTorch SDPA"
timeout 40 "$bench/bench_gpu_attention" | tee "$out/attention.txt"
timeout 60 python3 bench/gpu/torch_attention.py 2>&1 | grep -v Warning | tee -a "$out/attention.txt"
echo "== training throughput: tessera"
timeout 120 "$bench/bench_gpu_train" --models gpt2-124m,gpt2-350m --batches 64,32,16,8 \
  --attention cudnn,flash --json "$out/tessera_train.jsonl" | tee "$out/tessera_train.txt"
echo "== training throughput: PyTorch eager and torch.compile"
PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-200} python3 bench/gpu/torch_train_step.py \
  --models ${TORCH_MODELS:-gpt2-124m,gpt2-350m} --batches 64,32,16,8 2>&1 | grep -v -i warn |
  tee "$out/torch_train.txt" | tail -8
echo "== sampling: the KV-cache decoder at batch 1"
timeout 120 "$bench/bench_gpu_decode" --models smollm2-135m,llama-1b,gpt2-124m | tee "$out/decode.txt"
