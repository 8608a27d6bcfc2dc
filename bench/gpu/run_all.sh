#!/usr/bin/env bash
# Every GPU check and benchmark in one go, as run on a lent H100 for docs/gpu.md and
# docs/performance.md: the GPU tests, the attention kernels beside PyTorch's, and training
# throughput beside PyTorch eager and torch.compile, all on the same GPU in the same session.
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
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
echo "== GPU tests"
TESSERA_FIXTURES=$PWD/tests/fixtures timeout 300 "$test_bin" 2>&1 | tee "$out/gpu_tests.log" |
  grep -E "^\[  (PASSED|FAILED)|^\[ .*(fp32|bf16|trainer)|FAILED" | head -40
echo "== attention: tessera (bf16 flash, fp32 reference) and PyTorch SDPA"
timeout 60 "$bench/bench_gpu_attention" | tee "$out/attention.txt"
timeout 120 python3 bench/gpu/torch_attention.py 2>&1 | grep -v Warning | tee -a "$out/attention.txt"
echo "== training throughput: tessera"
timeout 200 "$bench/bench_gpu_train" --models gpt2-124m,gpt2-350m --batches 64,32,16,8 \
  --json "$out/tessera_train.jsonl" | tee "$out/tessera_train.txt"
echo "== training throughput: PyTorch eager and torch.compile"
PYTHONUNBUFFERED=1 timeout 420 python3 bench/gpu/torch_train_step.py \
  --models gpt2-124m,gpt2-350m,llama-160m --batches 64,32,16,8 2>&1 | grep -v -i warn |
  tee "$out/torch_train.txt" | tail -8
