// Packed quantized linears on SmolLM2-135M's shapes: decode matrix-vector (y = W x) and prefill
// matrix-matrix (Y = X W^T) at fp32 (oneDNN, what model::Decoder runs today), W8 per channel and
// W4 g128 asym (quant::packed_matvec / packed_matmul), in one run.
//
//   bench_packed [--threads 2] [--ring_mib 2048] [--stream_mib 4096] [--prefill 128] [--isa best]
//
// Decode is memory-bound: each product reads its whole weight once. To time it from memory and
// not from the caches, every product cycles through copies of its weight that add up to
// --ring_mib (set it above the last-level cache). The memory bandwidth it is compared with is
// measured in the same run: a parallel read (sum) of a --stream_mib buffer, best of 5. GB/s
// counts the bytes of the weight as stored (codes, scales, zeros). "tok/s" is one token through
// the 30 layers (qkv, o, gate_up, down: the products the decoder calls) and the 49152 x 576 head at
// these rates. Prefill: --prefill tokens at once, GFLOP/s = 2 N OC IC / time (counting the
// int8 products as operations too), beside oneDNN's fp32 GEMM.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_memory.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/quant/packed.hpp"

using namespace tessera;

namespace {

// Median seconds of f() over at least 5 runs and 0.3 s, after 2 warm-up runs.
template <typename F>
double time_median(F&& f) {
  return median_seconds(f, 5, 0.3);
}

struct Shape {
  const char* name;
  int oc, ic, per_token;  // per_token: how many of it one token reads (30 layers)
};

struct Result {
  double decode_s = 0, bytes = 0, prefill_gflops = 0;
};

std::vector<float> random_weight(int oc, int ic, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> W(static_cast<std::size_t>(oc) * ic);
  for (float& v : W) v = nd(rng);
  return W;
}

int ring_size(double bytes, int ring_mib) {
  return std::max(1, static_cast<int>(ring_mib * 1048576.0 / bytes));
}

Result bench_fp32(const Shape& s, const std::vector<float>& W, int ring_mib, int N) {
  Result r;
  r.bytes = 4.0 * W.size();
  std::vector<std::vector<float>> ring(ring_size(r.bytes, ring_mib), W);
  std::vector<float> x(s.ic, 0.1f), y(s.oc), X(std::size_t(N) * s.ic, 0.1f),
      Y(std::size_t(N) * s.oc);
  std::size_t k = 0;
  r.decode_s = time_median([&] {
    const auto& w = ring[k++ % ring.size()];
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, 1, s.oc, s.ic, 1.0f, x.data(), s.ic,
                  w.data(), s.ic, 0.0f, y.data(), s.oc);
  });
  const double t = time_median([&] {
    kernels::gemm(kernels::GemmLibrary::OneDnn, false, true, N, s.oc, s.ic, 1.0f, X.data(), s.ic,
                  W.data(), s.ic, 0.0f, Y.data(), s.oc);
  });
  r.prefill_gflops = 2.0 * N * s.oc * s.ic / t / 1e9;
  return r;
}

// a8: int8 activations (packed_matvec_q8, packed_matmul_q8), else fp32 activations
// (packed_matvec, packed_matmul).
Result bench_packed(const Shape& s, const std::vector<float>& W, quant::WeightQuant wq,
                    int ring_mib, int N, quant::Isa isa, bool a8) {
  const quant::PackedLinear p = quant::pack(quant::rtn(W.data(), s.oc, s.ic, wq));
  Result r;
  r.bytes = static_cast<double>(p.bytes());
  std::vector<quant::PackedLinear> ring(ring_size(r.bytes, ring_mib), p);
  std::vector<float> x(s.ic, 0.1f), y(s.oc), X(std::size_t(N) * s.ic, 0.1f),
      Y(std::size_t(N) * s.oc);
  std::size_t k = 0;
  r.decode_s = time_median([&] {
    const auto& w = ring[k++ % ring.size()];
    if (a8)
      quant::packed_matvec_q8(w, y.data(), x.data(), nullptr, isa);
    else
      quant::packed_matvec(w, y.data(), x.data(), nullptr, isa);
  });
  const double t = time_median([&] {
    if (a8)
      quant::packed_matmul_q8(p, Y.data(), X.data(), nullptr, N, isa);
    else
      quant::packed_matmul(p, Y.data(), X.data(), nullptr, N, isa);
  });
  r.prefill_gflops = 2.0 * N * s.oc * s.ic / t / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, ring_mib = 2048, stream_mib = 4096, prefill = 128;
  std::string isa_arg = "best";
  bench::Options()
      .add("threads", threads)
      .add("ring_mib", ring_mib)
      .add("stream_mib", stream_mib)
      .add("prefill", prefill)
      .add("isa", isa_arg)
      .parse(argc, argv);
  omp_set_num_threads(threads);
  quant::Isa isa = quant::best_isa();
  if (isa_arg == "avx2")
    isa = quant::Isa::Avx2;
  else if (isa_arg == "portable")
    isa = quant::Isa::Portable;
  else if (isa_arg == "avx512")
    isa = quant::Isa::Avx512;
  const double bw = bench::stream_read_gbs(stream_mib);
  std::printf(
      "packed kernels: %s, %d threads; memory read bandwidth %.1f GB/s (%d MiB, best of 5); "
      "decode weights cycled over %d MiB; prefill N = %d; int8 activations: %s; prompt kernel %s\n",
      quant::isa_name(isa), threads, bw, stream_mib, ring_mib, prefill, quant::q8_dot_name(isa),
      isa == quant::Isa::Avx512 ? quant::describe_prompt_width().c_str() : "256-bit");
  const Shape shapes[] = {{"qkv 960x576", 960, 576, 30},
                          {"o 576x576", 576, 576, 30},
                          {"gate_up 3072x576", 3072, 576, 30},
                          {"down 576x1536", 576, 1536, 30},
                          {"head 49152x576", 49152, 576, 1}};
  // a16: fp32 activations (the prefill: tiles decoded to fp32, oneDNN's sgemm); a8: int8
  // activations per block of 32 (the prefill: the integer kernel over runs of tiles).
  const char* fmts[] = {"fp32", "W8A16 pc", "W4A16 g128", "W8A8 pc", "W4A8 g128"};
  constexpr int kF = 5;
  double token_s[kF] = {0, 0, 0, 0, 0};
  std::printf("\n%-18s %-10s %9s %10s %8s %7s %12s %9s\n", "shape", "format", "MB", "decode us",
              "GB/s", "of bw", "prefill GF/s", "vs fp32");
  std::mt19937 rng(0);
  for (const Shape& s : shapes) {
    const std::vector<float> W = random_weight(s.oc, s.ic, rng);
    const quant::WeightQuant w8{8, -1, true}, w4{4, 128, false};
    Result res[kF] = {bench_fp32(s, W, ring_mib, prefill),
                      bench_packed(s, W, w8, ring_mib, prefill, isa, false),
                      bench_packed(s, W, w4, ring_mib, prefill, isa, false),
                      bench_packed(s, W, w8, ring_mib, prefill, isa, true),
                      bench_packed(s, W, w4, ring_mib, prefill, isa, true)};
    for (int f = 0; f < kF; ++f) {
      const Result& r = res[f];
      const double gbs = r.bytes / r.decode_s / 1e9;
      token_s[f] += r.decode_s * s.per_token;
      std::printf("%-18s %-10s %9.2f %10.1f %8.1f %6.0f%% %12.1f %8.2fx\n", s.name, fmts[f],
                  r.bytes / 1e6, r.decode_s * 1e6, gbs, 100 * gbs / bw, r.prefill_gflops,
                  r.prefill_gflops / res[0].prefill_gflops);
    }
  }
  std::printf("\none token of SmolLM2-135M (30 layers + head, linears only):\n");
  for (int f = 0; f < kF; ++f)
    std::printf("  %-10s %8.2f ms  %7.1f tok/s  (%.2fx fp32)\n", fmts[f], token_s[f] * 1e3,
                1.0 / token_s[f], token_s[0] / token_s[f]);
  return 0;
}
