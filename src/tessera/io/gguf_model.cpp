#include "tessera/io/gguf_model.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::io {

namespace {

constexpr std::string_view k_arch_hint =
    "tessera loads GGUF files of llama.cpp's \"llama\" architecture (Llama 2 and 3, SmolLM, "
    "TinyLlama, Mistral 7B v0.1...) and \"gpt2\" (GPT-2)";

std::string file_of(const GgufFile& f) {
  return f.path().string();
}

// A count (layers, heads, widths): a positive integer that fits an int. `fallback` when absent.
int count_key(const GgufFile& f, std::string_view key,
              std::optional<std::int64_t> fallback = std::nullopt) {
  if (fallback && !f.find_metadata(key)) return static_cast<int>(*fallback);
  const std::int64_t v = f.get_int(key);
  if (v <= 0 || v > std::numeric_limits<int>::max())
    throw Error(fmt::format("{}: metadata '{}' is {}, expected a positive count below 2^31",
                            file_of(f), key, v),
                "the file is damaged, or not a model tessera can run");
  return static_cast<int>(v);
}

// A real number. A float32 value is read back as the shortest decimal that rounds to it (the
// number the converter was given, e.g. rms_norm_eps 1e-5 rather than 9.99999974738e-06), so the
// config equals the one Hugging Face's config.json gives for the same model.
double real_key(const GgufFile& f, std::string_view key,
                std::optional<double> fallback = std::nullopt) {
  if (fallback && !f.find_metadata(key)) return *fallback;
  const GgufValue& v = f.metadata(key);
  const double x = f.get_float(key);
  if (v.type() == GgufType::F32 && std::isfinite(x))
    return std::strtod(fmt::format("{}", static_cast<float>(x)).c_str(), nullptr);
  return x;
}

// GGUF dims (innermost first) against a row-major shape; trailing dims of 1 are allowed, as
// ggml's tensors always have 4 dims.
bool dims_match(const GgufTensorInfo& g, const std::vector<std::int64_t>& shape) {
  if (g.dims.size() < shape.size()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (g.dims[i] != shape[shape.size() - 1 - i]) return false;
  for (std::size_t i = shape.size(); i < g.dims.size(); ++i)
    if (g.dims[i] != 1) return false;
  return true;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Rotary scaling from the metadata, in the forms llama.cpp's converters write it: linear
// (llama.rope.scaling.type "linear", or no type, with llama.rope.scaling.factor or the older
// llama.rope.scale_linear; llama.cpp divides the frequencies by it). Other types (yarn, ...)
// are refused. Llama 3.1-style scaling comes as the tensor rope_freqs.weight instead.
model::RopeScaling gguf_rope_scaling(const GgufFile& f) {
  const std::string hint =
      "tessera applies rotary scaling of type \"linear\", and Llama "
      "3.1-style frequency factors (rope_freqs.weight)";
  std::string type;
  if (f.find_metadata("llama.rope.scaling.type")) type = f.get_string("llama.rope.scaling.type");
  if (!type.empty() && type != "none" && type != "linear")
    throw Error(fmt::format("{}: rotary scaling llama.rope.scaling.type = \"{}\" is not "
                            "supported",
                            file_of(f), type),
                hint);
  model::RopeScaling r;
  for (std::string_view key : {"llama.rope.scale_linear", "llama.rope.scaling.factor"})
    if (f.find_metadata(key)) {
      const double factor = f.get_float(key);
      if (factor == 0.0 || factor == 1.0) continue;
      if (type == "none")
        throw Error(fmt::format("{}: {} = {} with llama.rope.scaling.type \"none\"", file_of(f),
                                key, factor),
                    hint);
      r.kind = model::RopeScalingKind::Linear;
      r.factor = factor;
    }
  return r;
}

// llama.cpp's converter writes Llama 3.1-style scaling as per-dimension factors,
// 1 / ((1 - s) / factor + s) between the bands (the angle is divided by them). The factors of
// Llama 3.x's parameters (low 1, high 4, original context 8192, factor = the last one) are read
// back as that scaling; any other factors are kept as they are.
void read_rope_freqs(const GgufFile& f, model::ModelConfig& c) {
  const GgufTensorInfo* g = f.find("rope_freqs.weight");
  if (!g) return;
  if (!dims_match(*g, {c.head_dim() / 2}) || !can_dequantize(g->type))
    throw Error(
        fmt::format("{}: tensor 'rope_freqs.weight' has GGUF dims {} and type {}, "
                    "expected [{}] frequency factors",
                    file_of(f), shape_str(g->dims), ggml_type_name(g->type), c.head_dim() / 2),
        "the file is damaged");
  const std::vector<float> factors = f.dequantize(*g);
  if (std::all_of(factors.begin(), factors.end(), [](float x) { return x == 1.0f; })) return;
  model::ModelConfig llama3 = c;
  llama3.rope_scaling = {};
  const std::vector<double> base = model::rope_inv_freq(llama3);
  llama3.rope_scaling.kind = model::RopeScalingKind::Llama3;
  llama3.rope_scaling.factor = factors.back();
  bool same = c.rope_scaling.kind == model::RopeScalingKind::None && factors.back() > 1;
  if (same) {
    const std::vector<double> scaled = model::rope_inv_freq(llama3);
    for (std::size_t i = 0; i < factors.size() && same; ++i)
      same = std::abs(base[i] / scaled[i] - factors[i]) <= 1e-5 * factors[i];
  }
  if (same)
    c.rope_scaling = llama3.rope_scaling;
  else
    c.rope_scaling.freq_factors = factors;
}

}  // namespace

namespace {

// The model architecture the file names: "llama" or "gpt2"; anything else is refused.
std::string architecture_of(const GgufFile& f) {
  if (!f.find_metadata("general.architecture"))
    throw Error(fmt::format("{} has no metadata 'general.architecture'", file_of(f)),
                "a model file written by llama.cpp's converters names its architecture; this "
                "one may hold only a vocabulary");
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "gpt2")
    throw Error(fmt::format("{}: model architecture \"{}\" is not supported", file_of(f), arch),
                std::string(k_arch_hint));
  return arch;
}

// The vocabulary: the rows of the token embedding, (vocab, C) stored with dims [C, vocab];
// `<arch>.vocab_size` and the tokenizer's token count, when present, must agree with it.
int read_vocab(const GgufFile& f, const std::string& arch, int n_embd) {
  const std::string file = file_of(f);
  const GgufTensorInfo* emb = f.find("token_embd.weight");
  if (!emb)
    throw Error(fmt::format("{} has no tensor 'token_embd.weight'", file),
                "the file holds no model weights (a vocabulary-only file?)");
  if (emb->dims.size() < 2 || !dims_match(*emb, {emb->dims[1], emb->dims[0]}) ||
      emb->dims[0] != n_embd)
    throw Error(fmt::format("{}: token_embd.weight has GGUF dims {}, expected [{}, vocab] "
                            "({}.embedding_length = {})",
                            file, shape_str(emb->dims), n_embd, arch, n_embd),
                "the file is damaged, or was written for another architecture");
  if (emb->dims[1] <= 0 || emb->dims[1] > model::k_max_vocab)
    throw Error(fmt::format("{}: token_embd.weight has {} rows, expected a vocabulary of 1 to {}",
                            file, emb->dims[1], model::k_max_vocab),
                "the file is damaged");
  const int vocab = static_cast<int>(emb->dims[1]);
  const std::string vocab_key = arch + ".vocab_size";
  if (f.find_metadata(vocab_key) && f.get_int(vocab_key) != vocab)
    throw Error(fmt::format("{}: {} is {}, but token_embd.weight has {} rows", file, vocab_key,
                            f.get_int(vocab_key), vocab),
                "the file is damaged");
  if (const GgufValue* tokens = f.find_metadata("tokenizer.ggml.tokens")) {
    if (tokens->type() != GgufType::Array || tokens->element_type() != GgufType::String)
      throw Error(fmt::format("{}: metadata 'tokenizer.ggml.tokens' is {}, expected an array of "
                              "strings",
                              file, tokens->describe()),
                  "the file is damaged, or was not written by llama.cpp's converters");
    if (tokens->size() != static_cast<std::uint64_t>(vocab))
      throw Error(fmt::format("{}: the tokenizer has {} tokens, but token_embd.weight has {} rows",
                              file, tokens->size(), vocab),
                  "every token must have a row of the embedding; the file is damaged");
  }
  return vocab;
}

// Head sizes other than n_embd / n_head, and partial rotary dimensions, are llama.cpp options
// that tessera's families do not have.
void check_head_size(const GgufFile& f, const std::string& arch, const model::ModelConfig& c) {
  const int head_dim = c.head_dim();
  for (std::string_view suffix :
       {".rope.dimension_count", ".attention.key_length", ".attention.value_length"}) {
    const std::string key = arch + std::string(suffix);
    if (f.find_metadata(key) && f.get_int(key) != head_dim)
      throw Error(fmt::format("{}: metadata '{}' is {}, but the head size "
                              "(embedding_length / head_count) is {}",
                              file_of(f), key, f.get_int(key), head_dim),
                  "tessera's models have heads of embedding_length / head_count");
  }
}

void validate_config(const GgufFile& f, const model::ModelConfig& c, std::string_view what) {
  try {
    model::validate(c);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: the {} it describes is not valid: {}", file_of(f), what, e.what()),
                e.hint());
  }
}

// GPT-2 as llama.cpp's converter writes it (GPT2Model: gpt2.block_count, .context_length,
// .embedding_length, .feed_forward_length = 4 embedding_length, .attention.head_count,
// .attention.layer_norm_epsilon). tessera's gpt2 family has LayerNorms of epsilon 1e-5, an MLP
// of 4 n_embd and a head tied to the token embedding: other values are refused.
model::ModelConfig gpt2_config(const GgufFile& f) {
  const std::string file = file_of(f);
  model::ModelConfig c;
  c.family = model::Family::Gpt2;
  c.n_layer = count_key(f, "gpt2.block_count");
  c.n_embd = count_key(f, "gpt2.embedding_length");
  c.n_head = count_key(f, "gpt2.attention.head_count");
  c.block_size = count_key(f, "gpt2.context_length");
  const int ffn = count_key(f, "gpt2.feed_forward_length");
  if (static_cast<std::int64_t>(ffn) != 4 * static_cast<std::int64_t>(c.n_embd))
    throw Error(fmt::format("{}: gpt2.feed_forward_length is {}, not 4 x embedding_length ({})",
                            file, ffn, 4 * static_cast<std::int64_t>(c.n_embd)),
                "tessera's gpt2 family has an MLP of 4 n_embd");
  if (count_key(f, "gpt2.attention.head_count_kv", c.n_head) != c.n_head)
    throw Error(fmt::format("{}: gpt2.attention.head_count_kv is {}, not head_count ({})", file,
                            f.get_int("gpt2.attention.head_count_kv"), c.n_head),
                "GPT-2 has as many key-value heads as heads");
  const double eps = real_key(f, "gpt2.attention.layer_norm_epsilon", 1e-5);
  if (eps != 1e-5)
    throw Error(fmt::format("{}: gpt2.attention.layer_norm_epsilon is {}, not 1e-05", file, eps),
                "tessera's gpt2 family has LayerNorms of epsilon 1e-5, as GPT-2 has");
  c.vocab_size = read_vocab(f, "gpt2", c.n_embd);
  validate_config(f, c, "model");
  check_head_size(f, "gpt2", c);
  return c;
}

model::ModelConfig llama_config(const GgufFile& f) {
  const std::string file = file_of(f);
  model::ModelConfig c;
  c.family = model::Family::Llama;
  c.n_layer = count_key(f, "llama.block_count");
  c.n_embd = count_key(f, "llama.embedding_length");
  c.n_head = count_key(f, "llama.attention.head_count");
  c.n_kv_head = count_key(f, "llama.attention.head_count_kv", c.n_head);
  c.intermediate_size = count_key(f, "llama.feed_forward_length");
  c.block_size = count_key(f, "llama.context_length");
  c.rope_theta = real_key(f, "llama.rope.freq_base", 10000.0);
  c.norm_eps = real_key(f, "llama.attention.layer_norm_rms_epsilon");
  c.tie_embeddings = f.find("output.weight") == nullptr;

  if (f.find_metadata("llama.expert_count") && f.get_int("llama.expert_count") > 0)
    throw Error(fmt::format("{}: a mixture of experts (llama.expert_count = {}) is not supported",
                            file, f.get_int("llama.expert_count")),
                "tessera's llama family has one dense MLP per layer");
  c.rope_scaling = gguf_rope_scaling(f);
  c.vocab_size = read_vocab(f, "llama", c.n_embd);
  validate_config(f, c, "model");
  check_head_size(f, "llama", c);
  read_rope_freqs(f, c);
  validate_config(f, c, "rotary scaling");
  return c;
}

}  // namespace

model::ModelConfig gguf_model_config(const GgufFile& f) {
  return architecture_of(f) == "gpt2" ? gpt2_config(f) : llama_config(f);
}

LoadedModel load_gguf_model(const std::filesystem::path& file) {
  return load_gguf_model(GgufFile::open(file));
}

std::string gguf_name_of(const model::ModelConfig& cfg, const std::string& hf_name) {
  const auto name = cfg.llama() ? llama_hf_to_gguf_name(hf_name) : gpt2_hf_to_gguf_name(hf_name);
  TESSERA_CHECK(name.has_value(), "no GGUF name for {}", hf_name);
  return *name;
}

namespace {

// A tensor of the file that the model does not use: one error, naming what it is when that is
// known (a llama bias, a mixture of experts).
[[noreturn]] void refuse_extra_tensor(const GgufFile& f, const GgufTensorInfo& g,
                                      const model::ModelConfig& cfg) {
  const std::string file = file_of(f);
  const auto hf = cfg.llama() ? llama_gguf_to_hf_name(g.name) : std::nullopt;
  if (hf && hf->ends_with(".bias"))
    throw Error(fmt::format("{}: tensor '{}' is a bias, which tessera's llama family does not "
                            "have",
                            file, g.name),
                "tessera runs llama models without biases (attention_bias = mlp_bias = false)");
  if (g.name.find("_exps.") != std::string::npos || g.name.find("_shexp.") != std::string::npos ||
      g.name.find("ffn_gate_inp.") != std::string::npos)
    throw Error(fmt::format("{}: tensor '{}' belongs to a mixture of experts, which is not "
                            "supported",
                            file, g.name),
                "tessera's llama family has one dense MLP per layer");
  throw Error(fmt::format("{} holds tensor '{}', which the model ({}) does not have", file, g.name,
                          model::describe(cfg)),
              fmt::format("the file holds a variant of the {} architecture that tessera does not "
                          "run",
                          model::family_name(cfg.family)));
}

// GPT-2's head is the token embedding. Older llama.cpp converters wrote it again as
// output.weight: accepted when it equals token_embd.weight, value for value.
void check_tied_output(const GgufFile& f, const GgufTensorInfo& g, const model::ModelConfig& cfg,
                       const float* wte) {
  if (!dims_match(g, {cfg.vocab_size, cfg.n_embd}) || !can_dequantize(g.type))
    throw Error(fmt::format("{}: tensor 'output.weight' has GGUF dims {} and type {}, expected "
                            "a copy of token_embd.weight",
                            file_of(f), shape_str(g.dims), ggml_type_name(g.type)),
                "tessera's gpt2 family ties the head to the token embedding");
  const std::vector<float> head = f.dequantize(g);
  if (!std::equal(head.begin(), head.end(), wte))
    throw Error(fmt::format("{}: output.weight differs from token_embd.weight", file_of(f)),
                "tessera's gpt2 family ties the head to the token embedding");
}

// Where a tensor of the model comes from in the file.
struct Source {
  const model::ParamTensor* dst;
  const GgufTensorInfo* src;
  std::int64_t qk_heads;  // q_proj, k_proj: the heads to permute the rows with; else 0
};

// Finds the model's tensor `t` in the file and checks its shape and type.
Source find_source(const GgufFile& f, const model::ModelConfig& cfg, const model::ParamTensor& t) {
  const std::string file = file_of(f);
  const std::string name = gguf_name_of(cfg, t.name);
  const GgufTensorInfo* g = f.find(name);
  if (!g)
    throw Error(fmt::format("{} has no tensor '{}' ({}), which the model ({}) needs", file, name,
                            t.name, model::describe(cfg)),
                "the file is incomplete, or holds another kind of model");
  std::vector<std::int64_t> shape = t.shape;
  if (t.vocab_rows) shape[0] = cfg.vocab_size;  // unpadded
  if (!dims_match(*g, shape))
    throw Error(fmt::format("{}: tensor '{}' ({}) has shape {} (GGUF dims {}), but the model "
                            "({}) needs {}",
                            file, name, t.name, shape_str(g->shape()), shape_str(g->dims),
                            model::describe(cfg), shape_str(shape)),
                "the file's metadata does not describe its tensors; the file is damaged");
  if (!can_dequantize(g->type))
    throw Error(fmt::format("tensor '{}' in {} has type {}, which tessera cannot dequantize", name,
                            file, ggml_type_name(g->type)),
                fmt::format("tessera dequantizes {}; requantize the model to one of these with "
                            "llama.cpp's llama-quantize",
                            dequantizable_type_names()));
  return {&t, g, gguf_qk_heads(cfg, t.name)};
}

}  // namespace

std::int64_t gguf_qk_heads(const model::ModelConfig& cfg, const std::string& hf_name) {
  if (!cfg.llama()) return 0;
  if (hf_name.ends_with("self_attn.q_proj.weight")) return cfg.n_head;
  if (hf_name.ends_with("self_attn.k_proj.weight")) return cfg.kv_heads();
  return 0;
}

LoadedModel load_gguf_model(const GgufFile& f, const SkipTensor& skip) {
  const std::string file = file_of(f);
  const model::ModelConfig cfg = gguf_model_config(f);
  const model::ParamLayout layout(cfg);

  // Every tensor of the model, found and checked before anything is allocated.
  std::vector<Source> sources;
  std::set<std::string, std::less<>> used;
  for (const auto& t : layout.tensors()) {
    sources.push_back(find_source(f, cfg, t));
    used.insert(sources.back().src->name);
  }

  // Anything else changes what the model computes (or belongs to another model): refused.
  // rope_freqs.weight was read into a llama configuration (gguf_model_config); a gpt2 file's
  // output.weight must be the token embedding again.
  const GgufTensorInfo* tied_output = nullptr;
  for (const auto& g : f.tensors()) {
    if (used.contains(g.name) || (cfg.llama() && g.name == "rope_freqs.weight")) continue;
    if (!cfg.llama() && g.name == "output.weight") {
      tied_output = &g;
      continue;
    }
    refuse_extra_tensor(f, g, cfg);
  }

  check_model_fits(layout, f.path());
  LoadedModel out{cfg, Buffer<float>(layout.total())};
  std::vector<float> tmp;
  const auto skipped = [&](const model::ParamTensor& t) { return skip && skip(t); };
  for (const auto& s : sources) {
    if (skipped(*s.dst)) continue;
    const auto n = static_cast<std::size_t>(s.src->numel());
    std::span<float> dst(out.params.data() + s.dst->offset, n);
    if (s.qk_heads == 0) {
      f.dequantize(*s.src, dst);
      continue;
    }
    // llama.cpp's converter interleaved each head's rows for its RoPE; undo it.
    tmp.resize(n);
    f.dequantize(*s.src, tmp);
    permute_qk_rows(std::as_bytes(std::span<const float>(tmp)), std::as_writable_bytes(dst),
                    s.qk_heads, s.dst->shape[0], /*to_hf=*/true);
  }
  const bool wte_read = std::none_of(sources.begin(), sources.end(), [&](const Source& s) {
    return s.dst->offset == layout.wte && skipped(*s.dst);
  });
  if (tied_output && wte_read)
    check_tied_output(f, *tied_output, cfg, out.params.data() + layout.wte);
  check_finite(layout, out.params.data(), file, skipped);
  return out;
}

void save_gguf_model(const std::filesystem::path& file, const model::ParamLayout& layout,
                     const float* params, GgmlType type, const data::BpeVocab* vocab) {
  gguf_model_writer(layout, params, type, vocab, file.stem().string()).write(file);
}

namespace {
// The model's rotary scaling as llama.cpp reads it: linear as llama.rope.scaling.type and
// .factor; llama3 (and per-dimension factors) as the tensor rope_freqs.weight, the factors that
// divide each unscaled inverse frequency.
void add_rope_scaling(GgufWriter& w, const model::ModelConfig& c) {
  const model::RopeScaling& r = c.rope_scaling;
  model::ModelConfig plain = c, factored = c;
  plain.rope_scaling = {};
  if (r.kind == model::RopeScalingKind::Linear) {
    w.set_metadata("llama.rope.scaling.type", GgufValue::string("linear"));
    w.set_metadata("llama.rope.scaling.factor", GgufValue::f32(static_cast<float>(r.factor)));
    factored.rope_scaling.kind = model::RopeScalingKind::None;
  }
  if (!factored.rope_scaling.scaled()) return;
  const std::vector<double> base = model::rope_inv_freq(plain);
  const std::vector<double> scaled = model::rope_inv_freq(factored);
  std::vector<float> factors(base.size());
  for (std::size_t i = 0; i < base.size(); ++i)
    factors[i] = static_cast<float>(base[i] / scaled[i]);
  w.add_f32("rope_freqs.weight", GgmlType::F32, {static_cast<std::int64_t>(factors.size())},
            factors);
}

GgufValue u32(int v) {
  return GgufValue::u32(static_cast<std::uint32_t>(v));
}

// llama.cpp's general.file_type (LlamaFileType) of files whose matrices are `type`.
std::uint32_t file_type_of(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
      return 0;  // ALL_F32
    case GgmlType::F16:
      return 1;  // MOSTLY_F16
    case GgmlType::BF16:
      return 32;  // MOSTLY_BF16
    case GgmlType::Q4_0:
      return 2;  // MOSTLY_Q4_0
    case GgmlType::Q4_1:
      return 3;  // MOSTLY_Q4_1
    default:
      return 7;  // MOSTLY_Q8_0
  }
}

// llama.* metadata, as LlamaModel.set_gguf_parameters writes it.
void add_llama_metadata(GgufWriter& w, const model::ModelConfig& c) {
  w.set_metadata("llama.block_count", u32(c.n_layer));
  w.set_metadata("llama.context_length", u32(c.block_size));
  w.set_metadata("llama.embedding_length", u32(c.n_embd));
  w.set_metadata("llama.feed_forward_length", u32(c.ffn()));
  w.set_metadata("llama.attention.head_count", u32(c.n_head));
  w.set_metadata("llama.attention.head_count_kv", u32(c.kv_heads()));
  w.set_metadata("llama.rope.freq_base", GgufValue::f32(static_cast<float>(c.rope_theta)));
  w.set_metadata("llama.rope.dimension_count", u32(c.head_dim()));
  add_rope_scaling(w, c);
  w.set_metadata("llama.attention.layer_norm_rms_epsilon",
                 GgufValue::f32(static_cast<float>(c.norm_eps)));
  w.set_metadata("llama.vocab_size", u32(c.vocab_size));
}

// gpt2.* metadata, as GPT2Model.set_gguf_parameters writes it.
void add_gpt2_metadata(GgufWriter& w, const model::ModelConfig& c) {
  w.set_metadata("gpt2.block_count", u32(c.n_layer));
  w.set_metadata("gpt2.context_length", u32(c.block_size));
  w.set_metadata("gpt2.embedding_length", u32(c.n_embd));
  w.set_metadata("gpt2.feed_forward_length", u32(c.ffn()));
  w.set_metadata("gpt2.attention.head_count", u32(c.n_head));
  w.set_metadata("gpt2.attention.layer_norm_epsilon", GgufValue::f32(1e-5f));
}

// The tensor types llama.cpp's converter gives: 1-D tensors (norms, biases) and the position
// embedding F32, the other matrices by gguf_matrix_type.
GgmlType tensor_type(const model::ParamTensor& t, const model::ParamLayout& layout, GgmlType type) {
  const bool positions = !layout.config().llama() && t.offset == layout.wpe;
  if (t.shape.size() == 1 || positions) return GgmlType::F32;
  return gguf_matrix_type(type, t.shape.back(), t.vocab_rows);
}

}  // namespace

GgmlType gguf_matrix_type(GgmlType type, std::int64_t cols, bool table) {
  if (table && (type == GgmlType::Q4_0 || type == GgmlType::Q4_1)) type = GgmlType::Q8_0;
  return cols % ggml_type_info(type).block_size == 0 ? type : GgmlType::F16;
}

GgufWriter gguf_model_writer(const model::ParamLayout& layout, const float* params, GgmlType type,
                             const data::BpeVocab* vocab, const std::string& name,
                             const RowEncoder& encode) {
  const model::ModelConfig& c = layout.config();
  if (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16 &&
      type != GgmlType::Q8_0 && type != GgmlType::Q4_0 && type != GgmlType::Q4_1)
    throw Error("GGUF models are written as F32, F16, BF16, Q8_0, Q4_0 or Q4_1");
  if (vocab && vocab->tokens.size() != static_cast<std::size_t>(c.vocab_size))
    throw Error(fmt::format("the tokenizer has {} tokens and the model's vocabulary {}: a GGUF "
                            "model needs them equal",
                            vocab->tokens.size(), c.vocab_size),
                "write the model with the tokenizer it was trained with");
  GgufWriter w;
  w.set_metadata("general.architecture", GgufValue::string(model::family_name(c.family)));
  w.set_metadata("general.name", GgufValue::string(name));
  if (c.llama()) {
    w.set_metadata("general.file_type", GgufValue::u32(file_type_of(type)));
    add_llama_metadata(w, c);
  } else {  // the order of llama.cpp's GPT-2 files
    add_gpt2_metadata(w, c);
    w.set_metadata("general.file_type", GgufValue::u32(file_type_of(type)));
  }
  if (vocab) set_gguf_tokenizer(w, *vocab);
  for (const auto& t : layout.tensors()) {
    std::vector<std::int64_t> shape = t.shape;
    if (t.vocab_rows) shape[0] = c.vocab_size;
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    const GgmlType tt = tensor_type(t, layout, type);
    const std::int64_t qk_heads = gguf_qk_heads(c, t.name);
    // tessera stores GPT-2's Conv1D weights (out, in), as llama.cpp's converter transposes them.
    const std::vector<std::int64_t> dims{shape.rbegin(), shape.rend()};
    if (auto rows = encode && shape.size() == 2 && tt != GgmlType::F32
                        ? encode(static_cast<std::int64_t>(t.offset), shape[0], shape[1], tt)
                        : std::nullopt) {
      if (qk_heads) {
        std::vector<std::byte> permuted(rows->size());
        permute_qk_rows(*rows, permuted, qk_heads, shape[0], false);
        rows = std::move(permuted);
      }
      w.add_encoded(gguf_name_of(c, t.name), tt, dims, *rows);
      continue;
    }
    std::vector<float> v(params + t.offset, params + t.offset + n);
    if (qk_heads) v = permute_qk_to_gguf(v, qk_heads, shape[0], shape[1]);
    w.add_f32(gguf_name_of(c, t.name), tt, dims, v);
  }
  return w;
}

}  // namespace tessera::io
