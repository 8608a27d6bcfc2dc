#include "tessera/quant/calibration.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/shard.hpp"
#include "tessera/io/tokenizer_files.hpp"

namespace tessera::quant {

namespace fs = std::filesystem;

const std::vector<std::string>& calibration_names() {
  static const std::vector<std::string> names{"corpus", "corpus-concat", "random", "punct",
                                              "domain", "lang2",         "code"};
  return names;
}

std::string CalibSet::describe() const {
  return fmt::format("{} (seed {}, {} x {} tokens)", name, seed, n(), seqlen);
}

std::vector<std::int32_t> tokenize_text(const std::string& body, const fs::path& tokenizer) {
  auto tok = io::load_tokenizer(tokenizer);
  auto ids = tok.encode(body, false);
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

namespace {

std::vector<std::int32_t> read_text_tokens(const fs::path& text, const fs::path& tokenizer,
                                           const std::string& what) {
  if (input_kind(text, what + " text for calibration") == InputKind::Missing)
    throw Error(fmt::format("{} text for calibration not found: {}", what, text.string()),
                "run scripts/setup (it extracts the default texts) or pass another file");
  return tokenize_text(read_file(text, what + " text for calibration"), tokenizer);
}

// The C++ sources (.cpp, .hpp) under dir, in path order, as one text.
std::string read_code(const fs::path& dir) {
  if (input_kind(dir, "source directory for calibration") != InputKind::Directory)
    throw Error(
        fmt::format("source directory for the code calibration set not found: {}", dir.string()),
        "run from the repository root or pass --calib-text DIR");
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".hpp"))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string body;
  for (const auto& f : files) body += read_file(f, "source file for calibration");
  return body;
}

// The ids of the ASCII punctuation characters that the tokenizer encodes as one token each.
std::vector<std::int32_t> punctuation_ids(const fs::path& tokenizer, int vocab_size) {
  static const std::string punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  auto tok = io::load_tokenizer(tokenizer);
  std::vector<std::int32_t> ids;
  for (char c : punct) {
    auto v = tok.encode(std::string_view(&c, 1), false);
    if (v.size() == 1 && v[0] < static_cast<std::uint32_t>(vocab_size))
      ids.push_back(static_cast<std::int32_t>(v[0]));
  }
  if (ids.empty())
    throw Error(fmt::format("tokenizer {} encodes no punctuation character as one token",
                            tokenizer.string()),
                "use another calibration set");
  return ids;
}

// GPTQ-style: n random windows of seqlen tokens from a token stream.
void random_windows(const std::vector<std::int32_t>& stream, CalibSet& s, int n, Rng& rng,
                    const std::string& source) {
  if (stream.size() < static_cast<std::size_t>(s.seqlen) + 1)
    throw Error(fmt::format("calibration source {} has {} tokens, fewer than one sample of {}",
                            source, stream.size(), s.seqlen),
                "use a shorter --seqlen or a larger text");
  const std::size_t span = stream.size() - s.seqlen;
  for (int i = 0; i < n; ++i) {
    std::size_t start = rng.next_u64() % (span + 1);
    s.tokens.insert(s.tokens.end(), stream.begin() + start, stream.begin() + start + s.seqlen);
  }
}

}  // namespace

namespace {

// The whole training shard, every id checked against the vocabulary.
std::vector<std::int32_t> read_corpus(const CalibSources& src, int vocab_size) {
  if (input_kind(src.train_shard, "calibration corpus") == InputKind::Missing)
    throw Error(fmt::format("calibration corpus not found: {}", src.train_shard.string()),
                "run 'tessera prepare' or pass --calib-data SHARD");
  data::ShardReader rd(src.train_shard);
  std::vector<std::int32_t> all(rd.size());
  if (!all.empty()) rd.read(0, all.size(), all.data());
  for (auto t : all)
    if (t < 0 || t >= vocab_size)  // ids >= 2^31 read as negative
      throw Error(
          fmt::format("calibration shard {} holds token id {} outside the model's "
                      "vocabulary of {}",
                      src.train_shard.string(), static_cast<std::uint32_t>(t), vocab_size));
  return all;
}

// AWQ-style: the corpus's documents (split at the end-of-text token) shuffled, concatenated, and
// cut to n x seqlen tokens.
void concatenated_documents(const std::vector<std::int32_t>& all, std::int32_t eot, CalibSet& s,
                            int n, Rng& rng, const std::string& source) {
  std::vector<std::pair<std::size_t, std::size_t>> docs;
  std::size_t b = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] == eot) {
      if (i > b) docs.emplace_back(b, i);
      b = i + 1;
    }
  if (b < all.size()) docs.emplace_back(b, all.size());
  for (std::size_t i = docs.size(); i > 1; --i) std::swap(docs[i - 1], docs[rng.next_u64() % i]);
  const std::size_t need = static_cast<std::size_t>(n) * s.seqlen;
  for (const auto& d : docs) {
    if (s.tokens.size() >= need) break;
    s.tokens.insert(s.tokens.end(), all.begin() + d.first, all.begin() + d.second);
  }
  if (s.tokens.size() < need)
    throw Error(fmt::format("calibration corpus {} has {} tokens, fewer than {} x {}", source,
                            s.tokens.size(), n, s.seqlen));
  s.tokens.resize(need);
}

// The tokens of a text set (domain, lang2 or code) read from `path`, every id checked against
// the vocabulary.
std::vector<std::int32_t> text_set_tokens(const std::string& name, const fs::path& path,
                                          const CalibSources& src, int vocab_size) {
  auto stream = name == "code" ? tokenize_text(read_code(path), src.tokenizer)
                               : read_text_tokens(path, src.tokenizer, name);
  for (auto t : stream)
    if (t >= vocab_size)
      throw Error(fmt::format("text {} tokenizes to id {} outside the model's vocabulary of {}",
                              path.string(), t, vocab_size),
                  "pass the model's own tokenizer (--tokenizer)");
  return stream;
}

}  // namespace

namespace {

// The file or folder a text set (domain, lang2, code) is read from.
fs::path text_source(const std::string& name, const CalibSources& src) {
  return find_data_path(name == "domain"  ? src.domain_text
                        : name == "lang2" ? src.lang2_text
                                          : src.code_dir);
}

}  // namespace

void check_calibration_source(const std::string& name, const CalibSources& src) {
  const bool corpus = name == "corpus" || name == "corpus-concat";
  if (!corpus && name != "domain" && name != "lang2" && name != "code") return;
  const fs::path path = corpus ? src.train_shard : text_source(name, src);
  if (input_kind(path, "calibration set " + name) == InputKind::Missing)
    throw Error(fmt::format("calibration set {}: {} not found", name, path.string()),
                corpus ? "run 'tessera prepare' or pass the shard (--calib-data)"
                       : "pass the set's text (see the command's --help), or leave the set out");
}

CalibSet make_calibration(const std::string& name, int n, int seqlen, std::uint64_t seed,
                          int vocab_size, const CalibSources& src) {
  if (n < 1 || seqlen < 1)
    throw Error(fmt::format("calibration set '{}' would be empty ({} samples x {} tokens)", name, n,
                            seqlen),
                "use --nsamples >= 1 and --seqlen >= 1");
  CalibSet s;
  s.name = name;
  s.seed = seed;
  s.seqlen = seqlen;
  const std::size_t count = static_cast<std::size_t>(n) * seqlen;
  s.tokens.reserve(count);
  Rng rng(seed * 0x9E3779B97F4A7C15ull + 17);
  if (name == "corpus") {
    random_windows(read_corpus(src, vocab_size), s, n, rng, src.train_shard.string());
  } else if (name == "corpus-concat") {
    const auto all = read_corpus(src, vocab_size);
    const auto eot = static_cast<std::int32_t>(io::load_tokenizer(src.tokenizer).eot_id());
    concatenated_documents(all, eot, s, n, rng, src.train_shard.string());
  } else if (name == "random") {
    for (std::size_t i = 0; i < count; ++i)
      s.tokens.push_back(static_cast<std::int32_t>(rng.next_u64() % vocab_size));
  } else if (name == "punct") {
    const auto ids = punctuation_ids(src.tokenizer, vocab_size);
    for (std::size_t i = 0; i < count; ++i) s.tokens.push_back(ids[rng.next_u64() % ids.size()]);
  } else if (name == "domain" || name == "lang2" || name == "code") {
    const fs::path path = text_source(name, src);
    random_windows(text_set_tokens(name, path, src, vocab_size), s, n, rng, path.string());
  } else {
    throw Error(fmt::format("unknown calibration set '{}'", name),
                "use corpus, corpus-concat, random, punct, domain, lang2 or code");
  }
  return s;
}

// ---------------------------------------------------------------- statistics
void ChannelStats::init(int c) {
  cols = c;
  count = 0;
  sum.assign(c, 0);
  sumsq.assign(c, 0);
  sumabs.assign(c, 0);
  sum3.assign(c, 0);
  sum4.assign(c, 0);
  maxabs.assign(c, 0.0f);
  over6.assign(c, 0);
}

void ChannelStats::add(const float* x, std::int64_t N) {
#pragma omp parallel for schedule(static)
  for (int j = 0; j < cols; ++j) {
    double s1 = 0, s2 = 0, sa = 0, s3 = 0, s4 = 0;
    float m = maxabs[j];
    std::int64_t o = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      double v = x[i * cols + j], v2 = v * v;
      s1 += v;
      s2 += v2;
      sa += std::fabs(v);
      s3 += v2 * v;
      s4 += v2 * v2;
      float a = std::fabs(static_cast<float>(v));
      m = std::max(m, a);
      o += a >= 6.0f;
    }
    sum[j] += s1;
    sumsq[j] += s2;
    sumabs[j] += sa;
    sum3[j] += s3;
    sum4[j] += s4;
    maxabs[j] = m;
    over6[j] += o;
  }
  count += N;
}

double ChannelStats::excess_kurtosis(int j) const {
  if (count < 2) return 0.0;
  double n = static_cast<double>(count);
  double mu = sum[j] / n, m2 = sumsq[j] / n - mu * mu;
  if (m2 <= 1e-30) return 0.0;
  double m4 =
      sum4[j] / n - 4 * mu * sum3[j] / n + 6 * mu * mu * sumsq[j] / n - 3 * mu * mu * mu * mu;
  return m4 / (m2 * m2) - 3.0;
}

void Hessian::init(int c) {
  cols = c;
  count = 0;
  xtx.assign(static_cast<std::size_t>(c) * c, 0.0);
}

void Hessian::add(const float* x, std::int64_t N, kernels::GemmLibrary gemm) {
  std::vector<float> h(static_cast<std::size_t>(cols) * cols);
  kernels::gemm(gemm, true, false, cols, cols, N, 1.0f, x, cols, x, cols, 0.0f, h.data(), cols);
  for (std::size_t i = 0; i < h.size(); ++i) xtx[i] += h[i];
  count += N;
}

std::vector<double> Hessian::mean_xtx() const {
  std::vector<double> m(xtx.size());
  double inv = count ? 1.0 / count : 0.0;
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = xtx[i] * inv;
  return m;
}

namespace {
// A capture with nothing added yet: each linear's input statistics (and Hessian) sized.
Capture empty_capture(const model::ModelConfig& cfg, bool hessians) {
  const int L = cfg.n_layer;
  Capture cap;
  cap.config = cfg;
  cap.layers.resize(L);
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < k_num_lin; ++k) {
      const int cols = lin_cols(cfg, static_cast<Lin>(k));
      cap.layers[l][k].stats.init(cols);
      if (hessians) cap.layers[l][k].hessian.init(cols);
    }
  cap.residual.maxabs.assign(L, 0.0f);
  cap.residual.max_ratio.assign(L, 0.0);
  cap.residual.largest.assign(L, MassiveActivation{});
  return cap;
}

// Block l's output rows x (N, C), sample0's samples of T tokens on: each row's largest |x| over
// its median |x|, where the layer's largest is, and the massive activations (above 100 and
// 1000x the row's median; at most 1000 kept).
void observe_residual(ResidualStats& res, int l, const float* x, std::int64_t N, int C, int T,
                      int sample0) {
  std::vector<float> a(C);
  for (std::int64_t i = 0; i < N; ++i) {
    const float* r = x + i * C;
    float m = 0;
    int arg = 0;
    for (int c = 0; c < C; ++c) {
      a[c] = std::fabs(r[c]);
      if (a[c] > m) {
        m = a[c];
        arg = c;
      }
    }
    std::nth_element(a.begin(), a.begin() + C / 2, a.end());
    const float med = std::max(a[C / 2], 1e-12f);
    const MassiveActivation here{
        l, sample0 + static_cast<int>(i / T), static_cast<int>(i % T), arg, r[arg], med};
    if (m > res.maxabs[l]) res.largest[l] = here;
    res.maxabs[l] = std::max(res.maxabs[l], m);
    res.max_ratio[l] = std::max(res.max_ratio[l], double(m) / med);
    if (m > 100.0f && m >= 1000.0f * med && res.massive.size() < 1000) res.massive.push_back(here);
  }
}
}  // namespace

Capture capture(const model::ParamLayout& layout, const float* params, const CalibSet& calib,
                bool hessians, int micro, kernels::GemmLibrary gemm) {
  const auto& cfg = layout.config();
  const int C = cfg.n_embd, T = calib.seqlen;
  if (calib.n() < 1) throw Error("the calibration set is empty", "use --nsamples >= 1");
  if (T > cfg.block_size)
    throw Error(fmt::format("calibration --seqlen {} exceeds the model's block_size {}", T,
                            cfg.block_size));
  Capture cap = empty_capture(cfg, hessians);
  Runner run(layout, gemm);
  Hooks hooks;
  hooks.capture = [&](int l, Lin kind, const float* x, std::int64_t N, int /*cols*/) {
    auto& lc = cap.layers[l][static_cast<int>(kind)];
    lc.stats.add(x, N);
    if (hessians) lc.hessian.add(x, N, gemm);
  };
  int sample0 = 0;
  hooks.residual = [&](int l, const float* x, std::int64_t N, int Cc) {
    observe_residual(cap.residual, l, x, N, Cc, T, sample0);
  };
  std::vector<float> x(static_cast<std::size_t>(micro) * T * C);
  Progress progress("calibration pass", calib.n(), 2.0);
  for (int s = 0; s < calib.n(); s += micro) {
    progress.update(s, calib.name);
    const int B = std::min(micro, calib.n() - s);
    sample0 = s;
    const std::int32_t* tok = calib.tokens.data() + static_cast<std::size_t>(s) * T;
    run.embed(params, tok, B, T, x.data());
    for (int l = 0; l < cfg.n_layer; ++l) run.block(params, l, x.data(), B, T, hooks);
  }
  progress.finish();
  cap.tokens = static_cast<std::int64_t>(calib.n()) * T;
  return cap;
}

}  // namespace tessera::quant
