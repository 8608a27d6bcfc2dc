#include "tessera/quant/packed_model.hpp"

#include <omp.h>

#include <algorithm>
#include <memory>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/quant/runner.hpp"

namespace tessera::quant {

std::int64_t PackedModel::bytes() const {
  std::int64_t b = 0;
  for (const auto& l : linears) b += l.bytes();
  return b;
}

double PackedModel::bits_per_weight() const {
  double weights = 0;
  for (const auto& l : linears) weights += static_cast<double>(l.rows) * l.cols;
  return weights > 0 ? 8.0 * static_cast<double>(bytes()) / weights : 0.0;
}

std::int64_t PackedModel::vocab_bytes() const {
  return (embed.rows ? embed.bytes() : 0) + (head.rows ? head.bytes() : 0);
}

const PackedLinear* PackedModel::head_matrix() const {
  if (config.tie_embeddings) return embed.rows ? &embed : nullptr;
  return head.rows ? &head : nullptr;
}

namespace {
// The bytes of w that the rows `rows` read: each run's scales, zeros and codes.
int tile_share(const PackedLinear& w, const model::TeamRows& rows, model::ByteSpan* out) {
  int n = 0;
  const std::size_t group = static_cast<std::size_t>(w.ngroups) * k_tile_rows;
  for (const model::TeamShare& run : {rows.first, rows.second}) {
    const int t0 = run.begin / k_tile_rows, t1 = (run.end + k_tile_rows - 1) / k_tile_rows;
    if (t1 <= t0) continue;
    const auto tiles = static_cast<std::size_t>(t1 - t0);
    out[n++] = {w.scales.data() + t0 * group, tiles * group * sizeof(std::uint16_t)};
    if (!w.zeros.empty()) out[n++] = {w.zeros.data() + t0 * group, tiles * group};
    if (!w.real_zeros.empty()) out[n++] = {w.real_zeros.data() + t0 * group, 4 * tiles * group};
    out[n++] = {w.block(t0, 0), w.block_offset(t1, 0) - w.block_offset(t0, 0)};
  }
  return n;
}

// The decoder's product of a packed matrix: the calling thread's rows of it (whole tiles). Each
// thread quantizes (or prepares) its own copy of the input: the same values, without waiting
// for one another; its int8 input's storage is kept between products (a cache line apart), and
// a thread beyond them (the team grew after this was made) uses one of its own.
class TeamProduct {
 public:
  TeamProduct(bool int8_activations, Isa isa)
      : int8_(int8_activations),
        isa_(isa),
        scratch_(std::make_shared<std::vector<Scratch>>(omp_get_max_threads())) {}

  void operator()(const PackedLinear& w, float* y, const float* x, const float* bias,
                  bool accumulate, ActScale scale, const model::TeamRows& rows) const {
    static_assert(model::k_team_rows == k_tile_rows, "the team's row groups are the tiles");
    Q8Input own;
    Q8Input* in = nullptr;
    if (int8_) {
      const auto i = static_cast<std::size_t>(omp_get_thread_num());
      in = i < scratch_->size() ? &(*scratch_)[i].in : &own;
      quantize_q8(w, x, scale, isa_, *in);
    }
    for (const model::TeamShare& run : {rows.first, rows.second}) {
      const int t0 = run.begin / k_tile_rows, t1 = (run.end + k_tile_rows - 1) / k_tile_rows;
      if (t1 <= t0) continue;
      if (in)
        packed_matvec_q8_tiles(w, *in, y, bias, accumulate, t0, t1, isa_);
      else
        packed_matvec_tiles(w, y, x, bias, accumulate, t0, t1, isa_);
    }
  }

 private:
  struct alignas(64) Scratch {
    Q8Input in;
  };
  bool int8_;
  Isa isa_;
  std::shared_ptr<std::vector<Scratch>> scratch_;  // shared by the copies the kernels hold
};
}  // namespace

model::DecoderKernels PackedModel::decoder_kernels() const {
  if (act_scale == ActScale::PerRow && !int8_activations)
    throw Error(
        "this file quantizes its activations per token: the packed decoder needs int8 "
        "activations",
        "use the default kernels (or the dequantized fp32 weights)");
  require_isa(isa);  // checked here: the products run inside the decoder's team
  const TeamProduct product(int8_activations, isa);
  model::DecoderKernels k;
  k.linear = [this, product](int layer, int which, float* out, const float* in, const float* bias,
                             bool accumulate) {
    const PackedLinear& w = linears[static_cast<std::size_t>(layer) * k_num_lin + which];
    product(w, out, in, bias, accumulate, act_scale, model::linear_rows(config, which, w.rows));
  };
  // A prompt's rows at once (Decoder::prefill), their inputs taken as the steps take them: with
  // int8 activations the step's kernel over runs of tiles for every row (the same values), else
  // the packed matrix-matrix kernel over fp32 inputs (the same model, as eval runs a window).
  k.matmul = [this](int layer, int site, float* out, const float* x, const float* bias,
                    std::int64_t N) {
    const PackedLinear& w = linears[static_cast<std::size_t>(layer) * k_num_lin + site];
    if (int8_activations)
      packed_matmul_q8(w, out, x, bias, N, isa, act_scale);
    else
      packed_matmul(w, out, x, bias, N, isa);
  };
  const PackedLinear* h = head_matrix();
  if (h)
    k.head = [this, h, product](float* logits, const float* x) {
      if (omp_get_thread_num() == 0)  // the padding rows (not packed): 0
        std::fill(logits + h->rows, logits + config.padded_vocab(), 0.0f);
      product(*h, logits, x, nullptr, false, ActScale::PerBlock, model::team_rows(h->rows));
    };
  k.share = [this, h](int layer, int which, model::ByteSpan* out) {
    if (which == model::k_head_product)
      return h ? tile_share(*h, model::team_rows(h->rows), out) : 0;
    const PackedLinear& w = linears[static_cast<std::size_t>(layer) * k_num_lin + which];
    return tile_share(w, model::linear_rows(config, which, w.rows), out);
  };
  if (embed.rows)
    k.embed = [this](std::int32_t token, float* x) { embed.dequantize_row(token, x); };
  return k;
}

eval::LogitsFn PackedModel::logits_fn(const model::ParamLayout& layout, const float* params,
                                      ActQuant act) const {
  auto run = std::make_shared<Runner>(layout);
  Hooks h;
  h.act = act;
  h.linear = [this](int layer, Lin k, float* out, const float* x, const float* bias,
                    std::int64_t N) {
    packed_matmul(linears[static_cast<std::size_t>(layer) * k_num_lin + static_cast<int>(k)], out,
                  x, bias, N, isa);
  };
  if (embed.rows)
    h.embed = [this](std::int32_t token, float* x) { embed.dequantize_row(token, x); };
  const PackedLinear* head_w = head_matrix();
  if (head_w)
    h.head = [this, head_w](float* logits, const float* x, std::int64_t N) {
      const int Vp = config.padded_vocab(), V = head_w->rows;
      std::vector<float> y(static_cast<std::size_t>(N) * V);
      packed_matmul(*head_w, y.data(), x, nullptr, N, isa);
      for (std::int64_t n = 0; n < N; ++n) {  // the padding rows (not packed) give 0
        std::copy(y.begin() + n * V, y.begin() + (n + 1) * V, logits + n * Vp);
        std::fill(logits + n * Vp + V, logits + (n + 1) * Vp, 0.0f);
      }
    };
  return [run, params, h](const std::int32_t* tokens, int B, int T, float* logits) {
    run->logits(params, tokens, B, T, logits, h);
  };
}

namespace {
// The (rows, C) matrices at their offsets in params that this model holds packed.
std::vector<std::pair<std::size_t, const PackedLinear*>> packed_matrices(
    const PackedModel& pm, const model::ParamLayout& layout) {
  std::vector<std::pair<std::size_t, const PackedLinear*>> out;
  for (int l = 0; l < pm.config.n_layer; ++l)
    for (int k = 0; k < k_num_lin; ++k)
      out.emplace_back(lin_weight_offset(layout, l, static_cast<Lin>(k)),
                       &pm.linears[static_cast<std::size_t>(l) * k_num_lin + k]);
  if (pm.embed.rows) out.emplace_back(layout.wte, &pm.embed);
  if (pm.head.rows) out.emplace_back(layout.head, &pm.head);
  return out;
}
}  // namespace

void PackedModel::dequantize_into(const model::ParamLayout& layout, float* params) const {
  for (const auto& [offset, w] : packed_matrices(*this, layout)) w->dequantize(params + offset);
}

std::int64_t PackedModel::release_packed_weights(const model::ParamLayout& layout,
                                                 float* params) const {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  std::int64_t released = 0;
  for (const auto& [offset, w] : packed_matrices(*this, layout)) {
    const float* p = params + offset;
    const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
    const auto end =
        reinterpret_cast<std::uintptr_t>(p + static_cast<std::size_t>(w->rows) * w->cols) / page *
        page;
    if (end > begin && madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0)
      released += static_cast<std::int64_t>(end - begin);
  }
  return released;
}

bool packable(const ActQuant& act) {
  return act.mode == ActMode::None || act.mode == ActMode::PerToken;
}

namespace {
// A model with activation quantization the packed kernels cannot reproduce (see packable).
Error not_packable(const std::string& description, const ActQuant& act) {
  return Error(fmt::format("{} quantizes activations {}; the packed decoder quantizes them one "
                           "token at a time",
                           description,
                           act.mode == ActMode::PerTensor ? "per tensor (one scale per call)"
                                                          : "with outlier columns"),
               "sample it with the simulated path (the dequantized fp32 weights)");
}

// A packed model of cfg with no matrices yet, its activations scaled as act asks.
PackedModel empty_packed(const model::ModelConfig& cfg, const ActQuant& act, Isa isa) {
  PackedModel pm;
  pm.config = cfg;
  pm.isa = isa;
  if (act.mode == ActMode::PerToken) pm.act_scale = ActScale::PerRow;
  return pm;
}

// The packed vocabulary matrix at `offset` of the parameters: the embedding, or an untied head.
void put_vocab(PackedModel& pm, const model::ParamLayout& layout, std::size_t offset,
               PackedLinear&& p) {
  if (offset == layout.wte)
    pm.embed = std::move(p);
  else if (offset == layout.head)
    pm.head = std::move(p);
}
}  // namespace

PackedModel pack_model(const AnyModel& any, ScaleType scale_type, Isa isa) {
  const auto& cfg = any.model.config;
  if (!any.quantized || any.linears.size() != static_cast<std::size_t>(cfg.n_layer) * k_num_lin)
    throw Error("the model is not a tessera quantized file",
                "quantize it first: tessera quantize -m MODEL -o DIR --method rtn");
  if (!packable(any.act)) throw not_packable(any.description, any.act);
  PackedModel pm = empty_packed(cfg, any.act, isa);
  pm.linears.reserve(any.linears.size());
  for (const auto& q : any.linears) pm.linears.push_back(pack(q, scale_type));
  const model::ParamLayout layout(cfg);
  for (const auto& v : any.vocab) put_vocab(pm, layout, v.offset, pack(v.q, scale_type));
  return pm;
}

AnyModel load_packed_model(const std::filesystem::path& path, PackedModel& packed,
                           std::string& why_not, ScaleType scale_type, Isa isa) {
  std::vector<PackedLinear> linears;
  std::vector<std::pair<std::size_t, PackedLinear>> vocab;
  why_not.clear();
  const auto pack_or_say = [&](const QuantizedLinear& q, auto&& put) {
    if (!why_not.empty()) return;  // a matrix the kernels do not take: the rest are not packed
    try {
      put(pack(q, scale_type));
    } catch (const Error& e) {
      why_not = e.what();
    }
  };
  const QuantizedSink sink{
      [&](std::size_t i, QuantizedLinear&& q) {
        pack_or_say(q, [&](PackedLinear&& p) {
          if (linears.size() <= i) linears.resize(i + 1);
          linears[i] = std::move(p);
        });
      },
      [&](std::size_t offset, QuantizedLinear&& q) {
        pack_or_say(q, [&](PackedLinear&& p) { vocab.emplace_back(offset, std::move(p)); });
      }};
  AnyModel any = load_any_model(path, false, &sink);
  packed = PackedModel{};
  if (!any.quantized) return any;
  if (why_not.empty() && !packable(any.act))
    why_not = not_packable(any.description, any.act).what();
  if (!why_not.empty()) return any;
  packed = empty_packed(any.model.config, any.act, isa);
  packed.linears = std::move(linears);
  const model::ParamLayout layout(any.model.config);
  for (auto& [offset, p] : vocab) put_vocab(packed, layout, offset, std::move(p));
  return any;
}

AnyModel load_packed_or_dequantized(const std::filesystem::path& path, PackedModel& packed,
                                    std::string& note) {
  AnyModel any = load_packed_model(path, packed, note);
  if (!note.empty()) any = load_any_model(path);
  return any;
}

PackedModel pack_model(const QuantizedModel& qm, ScaleType scale_type, Isa isa) {
  const auto& cfg = qm.config;
  const std::size_t n = static_cast<std::size_t>(cfg.n_layer) * k_num_lin;
  if (qm.linears.size() != n)
    throw Error(fmt::format("{} holds {} quantized linears where the model has {}", qm.method,
                            qm.linears.size(), n));
  if (!packable(qm.act)) throw not_packable(qm.method, qm.act);
  PackedModel pm = empty_packed(cfg, qm.act, isa);
  pm.linears.resize(n);
  for (const auto& l : qm.linears)  // layer-major, in Lin order, whatever order qm holds them in
    pm.linears[static_cast<std::size_t>(l.layer) * k_num_lin + static_cast<int>(l.kind)] =
        pack(l.q, scale_type);
  const model::ParamLayout layout(cfg);
  for (const auto& v : qm.vocab)  // named as the layout's tensor without ".weight"
    for (const auto& t : layout.tensors())
      if (t.vocab_rows && t.name == v.name + ".weight")
        (t.offset == layout.head ? pm.head : pm.embed) = pack(v.q, scale_type);
  return pm;
}

}  // namespace tessera::quant
