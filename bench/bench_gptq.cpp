// GPTQ wall time on the GPT-2 124M shape (12 layers, C = 768, 48 linears) with 128 x 512
// calibration tokens, W4 group 128, sequential block by block (each block calibrated on the
// outputs of the already-quantized blocks), as `tessera quantize --method gptq` runs it.
//
//   bench_gptq [--layers 12] [--nsamples 128] [--seqlen 512] [--json FILE]
//
// The weights are GPT-2's random initialization and the calibration tokens uniform random ids:
// the work (block forwards, Hessian GEMMs, Cholesky factorizations, column sweeps) does not
// depend on the values. Reports the total and its parts: the whole-model forward of the same
// tokens (the reference measured in the same run, so the ratio travels across machines), and
// the time per block. --layers N < 12 times the first N blocks only (for a quick look).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/model/gpt.hpp"
#include "tessera/quant/calibration.hpp"
#include "tessera/quant/quantize.hpp"
#include "tessera/quant/runner.hpp"

using namespace tessera;

int main(int argc, char** argv) {
  int layers = 12, nsamples = 128, seqlen = 512;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--layers")
      layers = std::atoi(argv[i + 1]);
    else if (a == "--nsamples")
      nsamples = std::atoi(argv[i + 1]);
    else if (a == "--seqlen")
      seqlen = std::atoi(argv[i + 1]);
    else if (a == "--json")
      json = argv[i + 1];
  }
  model::ModelConfig cfg{layers, 12, 768, 1024, 50257};
  model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  model::init_params(layout, params.data(), 1);
  auto calib = quant::make_calibration("random", nsamples, seqlen, 0, cfg.vocab_size);
  using clock = std::chrono::steady_clock;
  std::printf(
      "GPTQ W4 g128 on the GPT-2 124M shape (%d of 12 layers), %d x %d calibration "
      "tokens, %d threads\n",
      layers, nsamples, seqlen, omp_get_max_threads());
  // Reference: one forward of every block over the same tokens (no LM head), micro-batches of 8.
  auto t0 = clock::now();
  {
    quant::Runner run(layout);
    quant::Hooks none;
    std::vector<float> x(static_cast<std::size_t>(8) * seqlen * cfg.n_embd);
    for (int s = 0; s < nsamples; s += 8) {
      run.embed(params.data(), calib.tokens.data() + static_cast<std::size_t>(s) * seqlen, 8,
                seqlen, x.data());
      for (int l = 0; l < layers; ++l) run.block(params.data(), l, x.data(), 8, seqlen, none);
    }
  }
  const double fwd = std::chrono::duration<double>(clock::now() - t0).count();
  quant::QuantizeOptions o;
  o.method = quant::Method::Gptq;
  o.wq = quant::WeightQuant{4, 128, false};
  auto t1 = clock::now();
  auto qm = quant::quantize_model(layout, params.data(), o, &calib);
  const double total = std::chrono::duration<double>(clock::now() - t1).count();
  std::printf("forward of the calibration tokens through %d blocks: %.1f s\n", layers, fwd);
  std::printf("GPTQ, all %zu linears: %.1f s (%.1f s per block; %.2fx the forward)\n",
              qm.linears.size(), total, total / layers, total / fwd);
  if (layers < 12)
    std::printf("estimated for 12 layers: %.0f s (%.1f min)\n", total / layers * 12,
                total / layers * 12 / 60);
  if (!json.empty()) {
    if (FILE* f = std::fopen(json.c_str(), "w")) {
      std::fprintf(f,
                   "{\"layers\": %d, \"nsamples\": %d, \"seqlen\": %d, \"threads\": %d, "
                   "\"forward_s\": %.3f, \"gptq_s\": %.3f}\n",
                   layers, nsamples, seqlen, omp_get_max_threads(), fwd, total);
      std::fclose(f);
    }
  }
  return 0;
}
