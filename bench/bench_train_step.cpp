// Training-step throughput of the GPT-2 124M shape (L=12, H=12, C=768, V=50257) on this machine,
// against the fp32 GEMM rate measured in the same run on the same GEMM shapes.
//
//   bench_train_step [--B 4] [--T 256] [--steps 3] [--gemm onednn|openblas] [--layers 12]
//                    [--json FILE]
//
// Reports: tokens/s, achieved FLOP/s (the step's FLOPs / its time), the GEMM-only rate of the
// step's own GEMM shapes, their ratio (the roofline fraction), and the time per op family.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"

using namespace tessera;

namespace {

struct GemmShape {
  bool ta, tb;
  long M, N, K;
  double beta;
};

// The GEMMs one training step issues for the linear layers and the LM head (attention's
// per-head GEMMs are small and counted with attention).
std::vector<GemmShape> step_gemms(const model::ModelConfig& c, int B, int T) {
  long N = static_cast<long>(B) * T, C = c.n_embd, Vp = c.padded_vocab();
  std::vector<std::pair<long, long>> lin = {
      {C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};  // (IC, OC)
  std::vector<GemmShape> out;
  for (int l = 0; l < c.n_layer; ++l)
    for (auto [ic, oc] : lin) {
      out.push_back({false, true, N, oc, ic, 0});   // forward
      out.push_back({false, false, N, ic, oc, 0});  // dinp
      out.push_back({true, false, oc, ic, N, 1});   // dweight
    }
  out.push_back({false, true, N, Vp, C, 0});
  out.push_back({false, false, N, C, Vp, 0});
  out.push_back({true, false, Vp, C, N, 1});
  return out;
}

// Times `reps` passes over the step's GEMM shapes (after one warm-up pass); returns the median
// rate. Called between training steps so both see the same machine conditions.
double gemm_only_rate(kernels::GemmLibrary lib, const std::vector<GemmShape>& shapes, int reps,
                      double* flops_out) {
  std::size_t maxa = 0, maxb = 0, maxc = 0;
  for (auto& s : shapes) {
    maxa = std::max<std::size_t>(maxa, s.M * s.K);
    maxb = std::max<std::size_t>(maxb, s.K * s.N);
    maxc = std::max<std::size_t>(maxc, s.M * s.N);
  }
  Buffer<float> a(maxa), b(maxb), c(maxc);
  Rng rng(3);
  for (std::size_t i = 0; i < maxa; ++i) a[i] = rng.uniform() - 0.5f;
  for (std::size_t i = 0; i < maxb; ++i) b[i] = rng.uniform() - 0.5f;
  double flops = 0;
  for (auto& s : shapes) flops += 2.0 * s.M * s.N * s.K;
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    Timer t;
    for (auto& s : shapes)
      kernels::gemm(lib, s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), s.ta ? s.M : s.K, b.data(),
                    s.tb ? s.K : s.N, static_cast<float>(s.beta), c.data(), s.N);
    if (r > 0) times.push_back(t.seconds());  // first pass warms up
  }
  std::sort(times.begin(), times.end());
  *flops_out = flops;
  return flops / times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int B = 4, T = 256, steps = 3, layers = 12;
  std::string gemm_name = "onednn", json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--B")
      B = std::atoi(next().c_str());
    else if (a == "--T")
      T = std::atoi(next().c_str());
    else if (a == "--steps")
      steps = std::atoi(next().c_str());
    else if (a == "--layers")
      layers = std::atoi(next().c_str());
    else if (a == "--gemm")
      gemm_name = next();
    else if (a == "--json")
      json_path = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_train_step [--B 4] [--T 256] [--steps 3] [--layers 12] [--gemm "
                   "onednn|openblas] [--json FILE]\n");
      return 2;
    }
  }
  auto lib = kernels::parse_gemm_library(gemm_name);
  model::ModelConfig cfg{layers, 12, 768, 1024, 50257};
  model::ParamLayout layout(cfg);
  Buffer<float> params(layout.total()), grads(layout.total()), m(layout.total()), v(layout.total());
  model::init_params(layout, params.data(), 1337);
  model::Activations acts;
  std::vector<std::int32_t> x(B * T), y(B * T);
  Rng rng(7);
  for (int i = 0; i < B * T; ++i)
    x[i] = static_cast<std::int32_t>(rng.next_u32() % 50257),
    y[i] = static_cast<std::int32_t>(rng.next_u32() % 50257);
  const double step_flops = 3.0 * model::forward_flops_per_token(cfg, T) * B * T;
  optim::AdamWConfig ac;
  kernels::Profile prof;
  model::ForwardOptions fo;
  fo.gemm = lib;
  fo.training = true;
  fo.dloss = 1.0f / (B * T);
  std::vector<double> times, gemm_rates;
  double gemm_flops = 0;
  auto shapes = step_gemms(cfg, B, T);
  std::printf("GPT-2 shape L=%d H=12 C=768 V=50257, B=%d T=%d, fp32, %d threads, GEMM %s\n", layers,
              B, T, omp_get_max_threads(), std::string(kernels::gemm_library_name(lib)).c_str());
  for (int s = 0; s < steps + 1; ++s) {
    if (s == 1) prof.reset();  // step 0 warms up (allocation, first-touch)
    fo.profile = &prof;
    Timer t;
    grads.zero();
    model::forward(layout, params.data(), acts, x.data(), y.data(), B, T, fo);
    model::backward(layout, params.data(), grads.data(), acts, x.data(), B, T, lib, &prof);
    {
      kernels::ProfileScope ps(&prof, kernels::OpFamily::Optimizer);
      double n = optim::global_norm(grads.data(), layout.total());
      optim::adamw_step(layout, params.data(), grads.data(), m.data(), v.data(), ac, 1e-4f, s + 1,
                        optim::clip_scale(n, 1.0));
    }
    double sec = t.seconds();
    if (s > 0) times.push_back(sec);
    double gemm_rate = 0;
    if (s > 0) gemm_rates.push_back(gemm_rate = gemm_only_rate(lib, shapes, 1, &gemm_flops));
    std::printf("  step %d: %.0f ms%s", s, sec * 1e3, s == 0 ? " (warm-up)\n" : "");
    if (s > 0)
      std::printf(", then GEMM-only pass %.1f GFLOP/s -> ratio %.3f\n", gemm_rate / 1e9,
                  step_flops / sec / gemm_rate);
    std::fflush(stdout);
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double med = sorted[sorted.size() / 2];
  std::sort(gemm_rates.begin(), gemm_rates.end());
  double rate_used = gemm_rates[gemm_rates.size() / 2];
  auto other_lib = lib == kernels::GemmLibrary::OneDnn ? kernels::GemmLibrary::OpenBlas
                                                       : kernels::GemmLibrary::OneDnn;
  double rate_other = gemm_only_rate(other_lib, shapes, 2, &gemm_flops);
  double rate_dnnl = lib == kernels::GemmLibrary::OneDnn ? rate_used : rate_other;
  double rate_blas = lib == kernels::GemmLibrary::OneDnn ? rate_other : rate_used;
  double achieved = step_flops / med;
  std::printf(
      "\nstep (median of %d): %.0f ms, %.0f tokens/s, %.1f GFLOP/step, %.1f GFLOP/s achieved\n",
      steps, med * 1e3, B * T / med, step_flops / 1e9, achieved / 1e9);
  std::printf(
      "GEMM-only rate on the step's GEMM shapes (%.1f GFLOP; median of the passes between steps "
      "for %s, one pass after for the other): onednn %.1f GFLOP/s, openblas %.1f GFLOP/s\n",
      gemm_flops / 1e9, std::string(kernels::gemm_library_name(lib)).c_str(), rate_dnnl / 1e9,
      rate_blas / 1e9);
  std::printf("roofline fraction (achieved / GEMM-only rate of %s): %.3f\n",
              std::string(kernels::gemm_library_name(lib)).c_str(), achieved / rate_used);
  double per_step_total = 0;
  for (double t : times) per_step_total += t;
  std::printf("\nwhere the time goes (mean per step):\n");
  for (int f = 0; f < static_cast<int>(kernels::OpFamily::Count); ++f) {
    double s = prof.seconds[f] / times.size();
    std::printf("  %-14s %8.1f ms  %5.1f%%\n",
                kernels::op_family_name(static_cast<kernels::OpFamily>(f)), s * 1e3,
                100 * s / (per_step_total / times.size()));
  }
  double other = per_step_total / times.size() - prof.total() / times.size();
  std::printf("  %-14s %8.1f ms  %5.1f%%\n", "other", other * 1e3,
              100 * other / (per_step_total / times.size()));
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    j << "{\"B\":" << B << ",\"T\":" << T << ",\"layers\":" << layers
      << ",\"step_ms\":" << med * 1e3 << ",\"tokens_per_s\":" << B * T / med
      << ",\"achieved_gflops\":" << achieved / 1e9
      << ",\"gemm_only_gflops_onednn\":" << rate_dnnl / 1e9
      << ",\"gemm_only_gflops_openblas\":" << rate_blas / 1e9
      << ",\"roofline_fraction\":" << achieved / rate_used << "}\n";
  }
  return 0;
}
