#include "tessera/kernels/gemm_tuner.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"

namespace tessera::kernels {

namespace {

constexpr std::int64_t k_tile = 64;

char form_letter(bool t) {
  return t ? 'T' : 'N';
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Stored extent (rows, cols) of A and B for a shape.
std::int64_t a_rows(const GemmShape& s) {
  return s.ta ? s.K : s.M;
}
std::int64_t a_cols(const GemmShape& s) {
  return s.ta ? s.M : s.K;
}
std::int64_t b_rows(const GemmShape& s) {
  return s.tb ? s.N : s.K;
}
std::int64_t b_cols(const GemmShape& s) {
  return s.tb ? s.K : s.N;
}

#ifdef __AVX__
// The 8 x 8 block at d (rows ldd apart) = the block at s (rows lds apart) transposed, + beta * d
// (beta == 0: d is not read): register transposes by unpacks, shuffles and lane permutes.
inline void transpose8x8(const float* s, std::int64_t lds, float* d, std::int64_t ldd, float beta) {
  __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lds);
  __m256 r2 = _mm256_loadu_ps(s + 2 * lds), r3 = _mm256_loadu_ps(s + 3 * lds);
  __m256 r4 = _mm256_loadu_ps(s + 4 * lds), r5 = _mm256_loadu_ps(s + 5 * lds);
  __m256 r6 = _mm256_loadu_ps(s + 6 * lds), r7 = _mm256_loadu_ps(s + 7 * lds);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 out[8] = {
      _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
      _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
      _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
      _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
  const __m256 vb = _mm256_set1_ps(beta);
  for (int k = 0; k < 8; ++k) {
    float* dk = d + k * ldd;
    if (beta == 0.0f)
      _mm256_storeu_ps(dk, out[k]);
    else
      _mm256_storeu_ps(dk, _mm256_add_ps(out[k], _mm256_mul_ps(vb, _mm256_loadu_ps(dk))));
  }
}
#endif

// dst (cols, rows) = src (rows, cols)^T + beta * dst; beta == 0: dst is not read. Tiles of
// k_tile x k_tile per OpenMP task, 8x8 register transposes inside (AVX), scalar edges.
void transpose_into(std::int64_t rows, std::int64_t cols, const float* src, std::int64_t lds,
                    float* dst, std::int64_t ldd, float beta) {
  const std::int64_t tr = (rows + k_tile - 1) / k_tile, tc = (cols + k_tile - 1) / k_tile;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bi = 0; bi < tr; ++bi) {
    for (std::int64_t bj = 0; bj < tc; ++bj) {
      const std::int64_t i0 = bi * k_tile, j0 = bj * k_tile;
      const std::int64_t i1 = std::min(rows, i0 + k_tile), j1 = std::min(cols, j0 + k_tile);
      std::int64_t i8 = i0, j8 = j0;
#ifdef __AVX__
      i8 = i0 + (i1 - i0) / 8 * 8;
      j8 = j0 + (j1 - j0) / 8 * 8;
      for (std::int64_t i = i0; i < i8; i += 8)
        for (std::int64_t j = j0; j < j8; j += 8)
          transpose8x8(src + i * lds + j, lds, dst + j * ldd + i, ldd, beta);
#endif
      // Edges not covered by 8x8 blocks: columns [j8, j1) of every row, rows [i8, i1) of the rest.
      auto one = [&](std::int64_t i, std::int64_t j) {
        float* d = dst + j * ldd + i;
        *d = beta == 0.0f ? src[i * lds + j] : src[i * lds + j] + beta * *d;
      };
      for (std::int64_t j = j8; j < j1; ++j)
        for (std::int64_t i = i0; i < i1; ++i) one(i, j);
      for (std::int64_t j = j0; j < j8; ++j)
        for (std::int64_t i = i8; i < i1; ++i) one(i, j);
    }
  }
}

float* ensure(Buffer<float>& buf, std::int64_t n) {
  if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

}  // namespace

void transpose_matrix(std::int64_t rows, std::int64_t cols, const float* src, std::int64_t lds,
                      float* dst, std::int64_t ldd) {
  transpose_into(rows, cols, src, lds, dst, ldd, 0.0f);
}

std::string to_string(const GemmShape& s) {
  return fmt::format("{}{} {}x{}x{}", form_letter(s.ta), form_letter(s.tb), s.M, s.N, s.K);
}

std::pair<bool, bool> issued_form(const GemmShape& s, const GemmChoice& c) {
  const bool fa = s.ta != c.pack_a, fb = s.tb != c.pack_b;  // flags on (A, B) after packing
  if (!c.transpose_problem) return {fa, fb};
  return {!fb, !fa};  // C^T = op(B)^T op(A)^T: the call on (B, A)
}

std::string describe(const GemmShape& s, const GemmChoice& c) {
  auto [f1, f2] = issued_form(s, c);
  std::string out =
      fmt::format("{}={}{}", c.transpose_problem ? "C^T" : "C", form_letter(f1), form_letter(f2));
  if (c.pack_a && c.pack_b) {
    out += " packA,packB";
  } else if (c.pack_a) {
    out += " packA";
  } else if (c.pack_b) {
    out += " packB";
  }
  return out;
}

const CandidateTime& TuneRecord::fastest() const {
  for (const auto& c : candidates)
    if (c.choice == best) return c;
  return candidates.front();
}

GemmTuner::Key GemmTuner::key(GemmLibrary lib, const GemmShape& s) {
  return Key(static_cast<int>(lib), s.ta, s.tb, s.M, s.N, s.K);
}

std::vector<GemmChoice> GemmTuner::candidates(const GemmShape&) const {
  std::vector<GemmChoice> out;
  for (int tp = 0; tp < (opt_.try_transposed_problem ? 2 : 1); ++tp) {
    for (int pa = 0; pa < (opt_.try_layouts ? 2 : 1); ++pa) {
      for (int pb = 0; pb < (opt_.try_layouts ? 2 : 1); ++pb) {
        out.push_back(GemmChoice{tp != 0, pa != 0, pb != 0});
      }
    }
  }
  return out;  // out[0] is {false, false, false}: the direct call
}

void GemmTuner::run_with(GemmLibrary lib, const GemmShape& s, const GemmChoice& c, float alpha,
                         const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                         float beta, float* C, std::int64_t ldc) {
  TESSERA_CHECK(s.M >= 0 && s.N >= 0 && s.K >= 0, "negative GEMM shape {}", to_string(s));
  TESSERA_CHECK(
      lda >= std::max<std::int64_t>(1, a_cols(s)) && ldb >= std::max<std::int64_t>(1, b_cols(s)) &&
          ldc >= std::max<std::int64_t>(1, s.N),
      "leading dimensions too small for {}: lda={} ldb={} ldc={}", to_string(s), lda, ldb, ldc);
  if (c.is_direct() || s.M == 0 || s.N == 0 || s.K == 0) {
    gemm(lib, s.ta, s.tb, s.M, s.N, s.K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  bool fa = s.ta, fb = s.tb;
  if (c.pack_a) {
    const std::int64_t r = a_rows(s), k = a_cols(s);
    float* p = ensure(pack_a_, r * k);
    transpose_matrix(r, k, A, lda, p, r);  // now (k, r), leading dimension r
    A = p;
    lda = r;
    fa = !fa;
  }
  if (c.pack_b) {
    const std::int64_t r = b_rows(s), k = b_cols(s);
    float* p = ensure(pack_b_, r * k);
    transpose_matrix(r, k, B, ldb, p, r);
    B = p;
    ldb = r;
    fb = !fb;
  }
  if (!c.transpose_problem) {
    gemm(lib, fa, fb, s.M, s.N, s.K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  float* T = ensure(ct_, s.N * s.M);
  gemm(lib, !fb, !fa, s.N, s.M, s.K, alpha, B, ldb, A, lda, 0.0f, T, s.M);
  transpose_into(s.N, s.M, T, s.M, C, ldc, beta);  // C = T^T + beta * C
}

namespace {

double flops(const GemmShape& s) {
  return 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
}

// The shapes met by halving M or N (the larger) from `s`, s itself first.
std::vector<GemmShape> halvings(const GemmShape& s) {
  std::vector<GemmShape> out{s};
  GemmShape t = s;
  while (t.M > 16 || t.N > 16) {
    if (t.N >= t.M) {
      t.N = (t.N + 1) / 2;
    } else {
      t.M = (t.M + 1) / 2;
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace

// Scratch operands of a shape with minimal leading dimensions.
struct GemmTuner::Scratch {
  GemmShape s;
  std::int64_t lda, ldb, ldc;
  Buffer<float> A, B, C;
  explicit Scratch(const GemmShape& shape)
      : s(shape), lda(a_cols(shape)), ldb(b_cols(shape)), ldc(shape.N) {
    A.resize(static_cast<std::size_t>(a_rows(s) * lda));
    B.resize(static_cast<std::size_t>(b_rows(s) * ldb));
    C.resize(static_cast<std::size_t>(s.M * ldc));  // zero
    // Values do not change the time of a GEMM (no denormals, no zeros to skip); a cheap pattern.
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = 0.5f + 0.25f * static_cast<float>(i % 7);
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = 0.5f - 0.25f * static_cast<float>(i % 5);
  }
};

// beta = 1 (gradient accumulation reads C); a tiny alpha keeps C bounded over the repetitions.
void GemmTuner::call(GemmLibrary lib, Scratch& x, const GemmChoice& c) {
  run_with(lib, x.s, c, 1e-3f, x.A.data(), x.lda, x.B.data(), x.ldb, 1.0f, x.C.data(), x.ldc);
}

void GemmTuner::grow_scratch(const GemmShape& g) {  // so that no allocation is timed
  ensure(pack_a_, a_rows(g) * a_cols(g));
  ensure(pack_b_, b_rows(g) * b_cols(g));
  if (opt_.try_transposed_problem) ensure(ct_, g.M * g.N);
}

// Screening: every candidate on rec.timed, round-robin, each one's minimum over the repetitions
// that fit `budget` seconds. Returns the index of the winner: the fastest, unless it gains less
// than min_gain over the direct call (index 0).
std::size_t GemmTuner::screen(TuneRecord& rec, const std::vector<GemmChoice>& cands,
                              double budget) {
  rec.candidates.resize(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i) {
    rec.candidates[i].choice = cands[i];
    rec.candidates[i].name = describe(rec.shape, cands[i]);
    rec.candidates[i].seconds = 1e300;
  }
  Scratch x(rec.timed);
  grow_scratch(rec.timed);
  call(rec.lib, x, cands.front());  // warm-up: library threads, JIT kernels, first touch of C
  const double t0 = now_s();
  for (int rep = 0; rep < std::max(1, opt_.max_reps); ++rep) {
    const double round_start = now_s();
    for (std::size_t i = 0; i < cands.size(); ++i) {
      const double a = now_s();
      call(rec.lib, x, cands[i]);
      auto& ct = rec.candidates[i];
      ct.seconds = std::min(ct.seconds, now_s() - a);
      ct.reps += 1;
    }
    const double now = now_s();
    if (now - t0 + (now - round_start) > budget) break;  // next round would overrun
  }
  std::size_t best = 0;
  for (std::size_t i = 1; i < cands.size(); ++i)
    if (rec.candidates[i].seconds < rec.candidates[best].seconds) best = i;
  if (rec.candidates[best].seconds > rec.candidates[0].seconds * (1.0 - opt_.min_gain)) best = 0;
  return best;
}

// Confirmation of a winner found on a proxy (chain[screen_at]): it must also beat the direct
// call on the largest shape of the halving chain whose (direct, winner) pair fits the `left`
// seconds, estimated from the screening times scaled by FLOPs. Returns the winner, or 0 (the
// direct call) when it does not hold there; unchanged when no larger shape fits.
std::size_t GemmTuner::confirm(TuneRecord& rec, const std::vector<GemmChoice>& cands,
                               std::size_t best, const std::vector<GemmShape>& chain,
                               std::size_t screen_at, double left) {
  const double pair_t = rec.candidates[0].seconds + rec.candidates[best].seconds;
  std::size_t at = 0;
  while (at < screen_at && pair_t * flops(chain[at]) / flops(rec.timed) > left) ++at;
  if (at == screen_at) return best;
  const GemmShape g = chain[at];
  rec.confirm_shape = g;
  Scratch x(g);
  grow_scratch(g);
  double td = 1e300, tb = 1e300;
  const double t0 = now_s();
  for (int rep = 0; rep < std::max(1, opt_.max_reps); ++rep) {
    const double round_start = now_s();
    double a = now_s();
    call(rec.lib, x, cands[best]);  // the winner first: it pays any remaining cold start
    tb = std::min(tb, now_s() - a);
    a = now_s();
    call(rec.lib, x, cands[0]);
    td = std::min(td, now_s() - a);
    const double now = now_s();
    if (now - t0 + (now - round_start) > left) break;
  }
  rec.confirmed = true;
  rec.confirm_direct_s = td;
  rec.confirm_best_s = tb;
  return tb > td * (1.0 - opt_.min_gain) ? 0 : best;
}

TuneRecord GemmTuner::tune(GemmLibrary lib, const GemmShape& shape) {
  const double t_start = now_s();
  TuneRecord rec;
  rec.lib = lib;
  rec.shape = shape;
  const std::vector<GemmShape> chain = halvings(shape);
  std::size_t screen_at = 0;  // screening shape: the first halving within max_tune_flops
  while (screen_at + 1 < chain.size() && flops(chain[screen_at]) > opt_.max_tune_flops) ++screen_at;
  rec.timed = chain[screen_at];
  // Screening gets the whole budget when it runs on the full shape, else a share of it and the
  // rest goes to the confirmation on a larger shape.
  const std::vector<GemmChoice> cands = candidates(rec.timed);
  std::size_t best = screen(rec, cands, screen_at == 0 ? opt_.budget_s : 0.4 * opt_.budget_s);
  if (best != 0 && screen_at > 0)
    best = confirm(rec, cands, best, chain, screen_at, opt_.budget_s - (now_s() - t_start));
  rec.best = cands[best];
  rec.tune_seconds = now_s() - t_start;
  return rec;
}

GemmChoice GemmTuner::choose(GemmLibrary lib, const GemmShape& shape) {
  if (shape.M <= 0 || shape.N <= 0 || shape.K <= 0) return GemmChoice{};
  auto it = cache_.find(key(lib, shape));
  if (it != cache_.end()) return it->second.choice;
  TuneRecord rec = tune(lib, shape);
  const GemmChoice c = rec.best;
  cache_[key(lib, shape)] = Entry{c, omp_get_max_threads()};
  records_.push_back(std::move(rec));
  return c;
}

void GemmTuner::run(GemmLibrary lib, const GemmShape& shape, float alpha, const float* A,
                    std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                    std::int64_t ldc) {
  run_with(lib, shape, choose(lib, shape), alpha, A, lda, B, ldb, beta, C, ldc);
}

void GemmTuner::set_choice(GemmLibrary lib, const GemmShape& shape, const GemmChoice& choice) {
  cache_[key(lib, shape)] = Entry{choice, omp_get_max_threads()};
}

bool GemmTuner::has_choice(GemmLibrary lib, const GemmShape& shape) const {
  return cache_.count(key(lib, shape)) != 0;
}

namespace {
constexpr const char* k_format = "tessera-gemm-tuner";
constexpr int k_version = 1;
}  // namespace

void GemmTuner::save(const std::filesystem::path& path) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [k, e] : cache_) {
    const auto& [lib, ta, tb, M, N, K] = k;
    entries.push_back({{"lib", gemm_library_name(static_cast<GemmLibrary>(lib))},
                       {"threads", e.threads},
                       {"ta", ta},
                       {"tb", tb},
                       {"M", M},
                       {"N", N},
                       {"K", K},
                       {"transpose_problem", e.choice.transpose_problem},
                       {"pack_a", e.choice.pack_a},
                       {"pack_b", e.choice.pack_b}});
  }
  nlohmann::json doc{{"format", k_format}, {"version", k_version}, {"entries", entries}};
  write_file_atomic(path, doc.dump(1) + "\n");
}

std::size_t GemmTuner::load(const std::filesystem::path& path) {
  const std::string text = read_file(path, "GEMM tuner file");
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string hint = "delete the file to re-tune, or save a new one with GemmTuner::save";
  if (doc.is_discarded())
    throw Error(fmt::format("GEMM tuner file {} is not valid JSON", path.string()), hint);
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != k_format ||
      !doc.contains("entries") || !doc["entries"].is_array())
    throw Error(fmt::format("{} is not a GEMM tuner file (expected \"format\": \"{}\" and an "
                            "\"entries\" array)",
                            path.string(), k_format),
                hint);
  if (!doc.contains("version") || doc["version"] != k_version) return 0;  // another version
  const int threads = omp_get_max_threads();
  std::size_t taken = 0;
  for (const auto& e : doc["entries"]) {
    if (!e.is_object()) continue;
    auto is_bool = [&](const char* f) { return e.contains(f) && e[f].is_boolean(); };
    auto is_dim = [&](const char* f) {
      return e.contains(f) && e[f].is_number_integer() && e[f].get<std::int64_t>() > 0;
    };
    if (!e.contains("lib") || !e["lib"].is_string() || !e.contains("threads") ||
        !e["threads"].is_number_integer() || !is_bool("ta") || !is_bool("tb") || !is_dim("M") ||
        !is_dim("N") || !is_dim("K") || !is_bool("transpose_problem") || !is_bool("pack_a") ||
        !is_bool("pack_b"))
      continue;
    const std::string lib_name = e["lib"].get<std::string>();
    GemmLibrary lib;
    if (lib_name == gemm_library_name(GemmLibrary::OneDnn)) {
      lib = GemmLibrary::OneDnn;
    } else if (lib_name == gemm_library_name(GemmLibrary::OpenBlas)) {
      lib = GemmLibrary::OpenBlas;
    } else {
      continue;
    }
    if (e["threads"].get<int>() != threads) continue;  // tuned for another thread count
    GemmShape s{e["ta"].get<bool>(), e["tb"].get<bool>(), e["M"].get<std::int64_t>(),
                e["N"].get<std::int64_t>(), e["K"].get<std::int64_t>()};
    GemmChoice c{e["transpose_problem"].get<bool>(), e["pack_a"].get<bool>(),
                 e["pack_b"].get<bool>()};
    cache_[key(lib, s)] = Entry{c, threads};
    ++taken;
  }
  return taken;
}

}  // namespace tessera::kernels
