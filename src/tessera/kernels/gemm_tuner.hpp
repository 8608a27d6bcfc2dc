// GEMM layout tuning (AxoNN's tuned_matmul, papers.md §2.6, on the CPU libraries of gemm.hpp).
//
// A logical product C (M, N) = alpha * op(A) op(B) + beta * C can be computed by a row-major GEMM
// in several equivalent ways. A strategy (GemmChoice) is two independent decisions:
//  - operand layout: each operand is used as stored, or first copied into a scratch buffer as its
//    transpose, which flips its op flag (a "T" operand becomes an "N" one and the reverse). With
//    both flags this covers the NN / NT / TN / TT forms of AxoNN;
//  - the transposed problem: C^T (N, M) = op(B)^T op(A)^T is computed into a scratch C^T with
//    swapped operands and flags, then C = C^T^T + beta * C (alpha is applied by the GEMM).
// All strategies read the same A and B buffers and write the same C; they differ only in the
// order of the fp32 additions inside the library.
//
// GemmTuner::choose() times the candidates the first time a (library, shape) is seen, keeps the
// fastest, and GemmTuner::run() executes the cached choice from then on. Tuning runs on scratch
// data (never on the caller's buffers) within a fixed wall-time budget (GemmTunerOptions::
// budget_s, 0.25 s by default, whatever the core count):
//  1. screening: every candidate, round-robin, each time the minimum over its repetitions; a
//     shape larger than max_tune_flops is screened on a proxy with M or N (the larger) halved
//     until it fits (K, the reduction depth, is kept). Repetitions stop when the next round would
//     overrun the screening share of the budget (all of it for an unproxied shape, else 40%);
//  2. confirmation: when a proxy screening found a strategy faster than the direct call, the two
//     are timed again, alternately, on the largest shape of the same halving chain (up to the
//     real shape) that the rest of the budget affords, and the winner must win there too.
// A strategy other than the direct call is taken only when it is faster by min_gain (3%).
// The record of each tuned shape keeps every time measured (records()).
//
// The tuner is a value passed explicitly (no global state). It is NOT thread-safe: its cache and
// its scratch buffers are mutated by choose() and run(), so use one tuner from one thread (the
// GEMMs themselves still use every OpenMP thread). Threads that issue GEMMs concurrently need a
// tuner each.
//
// Memory: run() keeps scratch buffers as large as the largest transposed operand and, when the
// transposed problem is chosen, a C^T as large as C. They grow on demand and are kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/kernels/gemm.hpp"

namespace tessera::kernels {

// The logical product: C (M, N) = op(A) (M, K) * op(B) (K, N), op(X) = X^T when the flag is set.
struct GemmShape {
  bool ta = false;
  bool tb = false;
  std::int64_t M = 0;
  std::int64_t N = 0;
  std::int64_t K = 0;

  auto key() const { return std::tuple(ta, tb, M, N, K); }
  friend bool operator==(const GemmShape& a, const GemmShape& b) { return a.key() == b.key(); }
  friend bool operator<(const GemmShape& a, const GemmShape& b) { return a.key() < b.key(); }
};

// "NT 1024x2304x768" (form, then M x N x K).
std::string to_string(const GemmShape& s);

// One way to compute the product (see the top of this file).
struct GemmChoice {
  bool transpose_problem = false;  // compute C^T = op(B)^T op(A)^T into scratch, transpose back
  bool pack_a = false;             // copy A transposed into scratch first; flips A's flag
  bool pack_b = false;             // copy B transposed into scratch first; flips B's flag

  bool is_direct() const { return !transpose_problem && !pack_a && !pack_b; }
  auto key() const { return std::tuple(transpose_problem, pack_a, pack_b); }
  friend bool operator==(const GemmChoice& a, const GemmChoice& b) { return a.key() == b.key(); }
};

// The flags of the GEMM call that a choice issues for a shape: {trans_a, trans_b} of the call on
// (A, B), or of the call on (B, A) for the transposed problem.
std::pair<bool, bool> issued_form(const GemmShape& s, const GemmChoice& c);

// What a choice issues, e.g. "C=NT" (the direct call of an NT shape), "C=NN packB",
// "C^T=NT" (transposed problem, the call on (B, A) is NT), "C^T=TN packA,packB".
std::string describe(const GemmShape& s, const GemmChoice& c);

struct GemmTunerOptions {
  double budget_s = 0.25;         // wall time to tune one shape (screening + confirmation)
  int max_reps = 5;               // repetitions per candidate at most (at least 1 is always run)
  double max_tune_flops = 0.4e9;  // larger shapes are screened on an M,N-halved proxy (2*M*N*K)
  bool try_transposed_problem = true;
  bool try_layouts = true;  // the packed-operand forms
  // A strategy other than the direct call is chosen only when it is faster than the direct call
  // by at least this fraction, so that timing noise does not trade the direct call for an
  // equal-cost strategy that needs scratch memory.
  double min_gain = 0.03;
};

// Per-candidate timing of one tuned shape.
struct CandidateTime {
  GemmChoice choice;
  std::string name;      // describe(shape, choice)
  double seconds = 0.0;  // minimum over reps, per call, on the timed shape
  int reps = 0;
};

struct TuneRecord {
  GemmLibrary lib = GemmLibrary::OneDnn;
  GemmShape shape;  // the shape asked for
  GemmShape timed;  // the screened shape (== shape unless it was above max_tune_flops)
  std::vector<CandidateTime> candidates;  // candidates[0] is the direct call
  // Confirmation of a non-direct winner of a proxy screening on a larger shape (the largest that
  // the rest of the budget allows): minimum times of the direct call and of the winner there.
  bool confirmed = false;
  GemmShape confirm_shape;
  double confirm_direct_s = 0.0, confirm_best_s = 0.0;
  GemmChoice best;
  double tune_seconds = 0.0;  // whole tuning of this shape, setup included

  const CandidateTime& direct() const { return candidates.front(); }
  const CandidateTime& fastest() const;
};

class GemmTuner {
 public:
  explicit GemmTuner(GemmTunerOptions opt = {}) : opt_(opt) {}

  // The cached choice for (lib, shape); tunes it first if the shape is new. Degenerate shapes
  // (a zero dimension) are never tuned: they use the direct call.
  GemmChoice choose(GemmLibrary lib, const GemmShape& shape);

  // C = alpha * op(A) op(B) + beta * C with the row-major conventions of gemm(), computed with the
  // cached choice (tuning on first use). lda, ldb, ldc may exceed the minimum. As with gemm(),
  // beta == 0 means C is not read.
  void run(GemmLibrary lib, const GemmShape& shape, float alpha, const float* A, std::int64_t lda,
           const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

  // The same with a given choice, no tuning (tests, benchmarks).
  void run_with(GemmLibrary lib, const GemmShape& shape, const GemmChoice& choice, float alpha,
                const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                float* C, std::int64_t ldc);

  // The strategies tried for a shape under the options; the direct call comes first.
  std::vector<GemmChoice> candidates(const GemmShape& shape) const;

  // Sets a cache entry by hand (overrides tuning for that shape).
  void set_choice(GemmLibrary lib, const GemmShape& shape, const GemmChoice& choice);
  bool has_choice(GemmLibrary lib, const GemmShape& shape) const;
  std::size_t cache_size() const { return cache_.size(); }
  void clear() {
    cache_.clear();
    records_.clear();
  }

  // The timings of every shape tuned by this tuner (not those loaded from a file), in order.
  const std::vector<TuneRecord>& records() const { return records_; }

  // Persistence as a small JSON file: {"format": "tessera-gemm-tuner", "version": 1,
  // "entries": [{"lib", "threads", "ta", "tb", "M", "N", "K", "transpose_problem", "pack_a",
  // "pack_b"}]}. save() writes atomically. load() merges the entries into the cache and returns
  // how many it took; it throws tessera::Error naming the path when the file is missing,
  // unreadable, not JSON or not a tuner file, and skips (without error) entries that are
  // malformed, name an unknown library, or were tuned for another OpenMP thread count.
  void save(const std::filesystem::path& path) const;
  std::size_t load(const std::filesystem::path& path);

  const GemmTunerOptions& options() const { return opt_; }

 private:
  using Key = std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t>;
  static Key key(GemmLibrary lib, const GemmShape& s);
  TuneRecord tune(GemmLibrary lib, const GemmShape& shape);
  // tune()'s parts: operands of a shape, one timed call, the screening of every candidate on a
  // proxy shape, and the confirmation of its winner on a larger one (gemm_tuner.cpp).
  struct Scratch;
  void call(GemmLibrary lib, Scratch& x, const GemmChoice& c);
  void grow_scratch(const GemmShape& g);
  std::size_t screen(TuneRecord& rec, const std::vector<GemmChoice>& cands, double budget);
  std::size_t confirm(TuneRecord& rec, const std::vector<GemmChoice>& cands, std::size_t best,
                      const std::vector<GemmShape>& chain, std::size_t screen_at, double left);

  GemmTunerOptions opt_;
  struct Entry {
    GemmChoice choice;
    int threads = 0;  // OpenMP threads when it was tuned (saved, checked on load)
  };
  std::map<Key, Entry> cache_;
  std::vector<TuneRecord> records_;
  Buffer<float> pack_a_, pack_b_, ct_;  // scratch of run_with, grown on demand
};

// dst (cols, rows) = src (rows, cols)^T; src has leading dimension lds, dst ldd. OpenMP, blocked.
void transpose_matrix(std::int64_t rows, std::int64_t cols, const float* src, std::int64_t lds,
                      float* dst, std::int64_t ldd);

}  // namespace tessera::kernels
