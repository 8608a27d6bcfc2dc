// Model-level properties beyond the PyTorch fixture: initialization statistics, gradient
// accumulation, the KV-cache decoder against the full forward, and the optimizer pieces.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"

using namespace tessera;

namespace {
model::ModelConfig tiny() {
  return model::ModelConfig{3, 4, 32, 24, 300};
}

// A llama of the same size: 2 key-value heads for 4 query heads, an MLP of 40, untied head.
model::ModelConfig tiny_llama() {
  auto c = tiny();
  c.family = model::Family::Llama;
  c.n_kv_head = 2;
  c.intermediate_size = 40;
  c.tie_embeddings = false;
  return c;
}

std::vector<std::int32_t> random_tokens(int n, int V, std::uint64_t seed) {
  Rng r(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(r.next_u32() % V);
  return t;
}

// A model of cfg's shape with seeded parameters, and block_size seeded random tokens.
struct SeededModel {
  SeededModel(const model::ModelConfig& cfg, std::uint64_t seed, std::uint64_t token_seed)
      : layout(cfg),
        params(layout.total()),
        tokens(random_tokens(cfg.block_size, cfg.vocab_size, token_seed)) {
    model::init_params(layout, params.data(), seed);
  }
  model::ParamLayout layout;
  Buffer<float> params;
  std::vector<std::int32_t> tokens;
};
}  // namespace

TEST(Model, Gpt2InitStatistics) {
  model::ModelConfig cfg{6, 4, 256, 64, 5000};  // 5000 -> padded to 5120
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 1);
  auto stdev = [&](const model::ParamTensor& t, std::size_t n) {
    double s = 0, s2 = 0;
    for (std::size_t i = 0; i < n; ++i)
      s += p[t.offset + i], s2 += double(p[t.offset + i]) * p[t.offset + i];
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  const auto& wte = *layout.find("wte.weight");
  // 1.28M samples: the sample std is within 0.3% of 0.02 (its standard error is 0.06%)
  EXPECT_NEAR(stdev(wte, std::size_t(cfg.vocab_size) * cfg.n_embd), 0.02, 6e-5);
  for (std::size_t i = std::size_t(cfg.vocab_size) * cfg.n_embd; i < wte.numel; ++i)
    ASSERT_EQ(p[wte.offset + i], 0.0f);
  // residual projections: 0.02 / sqrt(2L); 65K samples (standard error 0.3%), bound 1.5%
  const auto& proj = *layout.find("h.5.attn.c_proj.weight");
  EXPECT_NEAR(stdev(proj, proj.numel), 0.02 / std::sqrt(12.0), 0.015 * 0.02 / std::sqrt(12.0));
  const auto& fcp = *layout.find("h.0.mlp.c_proj.weight");
  EXPECT_NEAR(stdev(fcp, fcp.numel), 0.02 / std::sqrt(12.0), 0.015 * 0.02 / std::sqrt(12.0));
  const auto& fc = *layout.find("h.0.mlp.c_fc.weight");
  EXPECT_NEAR(stdev(fc, fc.numel), 0.02, 0.0002);
  for (const char* n : {"h.3.ln_1.weight", "ln_f.weight"}) {
    const auto& t = *layout.find(n);
    for (std::size_t i = 0; i < t.numel; ++i) ASSERT_EQ(p[t.offset + i], 1.0f) << n;
  }
  for (const char* n : {"h.3.attn.c_attn.bias", "ln_f.bias"}) {
    const auto& t = *layout.find(n);
    for (std::size_t i = 0; i < t.numel; ++i) ASSERT_EQ(p[t.offset + i], 0.0f) << n;
  }
  // same seed, same weights; another seed, other weights
  Buffer<float> q(layout.total());
  model::init_params(layout, q.data(), 1);
  EXPECT_EQ(std::memcmp(p.data(), q.data(), p.bytes()), 0);
  model::init_params(layout, q.data(), 2);
  EXPECT_NE(std::memcmp(p.data(), q.data(), p.bytes()), 0);
}

class ModelFamilies : public ::testing::TestWithParam<model::Family> {
 protected:
  model::ModelConfig config() const {
    return GetParam() == model::Family::Llama ? tiny_llama() : tiny();
  }
};

TEST_P(ModelFamilies, GradientAccumulationEqualsOneLargeBatch) {
  // Two micro-batches of B=2 with dloss = 1/(2*2*T) give the gradient of one batch of B=4 with
  // dloss = 1/(4*T), up to the order of fp32 sums (bound: 1e-6 absolute on gradients of O(1e-2)).
  auto cfg = config();
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total()), g1(layout.total()), g2(layout.total());
  model::init_params(layout, p.data(), 5);
  const int T = 16;
  auto x = random_tokens(4 * T, cfg.vocab_size, 1), y = random_tokens(4 * T, cfg.vocab_size, 2);
  model::Activations a;
  model::ForwardOptions o;
  o.training = true;
  o.dloss = 1.0f / (4 * T);
  float big = model::forward(layout, p.data(), a, x.data(), y.data(), 4, T, o);
  model::backward(layout, p.data(), g1.data(), a, x.data(), 4, T, o.gemm);
  float small = 0;
  for (int m = 0; m < 2; ++m) {
    small += 0.5f * model::forward(layout, p.data(), a, x.data() + m * 2 * T, y.data() + m * 2 * T,
                                   2, T, o);
    model::backward(layout, p.data(), g2.data(), a, x.data() + m * 2 * T, 2, T, o.gemm);
  }
  EXPECT_NEAR(big, small, 1e-5);
  double maxdiff = 0, maxabs = 0;
  for (std::size_t i = 0; i < layout.total(); ++i) {
    maxdiff = std::max(maxdiff, double(std::fabs(g1[i] - g2[i])));
    maxabs = std::max(maxabs, double(std::fabs(g1[i])));
  }
  EXPECT_GT(maxabs, 1e-3);
  EXPECT_LT(maxdiff, 1e-6);
}

TEST_P(ModelFamilies, KvCacheDecoderMatchesFullForward) {
  // Decoding token by token with the cache gives, at every position, the logits of the full
  // (B=1) forward over the same prefix (bound 2e-5: different GEMM shapes sum differently; llama:
  // the rotation of the newest position is the same fp32 cos and sin as in the full forward).
  auto cfg = config();
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 9);
  const int T = cfg.block_size;
  auto x = random_tokens(T, cfg.vocab_size, 3);
  model::Activations a;
  model::forward(layout, p.data(), a, x.data(), nullptr, 1, T, {});
  model::Decoder dec(layout, p.data(), T, kernels::GemmLibrary::OneDnn);
  const int Vp = cfg.padded_vocab();
  for (int t = 0; t < T; ++t) {
    const float* l = dec.step(x[t]);
    const float* ref = a.at(a.logits) + std::size_t(t) * Vp;
    for (int v = 0; v < cfg.vocab_size; ++v)
      ASSERT_NEAR(l[v], ref[v], 2e-5) << "t=" << t << " v=" << v;
  }
  EXPECT_THROW(dec.step(x[0]), Error);  // context full
}

TEST_P(ModelFamilies, KvCacheDecoderPrefillEqualsTheFullForward) {
  // prefill() is the block forward over the prompt (the same GEMMs and causal attention as the
  // full forward), keeping each layer's keys and values in the cache: its logits are the full
  // forward's at the prompt's last position, and the steps after it read the cache as if they had
  // filled it themselves: at every later position the logits are the full forward's up to the
  // order of fp32 sums (bound 2e-5, as for decoding step by step). Prompts of 1 (a step), 2, half
  // and the whole context, whole or in two pieces (the second attending to the cache the first
  // left: how prefill runs a long prompt in chunks). With the fp16 cache the keys and values are
  // rounded as step() rounds them: bound as in KvCacheDecoderWithFp16Cache against the fp32
  // forward.
  auto cfg = config();
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 13);
  const int T = cfg.block_size, Vp = cfg.padded_vocab();
  const double u = std::ldexp(1.0, -11);
  auto x = random_tokens(T, cfg.vocab_size, 4);
  model::Activations a;
  model::forward(layout, p.data(), a, x.data(), nullptr, 1, T, {});
  for (const auto kv : {model::KvCache::F32, model::KvCache::F16})
    for (int n : {1, 2, T / 2, T})
      for (int first : {n, n / 3}) {
        if (first == 0) continue;
        SCOPED_TRACE(
            fmt::format("{} cache, prompt of {} ({} first)", model::kv_cache_name(kv), n, first));
        model::Decoder dec(layout, p.data(), T, kernels::GemmLibrary::OneDnn, {}, kv);
        const float* l = dec.prefill(x.data(), first, first == n);
        if (first < n) l = dec.prefill(x.data() + first, n - first);
        EXPECT_EQ(dec.position(), n);
        for (int t = n - 1; t < T; ++t) {
          if (t >= n) l = dec.step(x[t]);
          const float* ref = a.at(a.logits) + std::size_t(t) * Vp;
          double scale = 0;
          for (int v = 0; v < cfg.vocab_size; ++v)
            scale = std::max(scale, std::fabs(double(ref[v])));
          const double bound = kv == model::KvCache::F32 ? 2e-5 : 4 * u * (1 + scale);
          for (int v = 0; v < cfg.vocab_size; ++v)
            ASSERT_NEAR(l[v], ref[v], bound) << "t=" << t << " v=" << v;
        }
      }
  model::Decoder dec(layout, p.data(), T / 2, kernels::GemmLibrary::OneDnn);
  EXPECT_EQ(dec.prefill(x.data(), 0), nullptr);  // nothing to feed
  EXPECT_EQ(dec.position(), 0);
  EXPECT_EQ(dec.prefill(x.data(), 3, false), nullptr);  // no logits asked: none computed
  EXPECT_EQ(dec.position(), 3);
  dec.reset();
  EXPECT_THROW(dec.prefill(x.data(), T / 2 + 1), Error);  // beyond the decoder's capacity
  dec.prefill(x.data(), T / 2 - 2, false);
  EXPECT_THROW(dec.prefill(x.data(), 3), Error);
  EXPECT_EQ(dec.position(), T / 2 - 2);
  dec.reset();
  std::vector<std::int32_t> bad(x.begin(), x.begin() + 4);
  bad[2] = cfg.vocab_size;
  EXPECT_THROW(dec.prefill(bad.data(), 4), Error);
  EXPECT_EQ(dec.position(), 0);
}

TEST_P(ModelFamilies, KvCacheDecoderTeamsAgree) {
  // A step runs as one thread team, each thread taking a share of every product's rows and of
  // the attention's positions, merged per head. Teams of 1, 2 and 3 (more threads than positions
  // at first: empty shares) give the same logits up to the order of fp32 sums (bound 2e-5 as
  // against the full forward).
  const auto cfg = config();
  const SeededModel m(cfg, 11, 5);
  const int T = cfg.block_size, Vp = cfg.padded_vocab();
  std::vector<std::vector<float>> logits;
  const int before = omp_get_max_threads();
  for (int team : {1, 2, 3}) {
    omp_set_num_threads(team);
    model::Decoder dec(m.layout, m.params.data(), T, kernels::GemmLibrary::OneDnn);
    logits.emplace_back();
    for (int t = 0; t < T; ++t) {
      const float* l = dec.step(m.tokens[t]);
      logits.back().insert(logits.back().end(), l, l + Vp);
    }
  }
  omp_set_num_threads(before);
  for (std::size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_NEAR(logits[1][i], logits[0][i], 2e-5) << "team of 2, at " << i;
    ASSERT_NEAR(logits[2][i], logits[0][i], 2e-5) << "team of 3, at " << i;
  }
}

// Past a full context both decoding loops slide on: the KV-cache one restarts on the newest
// half-window, the recomputing one keeps it. Down to a context of one token (a half-window of
// zero tokens once crashed both), each returns every token asked for, each a vocabulary id.
TEST_P(ModelFamilies, GenerationSlidesPastEveryContextSize) {
  for (int block : {1, 2, 3}) {
    auto cfg = config();
    cfg.block_size = block;
    const SeededModel m(cfg, 3, 4);
    eval::SampleOptions so;
    so.max_new_tokens = 7;
    so.temperature = 0.0f;
    Rng r1(1), r2(1);
    const auto a = eval::generate(m.layout, m.params.data(), {5, 6, 7}, so, r1);
    model::Decoder dec(m.layout, m.params.data(), block, kernels::GemmLibrary::OneDnn);
    auto next = [&](const std::int32_t* ctx, int T) {
      dec.reset();
      return dec.prefill(ctx, T);
    };
    const auto b = eval::generate_recompute(cfg.vocab_size, block, {5, 6, 7}, so, r2, next);
    for (const auto* out : {&a, &b}) {
      ASSERT_EQ(out->size(), 7u) << "block_size " << block;
      for (auto t : *out) EXPECT_TRUE(t >= 0 && t < cfg.vocab_size) << t;
    }
  }
}

TEST_P(ModelFamilies, KvCacheDecoderWithFp16Cache) {
  // The fp16 cache holds every key (rotated) and value rounded to the nearest fp16, a relative
  // change of at most u = 2^-11 per value, and half the bytes. Through one attention that moves
  // the output by at most u max|v| via the values and 2 max|ds| max|v| via the softmax, with
  // |ds| <= u |q| |k| / sqrt(hs); the rest of the step is the fp32 one. So the logits stay within
  // a few u of their scale: bound 4 u (1 + max |logit|) per position (measured, printed: below
  // u). Reading a wrong row, head or position would move them by their own size. The default
  // team and a team of 3 agree as the fp32 cache's teams do (2e-5).
  const auto cfg = config();
  const SeededModel m(cfg, 17, 9);
  const int T = cfg.block_size, Vp = cfg.padded_vocab();
  const double u = std::ldexp(1.0, -11);
  model::Decoder d32(m.layout, m.params.data(), T, kernels::GemmLibrary::OneDnn);
  model::Decoder d16(m.layout, m.params.data(), T, kernels::GemmLibrary::OneDnn, {},
                     model::KvCache::F16);
  EXPECT_EQ(d16.kv_cache_bytes() * 2, d32.kv_cache_bytes());
  EXPECT_EQ(d16.kv_cache(), model::KvCache::F16);
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  model::Decoder d16_team3(m.layout, m.params.data(), T, kernels::GemmLibrary::OneDnn, {},
                           model::KvCache::F16);
  omp_set_num_threads(before);
  double worst = 0;  // |logit change| / (1 + max |logit|), the largest over positions
  for (int t = 0; t < T; ++t) {
    const float* l32 = d32.step(m.tokens[t]);
    const float* l16 = d16.step(m.tokens[t]);
    double scale = 0, diff = 0;
    for (int v = 0; v < cfg.vocab_size; ++v) {
      scale = std::max(scale, std::fabs(double(l32[v])));
      diff = std::max(diff, std::fabs(double(l16[v]) - l32[v]));
    }
    worst = std::max(worst, diff / (1 + scale));
    ASSERT_LE(diff, 4 * u * (1 + scale)) << "t=" << t;
    std::vector<float> team1(l16, l16 + Vp);
    omp_set_num_threads(3);
    const float* l3 = d16_team3.step(m.tokens[t]);
    omp_set_num_threads(before);
    for (int v = 0; v < cfg.vocab_size; ++v) ASSERT_NEAR(l3[v], team1[v], 2e-5) << "t=" << t;
  }
  std::printf("fp16 cache: largest logit change %.3g of (1 + max |logit|), u = %.3g\n", worst, u);
}

TEST(Model, KvCacheDecoderMatchesFullForwardAtOtherHeadSizes) {
  // The decoder's attention has kernels for head sizes 64 and 128 (most llamas): the scores of 8
  // positions at a time and the weighted values of up to 3 heads of a group at once, in
  // registers; other sizes (the tiny models above: 8) take loops over the head size; so does its
  // fp16 cache. 12 is not a multiple of 8, the vectors' width: the dot products' and the fp16
  // conversions' tails. Groups of 1, 2 and 4 query heads per key-value head (4: a pass of 3 and
  // one of 1). 300 positions: each thread's share (up to a team of 4) spans blocks of 64
  // positions, whose softmax is merged as it goes (a later block with a larger max rescales the
  // sums so far), and ends in a block of any length.
  for (int hs : {12, 64, 128})
    for (const auto& [heads, kv_heads] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{3, 3}}) {
      SCOPED_TRACE(fmt::format("head size {}, {} heads, {} key-value heads", hs, heads, kv_heads));
      auto cfg = tiny_llama();
      cfg.n_head = heads;
      cfg.n_kv_head = kv_heads;
      cfg.n_embd = heads * hs;
      cfg.block_size = 300;
      model::ParamLayout layout(cfg);
      Buffer<float> p(layout.total());
      model::init_params(layout, p.data(), 13);
      const int T = cfg.block_size, Vp = cfg.padded_vocab();
      auto x = random_tokens(T, cfg.vocab_size, 7);
      model::Activations a;
      model::forward(layout, p.data(), a, x.data(), nullptr, 1, T, {});
      model::Decoder dec(layout, p.data(), T, kernels::GemmLibrary::OneDnn);
      model::Decoder d16(layout, p.data(), T, kernels::GemmLibrary::OneDnn, {},
                         model::KvCache::F16);
      const double u = std::ldexp(1.0, -11);
      for (int t = 0; t < T; ++t) {
        const float* l = dec.step(x[t]);
        const float* ref = a.at(a.logits) + std::size_t(t) * Vp;
        for (int v = 0; v < cfg.vocab_size; ++v)
          ASSERT_NEAR(l[v], ref[v], 2e-5) << "head size " << hs << " t=" << t << " v=" << v;
        const float* h = d16.step(x[t]);  // the fp16 cache: bound as in KvCacheDecoderWithFp16Cache
        double scale = 0;
        for (int v = 0; v < cfg.vocab_size; ++v) scale = std::max(scale, std::fabs(double(ref[v])));
        for (int v = 0; v < cfg.vocab_size; ++v)
          ASSERT_NEAR(h[v], ref[v], 4 * u * (1 + scale))
              << "fp16 cache, head size " << hs << " t=" << t;
      }
    }
}

TEST(Model, TeamSharesCoverTheRangeInOrder) {
  for (int team : {1, 2, 3, 5})
    for (int n : {0, 1, 2, 7, 576}) {
      std::vector<model::TeamShare> shares(team);
#pragma omp parallel num_threads(team)
      shares[omp_get_thread_num()] = model::team_share(n);
      int next = 0;
      for (const auto& s : shares) {
        EXPECT_EQ(s.begin, next) << team << " threads, " << n << " items";
        EXPECT_LE(s.end - s.begin, n / team + 1);
        EXPECT_GE(s.end - s.begin, n / team);
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
  EXPECT_EQ(model::team_share(9).end, 9);  // outside a parallel region: all of it
}

// Every row of a decoder product is computed by exactly one thread, in whole groups of
// k_team_rows; llama's gate_up pairs each thread's gate rows with the same up rows and drops the
// barrier after it (the decoder's SwiGLU of those rows needs nothing else), every other product
// keeps it.
TEST(Model, DecoderProductRowsCoverEachRowOnceInGroups) {
  auto llama = tiny_llama();
  llama.intermediate_size = 48;
  auto odd = llama;
  odd.intermediate_size = 44;  // not a multiple of the groups: gate_up is shared as one run
  for (const auto& cfg : {tiny(), llama, odd})
    for (int team : {1, 2, 3, 5})
      for (int which = 0; which < 4; ++which) {
        const int rows = which == 0 ? cfg.qkv_rows() : which == 2 ? cfg.fc_rows() : cfg.n_embd;
        std::vector<model::TeamRows> got(team);
#pragma omp parallel num_threads(team)
        got[omp_get_thread_num()] = model::linear_rows(cfg, which, rows);
        const bool paired = cfg.llama() && which == 2 && cfg.ffn() % model::k_team_rows == 0;
        std::vector<int> count(rows, 0);
        for (const auto& r : got) {
          EXPECT_EQ(r.barrier, !paired);
          for (const auto& run : {r.first, r.second}) {
            EXPECT_EQ(run.begin % model::k_team_rows, 0);
            EXPECT_TRUE(run.end % model::k_team_rows == 0 || run.end == rows);
            for (int i = run.begin; i < run.end; ++i) ++count[i];
          }
          if (paired) {
            EXPECT_EQ(r.second.begin, r.first.begin + cfg.ffn());
            EXPECT_EQ(r.second.end, r.first.end + cfg.ffn());
          } else {
            EXPECT_EQ(r.second.end, r.second.begin);
          }
        }
        for (int i = 0; i < rows; ++i)
          ASSERT_EQ(count[i], 1) << team << " threads, linear " << which << ", row " << i;
      }
}

// What each thread of a decoding team fetches while it waits for the others before an fp32
// product (fp32_share) is what its rows of that product read: over the team, every byte of the
// weight once, and nothing else.
TEST(Model, Fp32DecoderSharesCoverEachProductOnce) {
  for (const auto& cfg : {tiny(), tiny_llama()}) {
    model::ParamLayout layout(cfg);
    std::vector<float> p(layout.total());
    for (int team : {1, 2, 3, 5})
      for (int prod = 0; prod < cfg.n_layer * 4 + 1; ++prod) {
        const bool head = prod == cfg.n_layer * 4;
        const int l = prod / 4, which = head ? model::k_head_product : prod % 4;
        const auto& w = layout.layers[head ? 0 : l];
        const std::size_t offsets[] = {w.qkv_w, w.attproj_w, w.fc_w, w.fcproj_w};
        const std::size_t sizes[] = {
            std::size_t(cfg.qkv_rows()) * cfg.n_embd, std::size_t(cfg.n_embd) * cfg.n_embd,
            std::size_t(cfg.fc_rows()) * cfg.n_embd, std::size_t(cfg.n_embd) * cfg.ffn()};
        const std::size_t begin = head ? layout.head : offsets[which];
        const std::size_t size = head ? std::size_t(cfg.padded_vocab()) * cfg.n_embd : sizes[which];
        std::vector<int> count(size, 0);
        std::vector<std::vector<model::ByteSpan>> got(team);
#pragma omp parallel num_threads(team)
        {
          std::vector<model::ByteSpan> mine(model::k_share_spans);
          mine.resize(
              static_cast<std::size_t>(model::fp32_share(layout, p.data(), l, which, mine.data())));
          got[static_cast<std::size_t>(omp_get_thread_num())] = mine;
        }
        for (const auto& spans : got)
          for (const model::ByteSpan& b : spans) {
            const auto* at = static_cast<const float*>(b.data);
            ASSERT_EQ(b.bytes % sizeof(float), 0u);
            ASSERT_TRUE(at >= p.data() + begin && at + b.bytes / 4 <= p.data() + begin + size);
            for (std::size_t i = 0; i < b.bytes / 4; ++i) ++count[at - p.data() - begin + i];
          }
        for (int n : count) ASSERT_EQ(n, 1) << team << " threads, product " << prod;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Both, ModelFamilies,
                         ::testing::Values(model::Family::Gpt2, model::Family::Llama),
                         [](const auto& info) { return model::family_name(info.param); });

TEST(Model, LlamaInitAndLayout) {
  auto cfg = tiny_llama();
  model::ParamLayout layout(cfg);
  EXPECT_EQ(layout.wpe, model::k_absent);
  EXPECT_NE(layout.head, layout.wte);
  // q, k, v and gate, up lie back to back: one matrix each for the fused GEMMs
  const auto& q = *layout.find("model.layers.1.self_attn.q_proj.weight");
  const auto& k = *layout.find("model.layers.1.self_attn.k_proj.weight");
  const auto& v = *layout.find("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  EXPECT_EQ(q.numel + k.numel + v.numel, std::size_t(cfg.qkv_rows()) * cfg.n_embd);
  const auto& gate = *layout.find("model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(layout.find("model.layers.0.mlp.up_proj.weight")->offset, gate.offset + gate.numel);
  EXPECT_EQ(layout.layers[0].qkv_b, model::k_absent);
  // parameters: the layout's count is the formula's
  EXPECT_DOUBLE_EQ(
      double(layout.count_unpadded()) + 2.0 * (cfg.padded_vocab() - cfg.vocab_size) * cfg.n_embd,
      model::param_count(cfg));
  Buffer<float> p(layout.total());
  model::init_params(layout, p.data(), 1);
  for (const char* n : {"model.layers.2.input_layernorm.weight", "model.norm.weight"}) {
    const auto& t = *layout.find(n);
    for (std::size_t i = 0; i < t.numel; ++i) ASSERT_EQ(p[t.offset + i], 1.0f) << n;
  }
  const auto& head = *layout.find("lm_head.weight");
  for (std::size_t i = std::size_t(cfg.vocab_size) * cfg.n_embd; i < head.numel; ++i)
    ASSERT_EQ(p[head.offset + i], 0.0f);
}

TEST(Model, BadFamilySettingsAreRefused) {
  auto bad = tiny_llama();
  bad.n_kv_head = 3;  // 4 heads are not divisible by 3
  EXPECT_THROW(model::validate(bad), Error);
  bad = tiny_llama();
  bad.n_embd = 36, bad.n_head = 4;  // head size 9: odd, no rotary pairs
  EXPECT_THROW(model::validate(bad), Error);
  auto gpt = tiny();
  gpt.n_kv_head = 2;  // a llama setting on a gpt2 model
  EXPECT_THROW(model::validate(gpt), Error);
  gpt = tiny();
  gpt.tie_embeddings = false;
  EXPECT_THROW(model::validate(gpt), Error);
  gpt = tiny();
  gpt.intermediate_size = 40;
  EXPECT_THROW(model::validate(gpt), Error);
}

// Rotary scaling reaches every path of the model: the full forward and the KV-cache decoder
// rotate by the same scaled frequencies (the decoder still matches the forward, and both differ
// from the unscaled model), and the backward rotates back by them (a directional derivative).
TEST(Model, LlamaRopeScalingReachesForwardDecoderAndBackward) {
  auto cfg = tiny_llama();  // head size 8, theta 10000: wavelengths 6.3, 63, 628, 6283
  cfg.rope_scaling.kind = model::RopeScalingKind::Llama3;
  cfg.rope_scaling.factor = 4;
  cfg.rope_scaling.original_max_position_embeddings = 64;  // pairs: kept, blended, scaled x2
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total()), g(layout.total());
  model::init_params(layout, p.data(), 9);
  const int T = cfg.block_size, Vp = cfg.padded_vocab();
  const auto x = random_tokens(T, cfg.vocab_size, 3), y = random_tokens(T, cfg.vocab_size, 4);
  model::Activations a, plain_acts;
  model::forward(layout, p.data(), a, x.data(), nullptr, 1, T, {});
  auto plain_cfg = cfg;
  plain_cfg.rope_scaling = {};
  const model::ParamLayout plain(plain_cfg);
  model::forward(plain, p.data(), plain_acts, x.data(), nullptr, 1, T, {});
  double diff = 0;
  model::Decoder dec(layout, p.data(), T, kernels::GemmLibrary::OneDnn);
  for (int t = 0; t < T; ++t) {
    const float* l = dec.step(x[t]);
    const float* ref = a.at(a.logits) + std::size_t(t) * Vp;
    const float* unscaled = plain_acts.at(plain_acts.logits) + std::size_t(t) * Vp;
    for (int v = 0; v < cfg.vocab_size; ++v) {
      ASSERT_NEAR(l[v], ref[v], 2e-5) << "t=" << t << " v=" << v;
      diff = std::max(diff, double(std::fabs(ref[v] - unscaled[v])));
    }
  }
  // The scaling changes the logits (small ones: the initial weights attend almost uniformly).
  EXPECT_GT(diff, 1e-4);

  // d loss / d eps of loss(p + eps d), d = the gradient itself on layer 0's q and k weights:
  // central differences in double of an fp32 loss (h = 1e-2: truncation ~h^2, noise ~u/h).
  model::ForwardOptions o;
  o.training = true;
  o.dloss = 1.0f / T;
  model::forward(layout, p.data(), a, x.data(), y.data(), 1, T, o);
  model::backward(layout, p.data(), g.data(), a, x.data(), 1, T, o.gemm);
  std::vector<std::size_t> idx;
  for (const char* n :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"}) {
    const auto& t = *layout.find(n);
    for (std::size_t i = 0; i < t.numel; ++i) idx.push_back(t.offset + i);
  }
  double gd = 0;
  for (std::size_t i : idx) gd += double(g[i]) * g[i];
  const double h = 1e-2 / std::sqrt(gd);
  auto loss_at = [&](double eps) {
    Buffer<float> q(layout.total());
    std::copy(p.data(), p.data() + layout.total(), q.data());
    for (std::size_t i : idx) q[i] += static_cast<float>(eps * g[i]);
    return double(model::forward(layout, q.data(), a, x.data(), y.data(), 1, T, {}));
  };
  const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
  EXPECT_NEAR(fd, gd, 0.02 * gd);
}

TEST(Model, BadTokensAreRejected) {
  auto cfg = tiny();
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total());
  model::Activations a;
  std::vector<std::int32_t> x(8, 1), y(8, 1);
  x[3] = cfg.vocab_size;
  EXPECT_THROW(model::forward(layout, p.data(), a, x.data(), y.data(), 1, 8, {}), Error);
  x[3] = -1;
  EXPECT_THROW(model::forward(layout, p.data(), a, x.data(), y.data(), 1, 8, {}), Error);
  x[3] = 1;
  y[5] = cfg.vocab_size + 7;
  EXPECT_THROW(model::forward(layout, p.data(), a, x.data(), y.data(), 1, 8, {}), Error);
  EXPECT_THROW(model::forward(layout, p.data(), a, x.data(), y.data(), 1, cfg.block_size + 1, {}),
               Error);
}

TEST(Optim, WarmupThenCosine) {
  const float lr = 1e-3f;
  EXPECT_FLOAT_EQ(optim::lr_at(0, 100, 10, lr, 0.1f), lr / 10);
  EXPECT_FLOAT_EQ(optim::lr_at(9, 100, 10, lr, 0.1f), lr);
  EXPECT_FLOAT_EQ(optim::lr_at(10, 100, 10, lr, 0.1f), lr);  // cosine starts at the peak
  EXPECT_NEAR(optim::lr_at(55, 100, 10, lr, 0.1f), 0.55f * lr,
              1e-9);  // halfway: mean of peak and floor
  EXPECT_FLOAT_EQ(optim::lr_at(100, 100, 10, lr, 0.1f), 0.1f * lr);
  EXPECT_FLOAT_EQ(optim::lr_at(500, 100, 10, lr, 0.1f), 0.1f * lr);
  for (int s = 10; s < 100; ++s)
    ASSERT_LE(optim::lr_at(s + 1, 100, 10, lr, 0.1f), optim::lr_at(s, 100, 10, lr, 0.1f));
  EXPECT_FLOAT_EQ(optim::lr_at(0, 100, 0, lr, 0.0f), lr);  // no warmup
}

TEST(Optim, GlobalNormClipping) {
  std::vector<float> g(300001);
  double ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.001 * i), ref += double(g[i]) * g[i];
  ref = std::sqrt(ref);
  double n = optim::global_norm(g.data(), g.size());
  EXPECT_NEAR(n, ref, 1e-6 * ref);
  EXPECT_EQ(optim::clip_by_global_norm(g.data(), g.size(), n, 2 * n),
            1.0f);  // under the limit: untouched
  float s = optim::clip_by_global_norm(g.data(), g.size(), n, 1.0);
  EXPECT_NEAR(s, 1.0 / n, 1e-6 / n);
  EXPECT_NEAR(optim::global_norm(g.data(), g.size()), 1.0, 1e-5);
  EXPECT_EQ(optim::clip_by_global_norm(g.data(), g.size(), 5.0, 0.0), 1.0f);  // 0 = off
}

TEST(Optim, MaskedSumOfSquaresCountsOnlyOwnedElements) {
  std::vector<float> g(200003);
  std::vector<std::uint8_t> mask(g.size());
  double ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = std::cos(0.003 * i);
    mask[i] = (i % 7) < 3;
    if (mask[i]) ref += double(g[i]) * g[i];
  }
  EXPECT_NEAR(optim::masked_sumsq(g.data(), mask.data(), g.size()), ref, 1e-6 * ref);
  std::fill(mask.begin(), mask.end(), std::uint8_t{1});
  const double all = optim::global_norm(g.data(), g.size());
  EXPECT_NEAR(std::sqrt(optim::masked_sumsq(g.data(), mask.data(), g.size())), all, 1e-6 * all);
  EXPECT_EQ(optim::masked_sumsq(g.data(), mask.data(), 0), 0.0);
}

TEST(Optim, ClippingInsideAdamWEqualsClippingFirst) {
  // The trainer passes the clipping factor to AdamW instead of scaling the gradients in a pass
  // of their own: the same floats, bit for bit.
  model::ModelConfig cfg{2, 2, 16, 4, 37};
  model::ParamLayout layout(cfg);
  const std::size_t n = layout.total();
  Buffer<float> p1(n), p2(n), g1(n), g2(n), m1(n), m2(n), v1(n), v2(n);
  for (std::size_t i = 0; i < n; ++i) {
    p1[i] = p2[i] = 0.1f * std::sin(0.7f * i);
    g1[i] = g2[i] = 3.0f * std::cos(0.3f * i);
  }
  const double norm = optim::global_norm(g1.data(), n);
  const float scale = optim::clip_scale(norm, 1.0);
  ASSERT_LT(scale, 1.0f);
  EXPECT_EQ(optim::clip_scale(norm, 2 * norm), 1.0f);
  EXPECT_EQ(optim::clip_scale(norm, 0.0), 1.0f);  // 0 = off
  optim::AdamWConfig c;
  for (int step = 1; step <= 3; ++step) {
    std::copy(g2.data(), g2.data() + n, g1.data());
    EXPECT_EQ(optim::clip_by_global_norm(g1.data(), n, norm, 1.0), scale);
    optim::adamw_step(layout, p1.data(), g1.data(), m1.data(), v1.data(), c, 1e-2f, step);
    optim::adamw_step(layout, p2.data(), g2.data(), m2.data(), v2.data(), c, 1e-2f, step, scale);
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(p1[i], p2[i]) << i;
    ASSERT_EQ(m1[i], m2[i]) << i;
    ASSERT_EQ(v1[i], v2[i]) << i;
  }
}

TEST(Optim, AdamWDecaysOnlyMarkedTensors) {
  // With zero gradients, AdamW only applies decoupled decay: p *= 1 - lr*wd on 2-D weights.
  model::ModelConfig cfg{1, 1, 8, 4, 10};
  model::ParamLayout layout(cfg);
  Buffer<float> p(layout.total()), g(layout.total()), m(layout.total()), v(layout.total());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 1.0f;
  optim::AdamWConfig c;
  c.weight_decay = 0.5f;
  optim::adamw_step(layout, p.data(), g.data(), m.data(), v.data(), c, 0.1f, 1);
  for (const auto& t : layout.tensors())
    for (std::size_t i = 0; i < t.numel; ++i)
      ASSERT_FLOAT_EQ(p[t.offset + i], t.decay ? 0.95f : 1.0f) << t.name;
  EXPECT_TRUE(layout.find("wte.weight")->decay);
  EXPECT_TRUE(layout.find("h.0.mlp.c_fc.weight")->decay);
  EXPECT_FALSE(layout.find("h.0.mlp.c_fc.bias")->decay);
  EXPECT_FALSE(layout.find("h.0.ln_1.weight")->decay);
}
