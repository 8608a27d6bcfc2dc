#include "tessera/io/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/io/gguf_quants.hpp"
#include "tessera/io/safetensors.hpp"

namespace tessera::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* k_done = "DONE";

// (rows, cols) of a stored (out, in) matrix, written as (in, out) for HF Conv1D.
void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

std::vector<std::int64_t> hf_shape(const model::ParamTensor& t, const model::ModelConfig& cfg) {
  // The vocabulary matrices hold only the real vocabulary in files (tessera pads them).
  if (t.vocab_rows) return {cfg.vocab_size, cfg.n_embd};
  if (t.transposed_in_hf) return {t.shape[1], t.shape[0]};
  return t.shape;
}

std::int64_t step_of(const fs::path& dir) {
  std::string name = dir.filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  std::int64_t v = -1;
  auto r = std::from_chars(name.data() + 5, name.data() + name.size(), v);
  if (r.ec != std::errc() || r.ptr != name.data() + name.size()) return -1;
  return v;
}

}  // namespace

namespace {

// The fp32 values of a tensor as `dtype` (fp16 / bf16 bits), round to nearest even.
std::vector<std::uint16_t> to_half(const float* p, std::size_t n, DType dtype,
                                   const std::string& name) {
  std::vector<std::uint16_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = dtype == DType::BF16 ? fp32_to_bf16(p[i]) : fp32_to_fp16(p[i]);
    if (dtype == DType::F16 && std::isfinite(p[i]) && !std::isfinite(fp16_to_fp32(out[i])))
      throw Error(fmt::format("{} holds {} (element {}), beyond fp16's range", name, p[i], i),
                  "save as bf16 or fp32");
  }
  return out;
}

const char* torch_dtype_name(DType dtype) {
  return dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
}

}  // namespace

namespace {

constexpr const char* k_model_file = "model.safetensors";
constexpr const char* k_model_index = "model.safetensors.index.json";

std::size_t file_numel(const model::ParamTensor& t, const model::ModelConfig& cfg) {
  std::size_t n = 1;  // the file's elements (wte: only the first vocab_size rows)
  for (auto d : hf_shape(t, cfg)) n *= static_cast<std::size_t>(d);
  return n;
}

// The tensors of each file: in layout order, a new file when the next tensor would take the
// current one past `max_bytes` (huggingface_hub's split_torch_state_dict_into_shards).
std::vector<std::vector<const model::ParamTensor*>> plan_shards(const model::ParamLayout& layout,
                                                                std::size_t elem_size,
                                                                std::uint64_t max_bytes) {
  std::vector<std::vector<const model::ParamTensor*>> shards(1);
  std::uint64_t bytes = 0;
  for (const auto& t : layout.tensors()) {
    const std::uint64_t n = file_numel(t, layout.config()) * elem_size;
    if (!shards.back().empty() && bytes + n > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(&t);
    bytes += n;
  }
  return shards;
}

// Writes `tensors` of the model (HF names, shapes and layouts) as one safetensors file.
void write_model_file(const fs::path& path, const model::ParamLayout& layout, const float* params,
                      DType dtype, const std::vector<const model::ParamTensor*>& tensors) {
  const auto& cfg = layout.config();
  SafetensorsWriter w;
  std::vector<std::vector<float>> transposed;  // keeps transposed copies alive until write()
  std::vector<std::vector<std::uint16_t>> halves;
  transposed.reserve(tensors.size());
  halves.reserve(tensors.size());
  for (const model::ParamTensor* t : tensors) {
    auto shape = hf_shape(*t, cfg);
    const float* src = params + t->offset;
    if (t->transposed_in_hf) {
      transposed.emplace_back(t->numel);
      transpose(params + t->offset, transposed.back().data(), t->shape[0], t->shape[1]);
      src = transposed.back().data();
    }
    const std::size_t n = file_numel(*t, cfg);
    if (dtype == DType::F32) {
      w.add_f32(t->name, shape, src);
    } else {
      halves.push_back(to_half(src, n, dtype, t->name));
      w.add(t->name, dtype, shape, halves.back().data(), n * 2);
    }
  }
  w.set_metadata("format", "pt");
  w.set_metadata("tessera_config", hf_config_text(cfg, -1, torch_dtype_name(dtype)));
  w.write(path);
}

bool is_shard_name(const std::string& name) {
  // model-NNNNN-of-NNNNN.safetensors
  if (name.size() != 32 || !name.starts_with("model-") || name.substr(11, 4) != "-of-" ||
      !name.ends_with(".safetensors"))
    return false;
  auto digits = [&](std::size_t at) {
    return std::all_of(name.begin() + at, name.begin() + at + 5,
                       [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(6) && digits(15);
}

// Removes the model files of an earlier save in `dir` (model.safetensors, the index, shards)
// that are not in `keep`.
void remove_stale_model_files(const fs::path& dir, const std::vector<std::string>& keep) {
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool model_file = name == k_model_file || name == k_model_index || is_shard_name(name);
    if (model_file && std::find(keep.begin(), keep.end(), name) == keep.end())
      stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove(p);
}

}  // namespace

std::vector<std::string> save_model(const fs::path& dir, const model::ParamLayout& layout,
                                    const float* params, DType dtype,
                                    std::uint64_t max_shard_bytes) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    throw Error(fmt::format("models are saved as F32, BF16 or F16, not {}", dtype_name(dtype)));
  if (max_shard_bytes == 0) throw Error("the largest shard of a model must hold at least 1 byte");
  const auto& cfg = layout.config();
  if (dtype == DType::F16)  // refused before any file is written
    for (const auto& t : layout.tensors())
      to_half(params + t.offset, file_numel(t, cfg), dtype, t.name);
  fs::create_directories(dir);
  const std::string config = hf_config_text(cfg, 2, torch_dtype_name(dtype)) + "\n";
  const auto shards = plan_shards(layout, dtype_size(dtype), max_shard_bytes);
  if (shards.size() == 1) {
    write_model_file(dir / k_model_file, layout, params, dtype, shards[0]);
    write_file_atomic(dir / "config.json", config);
    remove_stale_model_files(dir, {k_model_file});
    return {k_model_file};
  }
  // The index is the commit: without it (or model.safetensors) the directory holds no model.
  for (const char* commit : {k_model_index, k_model_file}) fs::remove(dir / commit);
  fsync_path(dir);
  json weight_map = json::object();
  std::vector<std::string> files;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    files.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size()));
    write_model_file(dir / files.back(), layout, params, dtype, shards[i]);
    for (const model::ParamTensor* t : shards[i]) {
      weight_map[t->name] = files.back();
      total += file_numel(*t, cfg) * dtype_size(dtype);
    }
  }
  write_file_atomic(dir / "config.json", config);
  const json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(dir / k_model_index, index.dump(2) + "\n");
  std::vector<std::string> keep = files;
  keep.push_back(k_model_index);
  remove_stale_model_files(dir, keep);
  return files;
}

std::uint64_t parse_byte_size(std::string_view text) {
  const auto bad = [&] {
    return Error(fmt::format("'{}' is not a size", text),
                 "give a number of bytes with an optional unit: 500MB, 2GB, 1.5GiB, 100000");
  };
  std::size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  std::string unit;
  for (char c : text.substr(i))
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double value = 0;
  const auto r = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || r.ec != std::errc() || r.ptr != number.data() + number.size()) throw bad();
  constexpr std::pair<const char*, double> units[] = {{"", 1},
                                                      {"B", 1},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KIB", 1024.0},
                                                      {"MIB", 1048576.0},
                                                      {"GIB", 1073741824.0},
                                                      {"TIB", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      const double bytes = std::floor(value * scale);
      if (!(bytes >= 1 && bytes < 0x1p63)) throw bad();
      return static_cast<std::uint64_t>(bytes);
    }
  throw bad();
}

namespace {

// Hugging Face's `rope_scaling` object: rope_type (or the older `type`) "default", "linear" or
// "llama3" with its factors; the other kinds (yarn, dynamic, longrope, ...) are refused.
model::RopeScaling parse_rope_scaling(const json& r, const std::string& source) {
  model::RopeScaling s;
  if (r.is_null()) return s;
  const std::string where = fmt::format("{}: rope_scaling {}", source, r.dump());
  if (!r.is_object()) throw Error(where + " is not an object");
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_key) || !r[type_key].is_string()) throw Error(where + " has no rope_type");
  const std::string type = r[type_key].get<std::string>();
  auto number = [&](const char* key, double fallback) {
    if (!r.contains(key) || r[key].is_null()) return fallback;
    if (!r[key].is_number()) throw Error(fmt::format("{}: '{}' must be a number", where, key));
    return r[key].get<double>();
  };
  if (type == "default") return s;
  if (type != "linear" && type != "llama3")
    throw Error(fmt::format("{}: rope_type \"{}\" is not supported", where, type),
                "tessera applies rotary scaling of rope_type \"linear\" and \"llama3\"");
  if (!r.contains("factor")) throw Error(where + " has no factor");
  s.kind = type == "linear" ? model::RopeScalingKind::Linear : model::RopeScalingKind::Llama3;
  s.factor = number("factor", 1.0);
  if (s.kind == model::RopeScalingKind::Linear) return s;
  s.low_freq_factor = number("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = number("high_freq_factor", s.high_freq_factor);
  const double orig =
      number("original_max_position_embeddings", s.original_max_position_embeddings);
  if (!(orig >= 1 && orig <= 1e9 && orig == std::floor(orig)))
    throw Error(
        fmt::format("{}: original_max_position_embeddings must be a positive integer", where));
  s.original_max_position_embeddings = static_cast<int>(orig);
  return s;
}

// config.json's `rope_scaling` of a model (null when there is none). Per-dimension factors
// (from a GGUF file) have no config.json form: refused.
json rope_scaling_json(const model::RopeScaling& s) {
  if (!s.freq_factors.empty())
    throw Error(
        "the model's rotary frequencies are scaled by per-dimension factors (a GGUF "
        "file's rope_freqs.weight), which config.json cannot express",
        "keep the model in GGUF form");
  if (s.kind == model::RopeScalingKind::None) return nullptr;
  json j{{"rope_type", model::rope_scaling_name(s.kind)}, {"factor", s.factor}};
  if (s.kind == model::RopeScalingKind::Llama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
    j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  return j;
}

// Hugging Face's LlamaConfig (model_type "llama"): what tessera's llama family runs, and a clear
// refusal of what it does not (biases, other activations, other rotary scalings).
template <class GetInt>
model::ModelConfig parse_llama_config(const json& j, const std::string& source, GetInt& get) {
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw Error(fmt::format("{}: '{}' must be a number", source, key));
    return j[key].get<double>();
  };
  auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
      throw Error(fmt::format("{}: '{}' must be true or false", source, key));
    return j[key].get<bool>();
  };
  model::ModelConfig c;
  c.family = model::Family::Llama;
  c.n_layer = get("num_hidden_layers", nullptr);
  c.n_head = get("num_attention_heads", nullptr);
  c.n_embd = get("hidden_size", nullptr);
  c.block_size = get("max_position_embeddings", nullptr);
  c.vocab_size = get("vocab_size", nullptr);
  c.n_kv_head = j.contains("num_key_value_heads") ? get("num_key_value_heads", nullptr) : c.n_head;
  c.intermediate_size = get("intermediate_size", nullptr);
  c.norm_eps = number("rms_norm_eps", 1e-6);
  c.rope_theta = number("rope_theta", 10000.0);
  c.tie_embeddings = flag("tie_word_embeddings", false);
  if (j.contains("head_dim") && !j["head_dim"].is_null() &&
      get("head_dim", nullptr) != c.n_embd / c.n_head)
    throw Error(fmt::format("{}: head_dim {} is not hidden_size / num_attention_heads", source,
                            j["head_dim"].dump()),
                "tessera's llama family has head_dim = hidden_size / num_attention_heads");
  if (flag("attention_bias", false) || flag("mlp_bias", false))
    throw Error(fmt::format("{}: attention_bias / mlp_bias are not supported", source),
                "tessera's llama family has no biases");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw Error(fmt::format("{}: hidden_act {} is not supported", source, j["hidden_act"].dump()),
                "tessera's llama family uses SwiGLU (hidden_act \"silu\")");
  if (j.contains("rope_scaling")) c.rope_scaling = parse_rope_scaling(j["rope_scaling"], source);
  return c;
}

}  // namespace

model::ModelConfig read_hf_config(const fs::path& path) {
  return parse_hf_config(read_file(path, "model config"), path.string());
}

namespace {

// The settings of a GPT-2 config.json that tessera's gpt2 family fixes: LayerNorms of epsilon
// 1e-5 and GPT-2's tanh GELU. A config that names others describes another model.
void check_gpt2_fixed_settings(const json& j, const std::string& path) {
  if (j.contains("layer_norm_epsilon")) {
    const json& e = j["layer_norm_epsilon"];
    if (!e.is_number() || std::fabs(e.get<double>() - 1e-5) > 1e-9)
      throw Error(fmt::format("{}: layer_norm_epsilon is {}, not 1e-05", path, e.dump()),
                  "tessera's gpt2 family has LayerNorms of epsilon 1e-5, as GPT-2 has");
  }
  if (j.contains("activation_function") && j["activation_function"] != "gelu_new")
    throw Error(fmt::format("{}: activation_function is {}, not \"gelu_new\"", path,
                            j["activation_function"].dump()),
                "tessera's gpt2 family has GPT-2's GELU (tanh approximation, gelu_new)");
}

}  // namespace

model::ModelConfig parse_hf_config(std::string_view text, const std::string& source) {
  struct {
    const std::string& s;
    const std::string& string() const { return s; }
  } path{source};
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(fmt::format("{} is not valid JSON", path.string()), "expected a GPT-2 config.json");
  auto get = [&](const char* key, const char* alt) -> int {
    const json* v = j.contains(key) ? &j[key] : (alt && j.contains(alt) ? &j[alt] : nullptr);
    if (!v)
      throw Error(fmt::format("{} lacks '{}'", path.string(), key), "expected a GPT-2 config.json");
    if (!v->is_number_integer())
      throw Error(fmt::format("{}: '{}' must be an integer", path.string(), key));
    auto x = v->get<std::int64_t>();
    if (x <= 0 || x > (1 << 30))
      throw Error(fmt::format("{}: '{}' = {} is out of range", path.string(), key, x));
    return static_cast<int>(x);
  };
  const bool llama = j.contains("model_type") && j["model_type"] == "llama";
  if (j.contains("model_type") && j["model_type"] != "gpt2" && !llama)
    throw Error(
        fmt::format("{}: model_type {} is not supported", path.string(), j["model_type"].dump()),
        "tessera loads GPT-2 and Llama architecture models");
  model::ModelConfig c;
  if (llama) {
    c = parse_llama_config(j, path.string(), get);
  } else {
    c.n_layer = get("n_layer", "num_hidden_layers");
    c.n_head = get("n_head", "num_attention_heads");
    c.n_embd = get("n_embd", "hidden_size");
    c.block_size = get("n_positions", "n_ctx");
    c.vocab_size = get("vocab_size", nullptr);
    check_gpt2_fixed_settings(j, path.string());
  }
  try {
    model::validate(c);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
  return c;
}

void check_model_tensors(const SafetensorsFile& st, const model::ParamLayout& layout,
                         const std::string& prefix,
                         const std::function<bool(const model::ParamTensor&)>& skip) {
  const auto& cfg = layout.config();
  for (const auto& t : layout.tensors()) {
    if (skip && skip(t)) continue;
    const std::string name = prefix + t.name;
    const auto shape = hf_shape(t, cfg);
    const TensorInfo* ti = st.find(name);
    if (!ti)
      throw Error(fmt::format("{} lacks the tensor '{}' of the model in its config ({})",
                              st.path().string(), name, model::describe(cfg)),
                  "is this a GPT-2 model of the shape in config.json?");
    if (ti->shape != shape)
      throw Error(fmt::format("shape mismatch for '{}' in {}: file has {}, the model in its config "
                              "({}) expects {}",
                              name, st.path().string(), shape_str(ti->shape), model::describe(cfg),
                              shape_str(shape)),
                  "the config.json beside the file does not describe this model");
  }
}

void check_finite(const model::ParamLayout& layout, const float* params, const std::string& source,
                  const std::function<bool(const model::ParamTensor&)>& skip) {
  for (const auto& t : layout.tensors()) {
    if (skip && skip(t)) continue;
    const float* p = params + t.offset;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < t.numel; ++i)
      if (!std::isfinite(p[i]) && bad++ == 0) first = i;
    if (bad)
      throw Error(fmt::format("{}: tensor '{}' holds {} non-finite value{} (NaN or infinity; the "
                              "first at element {} of {})",
                              source, t.name, bad, bad > 1 ? "s" : "", first, t.numel),
                  "the weights are damaged, or training had diverged when they were saved; use "
                  "an earlier checkpoint");
  }
}

namespace {

// Where the model of `path` is: its safetensors file and its config.json.
std::pair<fs::path, fs::path> model_files(const fs::path& path) {
  if (input_kind(path, "model") == InputKind::Directory)
    return {path / "model.safetensors", path / "config.json"};
  return {path, path.parent_path() / "config.json"};
}

// Anything in the file besides the model must be a known non-parameter (mask buffers, tied head).
void check_no_unexpected_tensors(const SafetensorsFile& st, const model::ParamLayout& layout,
                                 const std::string& prefix) {
  for (const auto& t : st.tensors()) {
    std::string n = t.name.substr(t.name.rfind(prefix, 0) == 0 ? prefix.size() : 0);
    bool known = layout.find(n) != nullptr;
    bool ignorable =
        n == "lm_head.weight" || t.name == "lm_head.weight" || n.ends_with("rotary_emb.inv_freq") ||
        (n.size() > 10 && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")));
    if (!known && !ignorable)
      throw Error(fmt::format("{} holds an unexpected tensor '{}'", st.path().string(), t.name),
                  "is this a GPT-2 model of the shape in config.json?");
  }
}

}  // namespace

model::ModelConfig model_config_of(const SafetensorsFile& st, const fs::path& config_path) {
  if (input_kind(config_path, "model config") != InputKind::Missing)
    return read_hf_config(config_path);
  if (auto it = st.metadata().find("tessera_config"); it != st.metadata().end())
    return parse_hf_config(it->second, st.path().string() + " (embedded config)");
  throw Error(fmt::format("no config.json beside {}", st.path().string()),
              "put the model's config.json in the same directory");
}

void check_model_fits(const model::ParamLayout& layout, const fs::path& file) {
  check_fits_in_memory(
      4.0 * static_cast<double>(layout.total()),
      fmt::format("loading {} ({})", file.string(), model::describe(layout.config())),
      "use a machine with more memory, or check the model's config.json");
}

namespace {

// Reads every tensor of the layout (HF name prefix + name) from the file `shard_of` names for it.
LoadedModel read_model(const model::ModelConfig& cfg, const model::ParamLayout& layout,
                       const std::string& prefix,
                       const std::function<const SafetensorsFile&(const std::string&)>& shard_of,
                       const fs::path& source) {
  check_model_fits(layout, source);
  LoadedModel out{cfg, Buffer<float>(layout.total())};
  std::vector<float> tmp;
  for (const auto& t : layout.tensors()) {
    auto shape = hf_shape(t, cfg);
    const std::string name = prefix + t.name;
    const SafetensorsFile& st = shard_of(name);
    if (t.transposed_in_hf) {
      tmp.resize(t.numel);
      st.read_f32(name, shape, tmp.data());
      transpose(tmp.data(), out.params.data() + t.offset, shape[0], shape[1]);
    } else {
      st.read_f32(name, shape, out.params.data() + t.offset);
    }
  }
  check_finite(layout, out.params.data(), source.string());
  return out;
}

// A Hugging Face checkpoint in several files: model.safetensors.index.json maps every tensor
// name to its file in the same directory.
LoadedModel load_sharded_model(const fs::path& dir) {
  const fs::path index_path = dir / "model.safetensors.index.json";
  const json index = json::parse(read_file(index_path, "model index"), nullptr, false);
  auto bad = [&](const std::string& what) {
    return Error(fmt::format("{}: {}", index_path.string(), what),
                 "expected Hugging Face's {\"weight_map\": {tensor name: file name}}");
  };
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object())
    throw bad("not a safetensors index");
  std::map<std::string, std::string> file_of;
  std::map<std::string, SafetensorsFile> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) throw bad(fmt::format("the file of '{}' is not a string", name));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw bad(fmt::format("'{}' is not a file name in the same directory", f));
    file_of[name] = f;
    if (!shards.count(f)) shards.emplace(f, SafetensorsFile::open(dir / f));
  }
  const model::ModelConfig cfg = read_hf_config(dir / "config.json");
  std::string prefix;
  if (!file_of.count("wte.weight") && file_of.count("transformer.wte.weight"))
    prefix = "transformer.";
  const model::ParamLayout layout(cfg);
  for (const auto& t : layout.tensors())
    if (!file_of.count(prefix + t.name))
      throw bad(fmt::format("no file holds the tensor '{}' of the model in config.json ({})",
                            prefix + t.name, model::describe(cfg)));
  for (const auto& [f, st] : shards) {  // each file: its tensors' shapes, nothing unexpected
    check_model_tensors(st, layout, prefix, [&, &fname = f](const model::ParamTensor& t) {
      return file_of.at(prefix + t.name) != fname;
    });
    check_no_unexpected_tensors(st, layout, prefix);
  }
  return read_model(
      cfg, layout, prefix,
      [&](const std::string& name) -> const SafetensorsFile& {
        return shards.at(file_of.at(name));
      },
      index_path);
}

}  // namespace

LoadedModel load_model(const fs::path& path) {
  // A llama.cpp GGUF file (io/gguf_model.hpp); a missing one is reported as a GGUF file.
  if (path.extension() == ".gguf" && input_kind(path, "model file") != InputKind::Directory)
    return load_gguf_model(path);
  if (input_kind(path, "model") == InputKind::Directory &&
      input_kind(path / "model.safetensors", "model file") == InputKind::Missing &&
      input_kind(path / "model.safetensors.index.json", "model index") != InputKind::Missing)
    return load_sharded_model(path);
  const auto [file, config_path] = model_files(path);
  if (input_kind(file, "model file") == InputKind::Missing)
    throw Error(fmt::format("model file not found: {}", file.string()),
                "pass a run or checkpoint directory, a .safetensors or .gguf file, or a "
                "pretrained model's short name (smollm2-135m)");
  auto st = SafetensorsFile::open(file);
  const model::ModelConfig cfg = model_config_of(st, config_path);
  // Names may carry "transformer." (GPT2LMHeadModel.save_pretrained) or not (the official files).
  std::string prefix;
  if (!st.contains("wte.weight") && st.contains("transformer.wte.weight")) prefix = "transformer.";
  model::ParamLayout layout(cfg);
  // The file must hold this model before its memory is allocated.
  check_model_tensors(st, layout, prefix);
  check_no_unexpected_tensors(st, layout, prefix);
  return read_model(
      cfg, layout, prefix, [&](const std::string&) -> const SafetensorsFile& { return st; }, file);
}

namespace {
fs::path tmp_dir_of(const fs::path& root, std::int64_t step) {
  return root / fmt::format(".tmp_step_{:08d}", step);
}
std::string shard_file(int rank, int nshards) {
  return fmt::format("state_{:05d}-of-{:05d}.safetensors", rank, nshards);
}
}  // namespace

fs::path begin_checkpoint(const fs::path& root, std::int64_t step) {
  fs::create_directories(root);
  auto tmp = tmp_dir_of(root, step);
  fs::remove_all(tmp);  // a save of this step that was interrupted earlier
  fs::create_directories(tmp);
  return tmp;
}

void write_state_shard(const fs::path& root, std::int64_t step, int rank, int nshards,
                       const StateShard& shard) {
  auto tmp = tmp_dir_of(root, step);
  SafetensorsWriter w;
  std::int64_t n = static_cast<std::int64_t>(shard.end - shard.begin);
  w.add_f32("adamw.m", {n}, shard.m);
  w.add_f32("adamw.v", {n}, shard.v);
  w.set_metadata("begin", std::to_string(shard.begin));
  w.set_metadata("end", std::to_string(shard.end));
  w.write(tmp / shard_file(rank, nshards));
}

namespace {

using Shards = std::vector<std::pair<std::size_t, std::size_t>>;

// Tensor t's entry in the state index: its global shape and offset, and the slice of it each
// shard holds ([shard, start, end) in the tensor).
json tensor_entry(const model::ParamTensor& t, const Shards& shards) {
  json slices = json::array();
  for (std::size_t r = 0; r < shards.size(); ++r) {
    const std::size_t lo = std::max(t.offset, shards[r].first),
                      hi = std::min(t.offset + t.numel, shards[r].second);
    if (hi > lo) slices.push_back({r, lo - t.offset, hi - t.offset});
  }
  return {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"slices", slices}};
}

// The state index of a checkpoint: the training state, the shards and every tensor's entry.
json state_index(const model::ParamLayout& layout, const TrainState& state, const Shards& shards) {
  json idx;
  idx["format"] = "tessera-train-state-1";
  idx["step"] = state.step;
  idx["rng_state"] =
      std::to_string(state.rng_state);  // as text: JSON numbers lose 64-bit precision
  idx["data_position"] = std::to_string(state.data_position);
  idx["tokens_seen"] = state.tokens_seen;
  idx["param_count"] = layout.total();
  idx["extra"] = state.extra;
  json sh = json::array();
  for (std::size_t r = 0; r < shards.size(); ++r)
    sh.push_back({{"file", shard_file(static_cast<int>(r), static_cast<int>(shards.size()))},
                  {"begin", shards[r].first},
                  {"end", shards[r].second}});
  idx["shards"] = sh;
  json ts = json::array();
  for (const auto& t : layout.tensors()) ts.push_back(tensor_entry(t, shards));
  idx["tensors"] = ts;
  return idx;
}

// Retention: drops the oldest complete checkpoints of root beyond `keep` (0: none), and stale
// temporaries.
void prune_checkpoints(const fs::path& root, int keep) {
  std::vector<std::pair<std::int64_t, fs::path>> done;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string name = e.path().filename().string();
    if (name.rfind(".tmp_step_", 0) == 0) {
      std::error_code ec;
      fs::remove_all(e.path(), ec);
      continue;
    }
    auto st = step_of(e.path());
    if (st >= 0 && fs::exists(e.path() / k_done)) done.emplace_back(st, e.path());
  }
  std::sort(done.begin(), done.end());
  if (keep > 0)
    for (std::size_t i = 0; i + keep < done.size(); ++i) fs::remove_all(done[i].second);
}

}  // namespace

fs::path commit_checkpoint(const fs::path& root, const model::ParamLayout& layout,
                           const float* params, const TrainState& state, const Shards& shards,
                           int keep) {
  auto tmp = tmp_dir_of(root, state.step);
  auto final_dir = root / fmt::format("step_{:08d}", state.step);
  save_model(tmp, layout, params);
  write_file_atomic(tmp / "state_index.json", state_index(layout, state, shards).dump(1) + "\n");
  for (std::size_t r = 0; r < shards.size(); ++r)
    if (!fs::exists(tmp / shard_file(static_cast<int>(r), static_cast<int>(shards.size()))))
      throw InternalError(fmt::format("state shard {} is missing from {}", r, tmp.string()));
  write_file_atomic(tmp / k_done, fmt::format("step {}\n", state.step));
  fsync_path(tmp);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // re-saving the same step
  fs::rename(tmp, final_dir);
  fsync_path(root);
  prune_checkpoints(root, keep);
  return final_dir;
}

fs::path save_checkpoint(const fs::path& root, const model::ParamLayout& layout,
                         const float* params, const float* adam_m, const float* adam_v,
                         const TrainState& state, int keep) {
  begin_checkpoint(root, state.step);
  write_state_shard(root, state.step, 0, 1, StateShard{0, layout.total(), adam_m, adam_v});
  return commit_checkpoint(root, layout, params, state, {{0, layout.total()}}, keep);
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::int64_t best = -1;
  fs::path best_path;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const auto& e = *it;
    auto s = step_of(e.path());
    std::error_code done_ec;
    if (s > best && fs::exists(e.path() / k_done, done_ec)) {
      best = s;
      best_path = e.path();
    }
  }
  if (best < 0) return std::nullopt;
  return best_path;
}

namespace {

// The tensors of the index must be the layout's, in order, each with the slices of it that the
// shards hold (as commit_checkpoint writes them).
void check_index_tensors(const json& idx, const model::ParamLayout& layout, const Shards& shards,
                         const std::function<Error(const std::string&)>& bad) {
  if (!idx.contains("tensors") || !idx["tensors"].is_array()) throw bad("no tensor list");
  const auto& ts = idx["tensors"];
  if (ts.size() != layout.tensors().size())
    throw bad(
        fmt::format("it lists {} tensors, the model has {}", ts.size(), layout.tensors().size()));
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& t = layout.tensors()[i];
    const json want = tensor_entry(t, shards);
    if (!ts[i].is_object()) throw bad(fmt::format("tensor entry {} is not an object", i));
    for (const char* key : {"name", "shape", "offset", "slices"})
      if (!ts[i].contains(key) || ts[i][key] != want[key])
        throw bad(fmt::format("tensor '{}' has {} {}, the model's layout has {}", t.name, key,
                              ts[i].contains(key) ? ts[i][key].dump() : "(missing)",
                              want[key].dump()));
  }
}

// The shards of the index: they must tile [0, param_count) in order.
Shards index_shards(const json& idx, std::size_t total,
                    const std::function<Error(const std::string&)>& bad) {
  if (!idx.contains("shards") || !idx["shards"].is_array() || idx["shards"].empty())
    throw bad("no shards");
  Shards out;
  std::size_t expect = 0;
  for (const auto& sh : idx["shards"]) {
    if (!sh.is_object() || !sh.contains("file") || !sh["file"].is_string() ||
        !sh.contains("begin") || !sh.contains("end") || !sh["begin"].is_number_unsigned() ||
        !sh["end"].is_number_unsigned())
      throw bad("malformed shard entry");
    std::size_t sb = sh["begin"].get<std::size_t>(), se = sh["end"].get<std::size_t>();
    std::string file = sh["file"].get<std::string>();
    if (sb != expect || se < sb || se > total || file.find('/') != std::string::npos ||
        file != shard_file(static_cast<int>(out.size()), static_cast<int>(idx["shards"].size())))
      throw bad(fmt::format("shard {} covers [{}, {})", file, sb, se));
    expect = se;
    out.emplace_back(sb, se);
  }
  if (expect != total) throw bad("the shards do not cover every parameter");
  return out;
}

// The AdamW moments of [begin, end) into adam_m and adam_v (from begin), read from each shard
// of checkpoint `dir` that overlaps them, every value checked finite.
void read_moments(const fs::path& dir, const Shards& shards, std::size_t begin, std::size_t end,
                  float* adam_m, float* adam_v) {
  for (std::size_t r = 0; r < shards.size(); ++r) {
    const auto [sb, se] = shards[r];
    const std::size_t lo = std::max(sb, begin), hi = std::min(se, end);
    if (hi <= lo) continue;
    const std::string file = shard_file(static_cast<int>(r), static_cast<int>(shards.size()));
    auto st = SafetensorsFile::open(dir / file);
    std::int64_t shape[1] = {static_cast<std::int64_t>(se - sb)};
    std::vector<float> tmp(se - sb);
    for (auto [name, out] : {std::pair{"adamw.m", adam_m}, std::pair{"adamw.v", adam_v}}) {
      st.read_f32(name, shape, tmp.data());
      if (!std::all_of(tmp.begin() + (lo - sb), tmp.begin() + (hi - sb),
                       [](float x) { return std::isfinite(x); }))
        throw Error(fmt::format("{}: the AdamW state '{}' holds non-finite values (NaN or "
                                "infinity)",
                                (dir / file).string(), name),
                    "the state is damaged, or training had diverged when it was saved");
      std::copy(tmp.begin() + (lo - sb), tmp.begin() + (hi - sb), out + (lo - begin));
    }
  }
}

// The training state of checkpoint `dir`: the index and the moments of [begin, end).
// read_state does the work; load_state turns a JSON value of the wrong type anywhere in the
// index (e.g. a duplicated key whose last value is an array) into the damaged-index error.
TrainState read_state(const fs::path& dir, const model::ParamLayout& layout, std::size_t begin,
                      std::size_t end, float* adam_m, float* adam_v) {
  const fs::path index_path = dir / "state_index.json";
  json idx = json::parse(read_file(index_path, "checkpoint state index"), nullptr, false);
  std::function<Error(const std::string&)> bad = [&](const std::string& what) {
    return Error(fmt::format("checkpoint state index {} is damaged: {}", index_path.string(), what),
                 "resume from another checkpoint");
  };
  if (idx.is_discarded() || !idx.is_object() || !idx.contains("format") ||
      idx["format"] != "tessera-train-state-1")
    throw bad("not a tessera state index");
  auto num = [&](const char* key) -> std::uint64_t {
    if (!idx.contains(key)) throw bad(fmt::format("'{}' missing", key));
    const auto& v = idx[key];
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
      return static_cast<std::uint64_t>(v.get<std::int64_t>());
    if (v.is_string()) {
      std::uint64_t x = 0;
      const auto& str = v.get_ref<const std::string&>();
      auto r = std::from_chars(str.data(), str.data() + str.size(), x);
      if (r.ec == std::errc() && r.ptr == str.data() + str.size()) return x;
    }
    throw bad(fmt::format("'{}' is not a non-negative integer", key));
  };
  if (num("param_count") != layout.total())
    throw bad(fmt::format("it holds {} parameters, the model has {}", num("param_count"),
                          layout.total()));
  const auto shards = index_shards(idx, layout.total(), bad);
  check_index_tensors(idx, layout, shards, bad);
  read_moments(dir, shards, begin, end, adam_m, adam_v);
  TrainState s;
  s.step = static_cast<std::int64_t>(num("step"));
  s.rng_state = num("rng_state");
  s.data_position = num("data_position");
  s.tokens_seen = static_cast<std::int64_t>(num("tokens_seen"));
  if (idx.contains("extra") && idx["extra"].is_object())
    for (auto& [k, v] : idx["extra"].items())
      if (v.is_string()) s.extra[k] = v.get<std::string>();
  return s;
}

TrainState load_state(const fs::path& dir, const model::ParamLayout& layout, std::size_t begin,
                      std::size_t end, float* adam_m, float* adam_v) {
  try {
    return read_state(dir, layout, begin, end, adam_m, adam_v);
  } catch (const json::exception& e) {
    throw Error(fmt::format("checkpoint state index {} is damaged: {}",
                            (dir / "state_index.json").string(), library_message(e)),
                "resume from another checkpoint");
  }
}

// What to do about a checkpoint that cannot be loaded: resume from the previous complete one.
std::string damaged_checkpoint_hint(const fs::path& dir) {
  const auto step = step_of(dir);
  std::optional<fs::path> previous;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir.parent_path(), ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto s = step_of(it->path());
    std::error_code done_ec;
    if (s >= 0 && s < step && fs::exists(it->path() / k_done, done_ec) &&
        (!previous || s > step_of(*previous)))
      previous = it->path();
  }
  const std::string aside = fmt::format("mv {} {}.damaged", dir.string(), dir.string());
  if (previous)
    return fmt::format(
        "move it aside ({}) and run again with --resume to continue from the "
        "previous complete checkpoint, {}",
        aside, previous->string());
  return fmt::format(
      "there is no earlier complete checkpoint: move it aside ({}) and start "
      "afresh with --overwrite, or restore it from a copy",
      aside);
}

// Runs one part of loading checkpoint `dir`; its errors say how to go on from another one.
template <typename F>
auto load_part(const fs::path& dir, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint {} cannot be loaded: {}", dir.string(), e.what()),
                damaged_checkpoint_hint(dir));
  }
}

}  // namespace

TrainState load_checkpoint(const fs::path& dir, const model::ParamLayout& layout, float* params,
                           std::size_t begin, std::size_t end, float* adam_m, float* adam_v) {
  std::error_code ec;
  if (!fs::exists(dir / k_done, ec))
    throw Error(fmt::format("checkpoint {} is incomplete (no DONE marker)", dir.string()),
                "it was interrupted while saving; resume from an earlier one");
  auto loaded = load_part(dir, [&] { return load_model(dir); });
  if (!(loaded.config == layout.config()))
    throw Error(
        fmt::format("checkpoint {} holds a model {} but the run configures {}", dir.string(),
                    model::describe(loaded.config), model::describe(layout.config())),
        "resume with the configuration the checkpoint was trained with");
  std::copy(loaded.params.data(), loaded.params.data() + layout.total(), params);
  return load_part(dir, [&] { return load_state(dir, layout, begin, end, adam_m, adam_v); });
}

TrainState load_checkpoint(const fs::path& dir, const model::ParamLayout& layout, float* params,
                           float* adam_m, float* adam_v) {
  return load_checkpoint(dir, layout, params, 0, layout.total(), adam_m, adam_v);
}

std::string hf_config_text(const model::ModelConfig& c, int indent, const char* torch_dtype) {
  if (c.llama()) {
    const json j{{"model_type", "llama"},
                 {"architectures", {"LlamaForCausalLM"}},
                 {"num_hidden_layers", c.n_layer},
                 {"num_attention_heads", c.n_head},
                 {"num_key_value_heads", c.kv_heads()},
                 {"hidden_size", c.n_embd},
                 {"head_dim", c.head_dim()},
                 {"intermediate_size", c.ffn()},
                 {"max_position_embeddings", c.block_size},
                 {"vocab_size", c.vocab_size},
                 {"rms_norm_eps", c.norm_eps},
                 {"rope_theta", c.rope_theta},
                 {"rope_scaling", rope_scaling_json(c.rope_scaling)},
                 {"tie_word_embeddings", c.tie_embeddings},
                 {"hidden_act", "silu"},
                 {"attention_bias", false},
                 {"mlp_bias", false},
                 {"torch_dtype", torch_dtype}};
    return j.dump(indent);
  }
  json j{{"model_type", "gpt2"},       {"architectures", {"GPT2LMHeadModel"}},
         {"n_layer", c.n_layer},       {"n_head", c.n_head},
         {"n_embd", c.n_embd},         {"n_positions", c.block_size},
         {"n_ctx", c.block_size},      {"vocab_size", c.vocab_size},
         {"layer_norm_epsilon", 1e-5}, {"activation_function", "gelu_new"},
         {"tie_word_embeddings", true}};
  if (std::string_view(torch_dtype) != "float32") j["torch_dtype"] = torch_dtype;
  return j.dump(indent);
}

}  // namespace tessera::io
