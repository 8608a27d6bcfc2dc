// The GEMM layout tuner's gain on the GEMMs of one GPT-2 124M training step (B=4, T=256: 1024
// tokens; C=768, padded vocab 50304, 12 layers), on this machine.
//
//   bench_gemm_tuner [--gemm onednn|openblas] [--reps 5] [--save FILE]
//
// For each distinct shape: the linear layers' forward (NT), input-gradient (NN) and weight-
// gradient (TN, beta=1) GEMMs for (OC, IC) in {(2304,768), (768,768), (3072,768), (768,3072)},
// and the LM head (1024, 50304, 768) in the same three forms. The tuner tunes each shape once
// (its time is printed), then the direct call and the tuned choice are run alternately `reps`
// times on the same full-size operands and the medians are compared. The step total weights
// each linear shape by the 12 layers and the LM head by 1.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/gemm_tuner.hpp"

using namespace tessera;
using kernels::GemmShape;

namespace {

struct StepGemm {
  const char* what;
  GemmShape shape;
  float beta;
  int count;  // per training step
};

std::vector<StepGemm> step_gemms() {
  const std::int64_t BT = 4 * 256, L = 12, Vp = 50304, C = 768;
  const std::int64_t lin[][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};  // (OC, IC)
  const char* names[] = {"qkv", "attproj", "fc", "fcproj"};
  std::vector<StepGemm> out;
  for (int i = 0; i < 4; ++i) {
    const std::int64_t oc = lin[i][0], ic = lin[i][1];
    out.push_back({names[i], {false, true, BT, oc, ic}, 0.0f, static_cast<int>(L)});   // forward
    out.push_back({names[i], {false, false, BT, ic, oc}, 0.0f, static_cast<int>(L)});  // dinp
    out.push_back({names[i], {true, false, oc, ic, BT}, 1.0f, static_cast<int>(L)});   // dweight
  }
  out.push_back({"lmhead", {false, true, BT, Vp, C}, 0.0f, 1});
  out.push_back({"lmhead", {false, false, BT, C, Vp}, 0.0f, 1});
  out.push_back({"lmhead", {true, false, Vp, C, BT}, 1.0f, 1});
  return out;
}

std::string where(const kernels::TuneRecord& r) {
  std::string out = r.timed == r.shape ? "full shape" : kernels::to_string(r.timed);
  if (r.confirmed)
    out += " / " +
           (r.confirm_shape == r.shape ? std::string("full shape")
                                       : kernels::to_string(r.confirm_shape)) +
           " (" + std::to_string(r.confirm_direct_s * 1e3).substr(0, 6) + " vs " +
           std::to_string(r.confirm_best_s * 1e3).substr(0, 6) + " ms)";
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void fill(Buffer<float>& b, std::size_t n, Rng& rng) {
  b.resize(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = 0.02f * rng.normal();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    kernels::GemmLibrary lib = kernels::GemmLibrary::OneDnn;
    int reps = 5;
    std::string save_path;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw Error("missing value after " + a);
        return argv[++i];
      };
      if (a == "--gemm") {
        lib = kernels::parse_gemm_library(next());
      } else if (a == "--reps") {
        reps = std::max(1, std::atoi(next().c_str()));
      } else if (a == "--save") {
        save_path = next();
      } else {
        throw Error("unknown argument " + a, "use --gemm onednn|openblas, --reps N, --save FILE");
      }
    }

    std::printf(
        "GEMM layout tuner on a GPT-2 124M step (B=4, T=256), %s, %d OpenMP threads, %d "
        "alternating reps (medians)\n\n",
        std::string(kernels::gemm_library_name(lib)).c_str(), omp_get_max_threads(), reps);
    kernels::GemmTuner tuner;
    Rng rng(7);
    double step_direct = 0.0, step_tuned = 0.0, tune_total = 0.0;
    std::printf("%-8s %-20s %5s %10s %-22s %10s %7s %8s  %s\n", "layer", "shape", "count",
                "direct ms", "tuned choice", "tuned ms", "gain", "tune s",
                "screened on / confirmed on");
    for (const StepGemm& g : step_gemms()) {
      const GemmShape& s = g.shape;
      const std::int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N, ldc = s.N;
      Buffer<float> A, B, C;
      fill(A, static_cast<std::size_t>(s.M * s.K), rng);
      fill(B, static_cast<std::size_t>(s.K * s.N), rng);
      fill(C, static_cast<std::size_t>(s.M * s.N), rng);

      const kernels::GemmChoice choice = tuner.choose(lib, s);
      const kernels::TuneRecord& rec = tuner.records().back();
      tune_total += rec.tune_seconds;

      auto direct = [&] {
        kernels::gemm(lib, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, g.beta,
                      C.data(), ldc);
      };
      auto tuned = [&] {
        tuner.run(lib, s, 1.0f, A.data(), lda, B.data(), ldb, g.beta, C.data(), ldc);
      };
      direct();  // warm-up of both (first touch of the tuner's full-size scratch)
      tuned();
      std::vector<double> td, tt;
      for (int r = 0; r < reps; ++r) {
        Timer t;
        direct();
        td.push_back(t.seconds());
        t.reset();
        tuned();
        tt.push_back(t.seconds());
      }
      const double md = median(td), mt = median(tt);
      step_direct += g.count * md;
      step_tuned += g.count * mt;
      std::printf("%-8s %-20s %5d %10.3f %-22s %10.3f %+6.1f%% %8.3f  %s\n", g.what,
                  kernels::to_string(s).c_str(), g.count, md * 1e3,
                  kernels::describe(s, choice).c_str(), mt * 1e3, 100.0 * (md - mt) / md,
                  rec.tune_seconds, where(rec).c_str());
    }

    std::printf("\ncandidate timings at tuning (ms per call on the timed shape; * = chosen)\n");
    for (const auto& rec : tuner.records()) {
      std::printf("%-20s", kernels::to_string(rec.shape).c_str());
      for (const auto& c : rec.candidates)
        std::printf(" | %s%s %.3f", c.choice == rec.best ? "*" : "", c.name.c_str(),
                    c.seconds * 1e3);
      std::printf("\n");
    }

    std::printf(
        "\nstep GEMM time: direct %.1f ms, tuned %.1f ms, gain %+.1f%% (tuning %.2f s "
        "once for %zu shapes)\n",
        step_direct * 1e3, step_tuned * 1e3, 100.0 * (step_direct - step_tuned) / step_direct,
        tune_total, tuner.records().size());
    if (!save_path.empty()) {
      tuner.save(save_path);
      std::printf("saved the choices to %s\n", save_path.c_str());
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", format_error_line(e).c_str());
    return 2;
  }
}
