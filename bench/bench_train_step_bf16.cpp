// bf16 mixed precision on the CPU against fp32: training steps of the GPT-2 124M shape (L=12,
// H=12, C=768, V=50257) in both precisions in the same run (alternating, so both see the same
// machine conditions), and the bf16 GEMM rate measured in the same run, so the bf16 step's
// fraction of it can be read.
//
//   bench_train_step_bf16 [--B 4] [--T 256] [--steps 3] [--layers 12] [--json FILE] [--shapes 1]
//
// --shapes 1 adds the rate of each of the step's GEMM shapes (forward, input gradient, weight
// gradient of every linear and of the head) in both precisions, and the GEMM time of a step they
// add up to, so a GEMM family slower than its parts' rates shows the rounding and bias passes.
//
// A step: zeroed gradients, forward, backward, global norm, AdamW with clipping and, in bf16, the
// refresh of the weights' bf16 copy from the fp32 masters (as the trainer does).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"

using namespace tessera;

namespace {

struct Args {
  int B = 4, T = 256, steps = 3, layers = 12, shapes = 0;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc || (s != "--B" && s != "--T" && s != "--steps" && s != "--layers" &&
                          s != "--json" && s != "--shapes")) {
      std::fprintf(stderr,
                   "usage: bench_train_step_bf16 [--B 4] [--T 256] [--steps 3] "
                   "[--layers 12] [--json FILE] [--shapes 1]\n");
      std::exit(2);
    }
    const std::string v = argv[++i];
    if (s == "--json")
      a.json = v;
    else
      (s == "--B"        ? a.B
       : s == "--T"      ? a.T
       : s == "--steps"  ? a.steps
       : s == "--layers" ? a.layers
                         : a.shapes) = std::atoi(v.c_str());
  }
  if (a.steps < 1 || a.B < 1 || a.T < 1 || a.layers < 1) {
    std::fprintf(stderr, "bench_train_step_bf16: --steps, --B, --T and --layers must be >= 1\n");
    std::exit(2);
  }
  return a;
}

// One precision's model state and the time per op family of its steps.
struct Run {
  Buffer<float> params, grads, m, v;
  Buffer<std::uint16_t> p16;  // bf16: the GEMMs' copy of params; empty in fp32
  model::Activations acts;
  kernels::Profile prof;
  std::vector<double> times;
};

// One training step (its seconds).
double step(const model::ParamLayout& layout, Run& r, const std::vector<std::int32_t>& x,
            const std::vector<std::int32_t>& y, int B, int T, int s) {
  model::ForwardOptions fo;
  fo.training = true;
  fo.dloss = 1.0f / (B * T);
  fo.profile = &r.prof;
  fo.bf16_params = r.p16.size() ? r.p16.data() : nullptr;
  Timer t;
  r.grads.zero();
  model::forward(layout, r.params.data(), r.acts, x.data(), y.data(), B, T, fo);
  model::backward(layout, r.params.data(), r.grads.data(), r.acts, x.data(), B, T, fo.gemm, &r.prof,
                  nullptr, fo.bf16_params);
  {
    kernels::ProfileScope ps(&r.prof, kernels::OpFamily::Optimizer);
    const double n = optim::global_norm(r.grads.data(), layout.total());
    optim::adamw_step(layout, r.params.data(), r.grads.data(), r.m.data(), r.v.data(),
                      optim::AdamWConfig{}, 1e-4f, s + 1, optim::clip_scale(n, 1.0));
    if (r.p16.size())
      kernels::cpu::to_bf16(r.p16.data(), r.params.data(),
                            static_cast<std::int64_t>(layout.total()));
  }
  return t.seconds();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_profile(const char* name, const Run& r) {
  const double per_step = [&] {
    double s = 0;
    for (double t : r.times) s += t;
    return s / r.times.size();
  }();
  std::printf("%s, where the time goes (mean per step):", name);
  for (int f = 0; f < static_cast<int>(kernels::OpFamily::Count); ++f) {
    const double s = r.prof.seconds[f] / r.times.size();
    if (s > 0.005 * per_step)
      std::printf(" %s %.0f ms (%.0f%%);",
                  kernels::op_family_name(static_cast<kernels::OpFamily>(f)), s * 1e3,
                  100 * s / per_step);
  }
  std::printf("\n");
}

// The step's GEMMs, shape by shape: y = x w^T (forward), dx = g w (input gradient) and
// dw += g^T x (weight gradient) of each linear (IC -> OC) over N rows, as the model calls them.
void print_shapes(const model::ModelConfig& cfg, std::int64_t N) {
  struct Linear {
    const char* name;
    std::int64_t ic, oc;
    int per_step;
  };
  const std::int64_t C = cfg.n_embd, L = cfg.n_layer;
  const Linear lins[] = {{"qkv", C, 3 * C, static_cast<int>(L)},
                         {"attn proj", C, C, static_cast<int>(L)},
                         {"mlp fc", C, 4 * C, static_cast<int>(L)},
                         {"mlp proj", 4 * C, C, static_cast<int>(L)},
                         {"head", C, cfg.padded_vocab(), 1}};
  std::printf("\nthe step's GEMMs, GFLOP/s (bf16 / fp32), N = %ld rows:\n", static_cast<long>(N));
  std::printf("  %-10s %6s %6s %15s %15s %15s\n", "linear", "IC", "OC", "forward", "input grad",
              "weight grad");
  double step16 = 0, step32 = 0;
  for (const Linear& l : lins) {
    Buffer<std::uint16_t> x16(N * l.ic), w16(l.oc * l.ic), g16(N * l.oc);
    Buffer<float> x(N * l.ic), w(l.oc * l.ic), g(N * l.oc), y(N * std::max(l.ic, l.oc));
    Buffer<float> dw(l.oc * l.ic);
    for (auto* b : {&x, &w, &g}) b->zero();
    for (auto* b : {&x16, &w16, &g16})
      std::fill(b->data(), b->data() + b->size(), std::uint16_t{0x3f80});
    dw.zero();
    const double flops = 2.0 * N * l.ic * l.oc;
    std::printf("  %-10s %6ld %6ld", l.name, static_cast<long>(l.ic), static_cast<long>(l.oc));
    for (int k = 0; k < 3; ++k) {
      const bool ta = k == 2, tb = k == 0;
      const std::int64_t m = k == 2 ? l.oc : N, n = k == 0 ? l.oc : l.ic,
                         kk = k == 1   ? l.oc
                              : k == 0 ? l.ic
                                       : N;
      const std::uint16_t* a16 = k == 0 ? x16.data() : g16.data();
      const std::uint16_t* b16 = k == 2 ? x16.data() : w16.data();
      const float* a32 = k == 0 ? x.data() : g.data();
      const float* b32 = k == 2 ? x.data() : w.data();
      float* out = k == 2 ? dw.data() : y.data();
      const std::int64_t lda = ta ? m : kk, ldb = tb ? kk : n;
      const float beta = k == 2 ? 1.0f : 0.0f;
      const double t16 = median_seconds(
          [&] { kernels::gemm_bf16(ta, tb, m, n, kk, 1.0f, a16, lda, b16, ldb, beta, out, n); }, 3,
          0.2);
      const double t32 = median_seconds(
          [&] {
            kernels::gemm(kernels::GemmLibrary::OneDnn, ta, tb, m, n, kk, 1.0f, a32, lda, b32, ldb,
                          beta, out, n);
          },
          3, 0.2);
      step16 += t16 * l.per_step, step32 += t32 * l.per_step;
      std::printf(" %7.0f / %5.0f", flops / t16 / 1e9, flops / t32 / 1e9);
    }
    std::printf("\n");
  }
  std::printf("  the step's GEMMs at these rates: bf16 %.0f ms, fp32 %.0f ms\n", step16 * 1e3,
              step32 * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int B = a.B, T = a.T;
  model::ModelConfig cfg{a.layers, 12, 768, 1024, 50257};
  model::ParamLayout layout(cfg);
  Run f32, b16;
  for (Run* r : {&f32, &b16}) {
    for (auto* b : {&r->params, &r->grads, &r->m, &r->v}) b->resize(layout.total());
    model::init_params(layout, r->params.data(), 1337);
  }
  b16.p16.resize(layout.total());
  kernels::cpu::to_bf16(b16.p16.data(), b16.params.data(),
                        static_cast<std::int64_t>(layout.total()));
  std::vector<std::int32_t> x(B * T), y(B * T);
  Rng rng(7);
  for (int i = 0; i < B * T; ++i)
    x[i] = static_cast<std::int32_t>(rng.next_u32() % 50257),
    y[i] = static_cast<std::int32_t>(rng.next_u32() % 50257);
  const double step_flops = 3.0 * model::forward_flops_per_token(cfg, T) * B * T;
  std::printf("GPT-2 shape L=%d H=12 C=768 V=50257, B=%d T=%d, %d threads, bf16 GEMMs: %s\n",
              a.layers, B, T, omp_get_max_threads(),
              std::string(kernels::bf16_gemm_unit()).c_str());
  for (int s = 0; s < a.steps + 1; ++s) {
    if (s == 1) f32.prof.reset(), b16.prof.reset();  // step 0 warms up both
    const double t32 = step(layout, f32, x, y, B, T, s);
    const double t16 = step(layout, b16, x, y, B, T, s);
    if (s > 0) f32.times.push_back(t32), b16.times.push_back(t16);
    std::printf("  step %d: fp32 %.0f ms, bf16 %.0f ms%s\n", s, t32 * 1e3, t16 * 1e3,
                s == 0 ? " (warm-up)" : "");
    std::fflush(stdout);
  }
  // The GEMM rates of one large matmul (the shape of the step's largest linear, the LM head's
  // forward: (B*T, C) x (C, Vp)) in each precision, measured after the steps.
  const std::int64_t M = static_cast<std::int64_t>(B) * T, N = cfg.padded_vocab(), K = cfg.n_embd;
  const double bf16_gemm = kernels::measure_gemm_bf16_gflops(true, M, N, K, 5, 2.0) * 1e9;
  const double fp32_gemm =
      kernels::measure_gemm_gflops(kernels::GemmLibrary::OneDnn, true, M, N, K, 5, 2.0) * 1e9;
  const double m32 = median(f32.times), m16 = median(b16.times);
  std::printf("\nstep (median of %d): fp32 %.0f ms, %.0f tokens/s, %.1f GFLOP/s achieved\n",
              a.steps, m32 * 1e3, B * T / m32, step_flops / m32 / 1e9);
  std::printf("                     bf16 %.0f ms, %.0f tokens/s, %.1f GFLOP/s achieved\n",
              m16 * 1e3, B * T / m16, step_flops / m16 / 1e9);
  std::printf("bf16 / fp32 throughput: %.2fx\n", m32 / m16);
  std::printf(
      "one large GEMM (%ld x %ld x %ld, weights transposed): bf16 %.1f GFLOP/s, fp32 %.1f "
      "GFLOP/s (%.2fx)\n",
      static_cast<long>(M), static_cast<long>(N), static_cast<long>(K), bf16_gemm / 1e9,
      fp32_gemm / 1e9, bf16_gemm / fp32_gemm);
  std::printf("fraction of the GEMM rate achieved by the step: bf16 %.3f, fp32 %.3f\n",
              step_flops / m16 / bf16_gemm, step_flops / m32 / fp32_gemm);
  print_profile("fp32", f32);
  print_profile("bf16", b16);
  if (a.shapes) print_shapes(cfg, M);
  if (!a.json.empty()) {
    std::ofstream j(a.json);
    j << "{\"B\":" << B << ",\"T\":" << T << ",\"layers\":" << a.layers
      << ",\"threads\":" << omp_get_max_threads()
      << ",\"native_bf16\":" << (kernels::cpu_has_native_bf16() ? "true" : "false")
      << ",\"fp32_step_ms\":" << m32 * 1e3 << ",\"bf16_step_ms\":" << m16 * 1e3
      << ",\"fp32_tokens_per_s\":" << B * T / m32 << ",\"bf16_tokens_per_s\":" << B * T / m16
      << ",\"bf16_gemm_gflops\":" << bf16_gemm / 1e9 << ",\"fp32_gemm_gflops\":" << fp32_gemm / 1e9
      << ",\"bf16_fraction\":" << step_flops / m16 / bf16_gemm << "}\n";
  }
  return 0;
}
