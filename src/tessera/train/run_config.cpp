#include "tessera/train/run_config.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/paths.hpp"
#include "tessera/core/suggest.hpp"
#include "tessera/core/toml_reader.hpp"
#include "tessera/perf/model_spec.hpp"

namespace tessera::train {
namespace {

// ---- the schema: every key of every section, in file order ----
// One list serves reading, key checks, suggestions and to_toml.
template <typename Config, typename F>
void for_each_field(Config& c, F&& f) {
  f("model", "preset", c.model.preset);  // first: explicit keys below override the preset
  f("model", "family", c.model.family);
  f("model", "n_layer", c.model.n_layer);
  f("model", "n_head", c.model.n_head);
  f("model", "n_embd", c.model.n_embd);
  f("model", "block_size", c.model.block_size);
  f("model", "vocab_size", c.model.vocab_size);
  f("model", "n_kv_head", c.model.n_kv_head);
  f("model", "intermediate_size", c.model.intermediate_size);
  f("model", "norm_eps", c.model.norm_eps);
  f("model", "rope_theta", c.model.rope_theta);
  f("model", "rope_scaling", c.model.rope_scaling);
  f("model", "rope_scaling_factor", c.model.rope_scaling_factor);
  f("model", "rope_low_freq_factor", c.model.rope_low_freq_factor);
  f("model", "rope_high_freq_factor", c.model.rope_high_freq_factor);
  f("model", "rope_original_max_positions", c.model.rope_original_max_positions);
  f("model", "tie_embeddings", c.model.tie_embeddings);

  f("data", "train", c.data.train);
  f("data", "val", c.data.val);
  f("data", "tokenizer", c.data.tokenizer);

  f("train", "batch_size", c.train.batch_size);
  f("train", "seq_len", c.train.seq_len);
  f("train", "grad_accum", c.train.grad_accum);
  f("train", "global_batch", c.train.global_batch);
  f("train", "steps", c.train.steps);
  f("train", "lr", c.train.lr);
  f("train", "min_lr_ratio", c.train.min_lr_ratio);
  f("train", "warmup_steps", c.train.warmup_steps);
  f("train", "weight_decay", c.train.weight_decay);
  f("train", "beta1", c.train.beta1);
  f("train", "beta2", c.train.beta2);
  f("train", "eps", c.train.eps);
  f("train", "grad_clip", c.train.grad_clip);
  f("train", "seed", c.train.seed);
  f("train", "val_every", c.train.val_every);
  f("train", "val_batches", c.train.val_batches);
  f("train", "ckpt_every", c.train.ckpt_every);
  f("train", "keep_checkpoints", c.train.keep_checkpoints);
  f("train", "log_every", c.train.log_every);
  f("train", "out_dir", c.train.out_dir);
  f("train", "init_from", c.train.init_from);
  f("train", "threads", c.train.threads);
  f("train", "precision", c.train.precision);
  f("train", "spike_factor", c.train.spike_factor);
  f("train", "spike_window", c.train.spike_window);
  f("train", "spike_retries", c.train.spike_retries);

  f("sample", "every", c.sample.every);
  f("sample", "tokens", c.sample.tokens);
  f("sample", "prompt", c.sample.prompt);
  f("sample", "temperature", c.sample.temperature);
  f("sample", "top_k", c.sample.top_k);

  f("hardware", "device", c.hardware.device);
  f("hardware", "gpu_reduce", c.hardware.gpu_reduce);
  f("hardware", "peak_tflops", c.hardware.peak_tflops);
  f("hardware", "tune_gemm", c.hardware.tune_gemm);
  f("hardware", "gemm_tuning_file", c.hardware.gemm_tuning_file);
  f("hardware", "cluster", c.hardware.cluster);

  f("parallel", "auto", c.parallel.automatic);
  f("parallel", "dp", c.parallel.dp);
  f("parallel", "pp", c.parallel.pp);
  f("parallel", "tx", c.parallel.tx);
  f("parallel", "ty", c.parallel.ty);
  f("parallel", "tz", c.parallel.tz);
  f("parallel", "zero", c.parallel.zero);
  f("parallel", "overlap", c.parallel.overlap);
  f("parallel", "grad_reduce", c.parallel.grad_reduce);
  f("parallel", "tensor_dtype", c.parallel.tensor_dtype);
  f("parallel", "recompute", c.parallel.recompute);
  f("parallel", "sequence_parallel", c.parallel.sequence_parallel);
  f("parallel", "overlap_dx", c.parallel.overlap_dx);
  f("parallel", "overlap_dw", c.parallel.overlap_dw);
  f("parallel", "prefetch", c.parallel.prefetch);
  f("parallel", "schedule", c.parallel.schedule);
  f("parallel", "pipeline_dtype", c.parallel.pipeline_dtype);
  f("parallel", "virtual_stages", c.parallel.virtual_stages);
  f("parallel", "pp_layers", c.parallel.pp_layers);
  f("parallel", "timeout_s", c.parallel.timeout_s);

  f("goldfish", "k", c.goldfish.k);
  f("goldfish", "h", c.goldfish.h);
  f("goldfish", "strategy", c.goldfish.strategy);
  f("goldfish", "seed", c.goldfish.seed);
}

enum class Kind { Int, UInt, Float, String, Bool };

template <typename T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, int>) return Kind::Int;
  if constexpr (std::is_same_v<T, std::uint64_t>) return Kind::UInt;
  if constexpr (std::is_same_v<T, double>) return Kind::Float;
  if constexpr (std::is_same_v<T, std::string>) return Kind::String;
  if constexpr (std::is_same_v<T, bool>) return Kind::Bool;
}

struct FieldInfo {
  std::string section, key;
  Kind kind;
  std::string default_toml;  // the default value written as TOML
};

template <typename T>
std::string toml_value(const T& v) {
  if constexpr (std::is_same_v<T, std::string>)
    return toml_quote(v);
  else if constexpr (std::is_same_v<T, bool>)
    return std::string(v ? "true" : "false");
  else if constexpr (std::is_same_v<T, double>)
    return toml_float(v);
  else
    return fmt::format("{}", v);
}

const std::vector<FieldInfo>& fields() {
  static const std::vector<FieldInfo> list = [] {
    std::vector<FieldInfo> out;
    RunConfig defaults;
    for_each_field(defaults, [&](const char* s, const char* k, auto& v) {
      using T = std::decay_t<decltype(v)>;
      out.push_back(FieldInfo{s, k, kind_of<T>(), toml_value(v)});
    });
    return out;
  }();
  return list;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> list = {"model",    "data",     "train",   "sample",
                                                "hardware", "parallel", "goldfish"};
  return list;
}

const FieldInfo* find_field(std::string_view section, std::string_view key) {
  for (const auto& f : fields())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

bool is_section(std::string_view s) {
  return std::find(sections().begin(), sections().end(), s) != sections().end();
}

std::vector<std::string> keys_of(std::string_view section) {
  std::vector<std::string> out;
  for (const auto& f : fields())
    if (f.section == section) out.push_back(f.key);
  return out;
}

bool is_integer_kind(Kind k) {
  return k == Kind::Int || k == Kind::UInt;
}

// An integer literal as TOML writes one (sign, digits, underscores between digits), whatever
// its size.
bool looks_like_integer(std::string_view s) {
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front())) ||
      !std::isdigit(static_cast<unsigned char>(s.back())))
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::string type_phrase(Kind k) {
  switch (k) {
    case Kind::Int:
      return "an integer";
    case Kind::UInt:
      return "a non-negative integer";
    case Kind::Float:
      return "a number";
    case Kind::String:
      return "a string";
    case Kind::Bool:
      return "true or false";
  }
  return "?";
}

// The hint of an unknown model.preset: the names of the catalogue (configs/models), or where it
// was looked for when there is none.
std::string preset_hint(std::string_view alternative) {
  const auto names = model_preset_names();
  if (names.empty())
    return fmt::format(
        "presets are the files of configs/models, and there is none under the "
        "working directory nor in {} (run from the repository root), {}",
        perf::models_dir().string(), alternative);
  return fmt::format("valid presets: {} (the files of {}; {})", fmt::join(names, ", "),
                     perf::models_dir().string(), alternative);
}

// The run config's schema on top of the strict TOML reader: sections and keys from
// for_each_field, --set overrides, and messages whose hints show each key's default.
class Reader {
 public:
  explicit Reader(TomlReader& toml) : toml_(toml) {}

  // Where a node came from: "--set train.lr=x" for overrides, else "file (line N)".
  std::string where(const std::string& dotted, const toml::source_region& src) const {
    auto it = origin_.find(dotted);
    if (it != origin_.end()) return it->second;
    return where(src);
  }
  std::string where(const toml::source_region& src) const { return toml_.where(src); }

  void apply_override(const std::string& item) {
    toml::table& root = toml_.root();
    const std::string origin = fmt::format("--set {}", item);
    auto eq = item.find('=');
    auto trim = [](std::string_view s) {
      auto b = s.find_first_not_of(" \t");
      if (b == std::string_view::npos) return std::string();
      auto e = s.find_last_not_of(" \t");
      return std::string(s.substr(b, e - b + 1));
    };
    std::string dotted = trim(std::string_view(item).substr(0, eq == std::string::npos ? 0 : eq));
    auto dot = dotted.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == dotted.size())
      throw Error(fmt::format("invalid override '{}': expected section.key=value", item),
                  "for example --set train.lr=3e-4 or --set train.out_dir=runs/x");
    std::string section = dotted.substr(0, dot), key = dotted.substr(dot + 1);
    if (!is_section(section)) unknown_section(section, origin);
    const FieldInfo* field = find_field(section, key);
    if (!field) unknown_key(section, key, origin);

    std::string raw = item.substr(eq + 1);
    std::optional<toml::table> parsed;
    try {
      parsed = toml::parse("v = " + raw);
    } catch (const toml::parse_error&) {
    }
    const toml::node* value = nullptr;
    if (parsed && parsed->size() == 1) value = parsed->get("v");
    toml::table holder;
    if (!value && is_integer_kind(field->kind) && looks_like_integer(trim(raw)))
      out_of_range(*field, trim(raw), origin);  // more digits than a TOML integer holds
    if (!value || (field->kind == Kind::String && !value->is_string())) {
      // Not a TOML value, or a string key given something else: take the text literally.
      holder.insert_or_assign("v", trim(raw));
      value = holder.get("v");
    }

    toml::node* sec = root.get(section);
    if (!sec) {
      root.insert(section, toml::table{});
      sec = root.get(section);
    }
    if (!sec->is_table())
      throw Error(fmt::format("'{}' in {} must be a section ([{}]), got {}", section,
                              where(sec->source()), section, describe_toml(*sec)),
                  fmt::format("write the keys under a [{}] header", section));
    value->visit([&](const auto& v) { sec->as_table()->insert_or_assign(key, v); });
    origin_[dotted] = origin;
  }

  [[noreturn]] void unknown_section(const std::string& name, const std::string& where) const {
    std::string near = closest(name, sections());
    std::string list = fmt::format("[{}]", fmt::join(sections(), "], ["));
    throw Error(fmt::format("unknown section [{}] in {}", name, where),
                near.empty() ? fmt::format("valid sections: {}", list)
                             : fmt::format("did you mean [{}]? valid sections: {}", near, list));
  }

  [[noreturn]] static void unknown_key(const std::string& section, const std::string& key,
                                       const std::string& where) {
    TomlReader::unknown_key(section, key, where, keys_of(section));
  }

  // Every top-level entry is a known section, every key in it a known key.
  void check_structure() const {
    const toml::table& root = toml_.root();
    for (auto&& [k, v] : root) {
      std::string name(k.str());
      if (!v.is_table()) {
        for (const auto& f : fields())
          if (f.key == name && !is_section(name))
            throw Error(
                fmt::format("key '{}' in {} is outside any section", name, where(k.source())),
                fmt::format("put it under a [{}] header", f.section));
        if (is_section(name))
          throw Error(fmt::format("'{}' in {} must be a section ([{}]), got {}", name,
                                  where(k.source()), name, describe_toml(v)),
                      fmt::format("write the keys under a [{}] header", name));
        unknown_section(name, where(k.source()));
      }
      if (!is_section(name)) unknown_section(name, where(k.source()));
      for (auto&& [kk, vv] : *v.as_table()) {
        std::string key(kk.str());
        if (!find_field(name, key)) unknown_key(name, key, where(name + "." + key, kk.source()));
      }
    }
  }

  [[noreturn]] void wrong_type(const FieldInfo& f, const toml::node& n) const {
    std::string dotted = f.section + "." + f.key;
    std::string hint;
    if (f.kind == Kind::String)
      hint = fmt::format("put the value in quotes, e.g. {} = {}", f.key, f.default_toml);
    else if (n.is_string())
      hint = fmt::format("write the number without quotes, e.g. {} = {}", f.key, f.default_toml);
    else if (f.kind != Kind::Float && n.is_floating_point())
      hint = fmt::format("{} takes a whole number, e.g. {} = {}", dotted, f.key, f.default_toml);
    else
      hint = fmt::format("e.g. {} = {}", f.key, f.default_toml);
    TomlReader::wrong_type(dotted, where(dotted, n.source()), n, "expected " + type_phrase(f.kind),
                           hint);
  }

  [[noreturn]] static void out_of_range(const FieldInfo& f, std::string_view value,
                                        const std::string& where) {
    const bool is_int = f.kind == Kind::Int;
    TomlReader::out_of_range(
        f.section + "." + f.key, value, where, is_int ? std::int64_t{INT_MIN} : 0,
        is_int ? std::int64_t{INT_MAX} : std::numeric_limits<std::int64_t>::max());
  }

  void read(const FieldInfo& f, const toml::node& n, int& out) const {
    if (!n.is_integer()) wrong_type(f, n);
    std::int64_t v = n.as_integer()->get();
    if (v < INT_MIN || v > INT_MAX)
      out_of_range(f, std::to_string(v), where(f.section + "." + f.key, n.source()));
    out = static_cast<int>(v);
  }
  void read(const FieldInfo& f, const toml::node& n, std::uint64_t& out) const {
    if (!n.is_integer()) wrong_type(f, n);
    std::int64_t v = n.as_integer()->get();
    if (v < 0)
      throw Error(fmt::format("invalid {}.{} = {} in {}: must be >= 0", f.section, f.key, v,
                              where(f.section + "." + f.key, n.source())),
                  fmt::format("use a non-negative integer, e.g. {} = {}", f.key, f.default_toml));
    out = static_cast<std::uint64_t>(v);
  }
  void read(const FieldInfo& f, const toml::node& n, double& out) const {
    auto v = TomlReader::as_number(n);
    if (!v) wrong_type(f, n);
    out = *v;
  }
  void read(const FieldInfo& f, const toml::node& n, bool& out) const {
    if (!n.is_boolean()) wrong_type(f, n);
    out = n.as_boolean()->get();
  }
  void read(const FieldInfo& f, const toml::node& n, std::string& out) const {
    if (!n.is_string()) wrong_type(f, n);
    out = n.as_string()->get();
  }

  void read_all(RunConfig& c) const {
    const toml::table& root = toml_.root();
    for_each_field(c, [&](const char* s, const char* k, auto& v) {
      const toml::node* n = nullptr;
      if (auto* sec = root.get_as<toml::table>(s)) n = sec->get(k);
      if (!n) return;
      const FieldInfo& f = *find_field(s, k);
      read(f, *n, v);
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
        if (f.section == "model" && f.key == "preset" && !v.empty() &&
            !apply_model_preset(c.model, v))
          throw Error(fmt::format("unknown model preset {} in {}", toml_quote(v),
                                  where("model.preset", n->source())),
                      preset_hint("or leave preset out and set n_layer, n_head, n_embd yourself"));
      }
    });
  }

 private:
  TomlReader& toml_;
  std::map<std::string, std::string> origin_;  // "section.key" -> "--set ..." for overrides
};

// ---- validation helpers ----

class Validator {
 public:
  explicit Validator(const RunConfig& c) : source_(c.source.empty() ? "<config>" : c.source) {}

  template <typename T>
  [[noreturn]] void fail(std::string_view key, const T& value, std::string_view requirement,
                         std::string hint) const {
    throw Error(
        fmt::format("invalid {} = {} in {}: {}", key, toml_value(value), source_, requirement),
        std::move(hint));
  }
  void at_least(std::string_view key, int v, int min, std::string hint = {}) const {
    if (v < min)
      fail(key, v, fmt::format("must be >= {}", min),
           hint.empty() ? fmt::format("set {} to {} or more", key, min) : std::move(hint));
  }
  void finite(std::string_view key, double v) const {
    if (!std::isfinite(v)) fail(key, v, "must be a finite number", "use a plain number");
  }

 private:
  std::string source_;
};

}  // namespace

bool apply_model_preset(ModelSection& m, std::string_view preset) {
  const auto file = perf::find_model_file(preset);
  if (!file) return false;
  const model::ModelConfig cfg = perf::load_model_spec(*file).cfg;
  m.preset = std::string(preset);
  m.family = cfg.llama() ? "llama" : "gpt2";
  m.n_layer = cfg.n_layer;
  m.n_head = cfg.n_head;
  m.n_embd = cfg.n_embd;
  m.block_size = cfg.block_size;
  m.vocab_size = cfg.vocab_size;
  m.n_kv_head = cfg.n_kv_head;
  m.intermediate_size = cfg.intermediate_size;
  m.tie_embeddings = cfg.tie_embeddings;
  return true;
}

model::ModelConfig model_config(const ModelSection& s) {
  model::ModelConfig m;
  m.family = s.family == "llama" ? model::Family::Llama : model::Family::Gpt2;
  m.n_layer = s.n_layer;
  m.n_head = s.n_head;
  m.n_embd = s.n_embd;
  m.block_size = s.block_size;
  m.vocab_size = s.vocab_size;
  m.n_kv_head = s.n_kv_head;
  m.intermediate_size = s.intermediate_size;
  m.norm_eps = s.norm_eps;
  m.rope_theta = s.rope_theta;
  m.rope_scaling.kind = s.rope_scaling == "linear"   ? model::RopeScalingKind::Linear
                        : s.rope_scaling == "llama3" ? model::RopeScalingKind::Llama3
                                                     : model::RopeScalingKind::None;
  m.rope_scaling.factor = s.rope_scaling_factor;
  m.rope_scaling.low_freq_factor = s.rope_low_freq_factor;
  m.rope_scaling.high_freq_factor = s.rope_high_freq_factor;
  m.rope_scaling.original_max_position_embeddings = s.rope_original_max_positions;
  m.tie_embeddings = s.tie_embeddings;
  return m;
}

std::vector<std::string> model_preset_names() {
  return perf::model_names();
}

RunConfig parse_run_config(std::string_view toml_text, std::string_view source_name,
                           const std::vector<std::string>& overrides) {
  const std::string source(source_name);
  TomlReader toml(toml_text, source, "see docs/config.md for the format of run configs");
  Reader reader(toml);
  for (const auto& o : overrides) reader.apply_override(o);
  reader.check_structure();
  RunConfig c;
  reader.read_all(c);
  c.source = source;
  validate(c);
  return c;
}

RunConfig load_run_config(const std::filesystem::path& given,
                          const std::vector<std::string>& overrides) {
  const std::filesystem::path file = find_data_path(given);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw Error(fmt::format("run config not found: {}", file.string()),
                "check the path; example configs are in configs/runs/ (e.g. "
                "configs/runs/demo.toml)");
  std::string text = read_file(file, "run config");
  return parse_run_config(text, file.string(), overrides);
}

namespace {

// [model]: sizes, the family and its own rules (model::validate).
void validate_model(Validator& v, const RunConfig& c) {
  const auto& m = c.model;
  if (!m.preset.empty() && !perf::find_model_file(m.preset))
    v.fail("model.preset", m.preset, "unknown preset", preset_hint("or leave it empty"));
  v.at_least("model.n_layer", m.n_layer, 1);
  v.at_least("model.n_head", m.n_head, 1);
  v.at_least("model.n_embd", m.n_embd, 1);
  v.at_least("model.block_size", m.block_size, 1,
             "block_size is the longest sequence the model "
             "can see, e.g. 128 or 1024");
  v.at_least("model.vocab_size", m.vocab_size, 1, "the GPT-2 tokenizer has 50257 tokens");
  if (m.n_embd % m.n_head != 0)
    v.fail("model.n_embd", m.n_embd,
           fmt::format("must be divisible by model.n_head = {}", m.n_head),
           fmt::format("each head gets n_embd / n_head channels; e.g. n_embd = {} or n_head = {}",
                       (m.n_embd / m.n_head + 1) * m.n_head, std::gcd(m.n_embd, m.n_head)));
  if (m.family != "gpt2" && m.family != "llama")
    v.fail("model.family", m.family, "unknown model family", "use \"gpt2\" or \"llama\"");
  if (m.rope_scaling != "none" && m.rope_scaling != "linear" && m.rope_scaling != "llama3")
    v.fail("model.rope_scaling", m.rope_scaling, "unknown rotary scaling",
           "use \"none\", \"linear\" or \"llama3\"");
  try {  // the family's own rules (kv heads, llama-only keys on gpt2, ...)
    model::validate(model_config(m));
  } catch (const Error& e) {
    throw Error(
        fmt::format("invalid model in {}: {}", c.source.empty() ? "<config>" : c.source, e.what()),
        e.hint());
  }
}

// [data]: the shards and the tokenizer are named.
void validate_data(Validator& v, const RunConfig& c) {
  const auto& d = c.data;
  if (d.train.empty())
    v.fail("data.train", d.train, "must not be empty",
           "the path of a token shard, e.g. data/brown/train.bin");
  if (d.val.empty())
    v.fail("data.val", d.val, "must not be empty",
           "the path of a token shard, e.g. data/brown/val.bin");
  if (d.tokenizer.empty())
    v.fail("data.tokenizer", d.tokenizer, "must not be empty",
           "the folder of the GPT-2 tokenizer files, e.g. data/gpt2");
}

// [train]'s batch and learning-rate schedule.
void validate_train_schedule(Validator& v, const RunConfig& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  v.at_least("train.batch_size", t.batch_size, 1);
  v.at_least("train.seq_len", t.seq_len, 1);
  if (t.seq_len > m.block_size && t.init_from.empty())  // else: checked against that model
    v.fail("train.seq_len", t.seq_len,
           fmt::format("must be <= model.block_size = {}", m.block_size),
           "lower train.seq_len or raise model.block_size (the number of positions)");
  v.at_least("train.grad_accum", t.grad_accum, 1);
  v.at_least("train.steps", t.steps, 1);
  v.at_least("train.global_batch", t.global_batch, 0,
             "0 means batch_size x grad_accum x parallel.dp");
  v.finite("train.lr", t.lr);
  if (!(t.lr > 0)) v.fail("train.lr", t.lr, "must be > 0", "typical values are 1e-4 to 1e-3");
  v.finite("train.min_lr_ratio", t.min_lr_ratio);
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1))
    v.fail("train.min_lr_ratio", t.min_lr_ratio, "must be in [0, 1]",
           "the final learning rate is lr * min_lr_ratio; 0.1 is typical");
  v.at_least("train.warmup_steps", t.warmup_steps, 0);
}

// [train]'s AdamW and gradient clipping.
void validate_train_optimizer(Validator& v, const TrainSection& t) {
  v.finite("train.weight_decay", t.weight_decay);
  if (!(t.weight_decay >= 0))
    v.fail("train.weight_decay", t.weight_decay, "must be >= 0", "0.1 is typical; 0 turns it off");
  v.finite("train.beta1", t.beta1);
  if (!(t.beta1 >= 0 && t.beta1 < 1))
    v.fail("train.beta1", t.beta1, "must be in [0, 1)", "0.9 is typical");
  v.finite("train.beta2", t.beta2);
  if (!(t.beta2 >= 0 && t.beta2 < 1))
    v.fail("train.beta2", t.beta2, "must be in [0, 1)", "0.95 or 0.999 are typical");
  v.finite("train.eps", t.eps);
  if (!(t.eps > 0)) v.fail("train.eps", t.eps, "must be > 0", "1e-8 is typical");
  v.finite("train.grad_clip", t.grad_clip);
  if (!(t.grad_clip >= 0))
    v.fail("train.grad_clip", t.grad_clip, "must be >= 0", "1.0 is typical; 0 turns clipping off");
}

// [train]'s seed, validation, checkpoints, logging, threads and loss-spike rollback.
void validate_train_run(Validator& v, const TrainSection& t) {
  if (t.seed > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    v.fail("train.seed", t.seed, "must be < 2^63", "TOML integers are 64-bit signed");
  v.at_least("train.val_every", t.val_every, 0, "0 turns validation off");
  if (t.val_every > 0)
    v.at_least("train.val_batches", t.val_batches, 1,
               "validation averages the loss over val_batches batches; set val_every = 0 to turn "
               "validation off");
  else
    v.at_least("train.val_batches", t.val_batches, 0);
  v.at_least("train.ckpt_every", t.ckpt_every, 0, "0 writes a checkpoint only at the end");
  v.at_least("train.keep_checkpoints", t.keep_checkpoints, 0, "0 keeps every checkpoint");
  v.at_least("train.log_every", t.log_every, 1);
  if (t.out_dir.empty())
    v.fail("train.out_dir", t.out_dir, "must not be empty", "e.g. out_dir = \"runs/demo\"");
  v.at_least("train.threads", t.threads, 0, "0 uses all cores");
  if (t.threads > k_max_threads)
    v.fail("train.threads", t.threads, fmt::format("must be at most {}", k_max_threads),
           "0 uses all cores; more threads than cores only slows training down");
  v.finite("train.spike_factor", t.spike_factor);
  if (!(t.spike_factor == 0 || t.spike_factor > 1))
    v.fail("train.spike_factor", t.spike_factor, "must be 0 (off) or > 1",
           "a loss above spike_factor x its recent mean rolls back; 2 to 4 are typical");
  v.at_least("train.spike_window", t.spike_window, 1);
  v.at_least("train.spike_retries", t.spike_retries, 1);
}

// [train]: batch, schedule, optimizer, checkpoints and threads.
void validate_train(Validator& v, const RunConfig& c) {
  validate_train_schedule(v, c);
  validate_train_optimizer(v, c.train);
  validate_train_run(v, c.train);
}

// [sample] and [hardware] (with train.precision, which depends on the device).
void validate_sample_and_hardware(Validator& v, const RunConfig& c) {
  const auto& s = c.sample;
  v.at_least("sample.every", s.every, 0, "0 samples only at the end");
  v.at_least("sample.tokens", s.tokens, 0, "0 turns sampling off");
  v.finite("sample.temperature", s.temperature);
  if (!(s.temperature >= 0))
    v.fail("sample.temperature", s.temperature, "must be >= 0",
           "1.0 samples from the model's distribution; 0 is greedy");
  v.at_least("sample.top_k", s.top_k, 0, "0 turns top-k filtering off");

  if (c.train.precision != "fp32" && c.train.precision != "bf16")
    v.fail("train.precision", c.train.precision, "must be \"fp32\" or \"bf16\"",
           "fp32 everywhere, or bf16 mixed precision (fp32 master weights)");
  // the dtypes of the messages: fp32, or bf16 (half the bytes)
  auto message_dtype = [&](const char* key, const std::string& value, const char* what) {
    if (value != "fp32" && value != "bf16")
      v.fail(key, value, "must be \"fp32\" or \"bf16\"",
             std::string("bf16 halves the bytes ") + what);
  };
  message_dtype("parallel.grad_reduce", c.parallel.grad_reduce,
                "of the data-parallel gradient reduction");
  message_dtype("parallel.tensor_dtype", c.parallel.tensor_dtype,
                "tensor parallelism sums and gathers");
  message_dtype("parallel.pipeline_dtype", c.parallel.pipeline_dtype,
                "sent between pipeline stages");
  if (c.hardware.device != "cpu" && c.hardware.device != "cuda")
    v.fail("hardware.device", c.hardware.device, "must be \"cpu\" or \"cuda\"",
           "cuda trains on the current NVIDIA GPU (CUDA_VISIBLE_DEVICES picks it)");
  if (c.hardware.gpu_reduce != "auto" && c.hardware.gpu_reduce != "nccl" &&
      c.hardware.gpu_reduce != "host")
    v.fail("hardware.gpu_reduce", c.hardware.gpu_reduce, "must be \"auto\", \"nccl\" or \"host\"",
           "auto uses NCCL where every rank has its own GPU and sums through the host otherwise");
  v.finite("hardware.peak_tflops", c.hardware.peak_tflops);
  if (!(c.hardware.peak_tflops >= 0))
    v.fail("hardware.peak_tflops", c.hardware.peak_tflops, "must be >= 0",
           "0 measures this machine's fp32 GEMM rate at start-up");
}

// [parallel]: the values each key may take; which grids a model can run on is
// parallel::plan_problems's answer.
void validate_parallel(Validator& v, const RunConfig& c) {
  const auto& p = c.parallel;
  v.at_least("parallel.dp", p.dp, 1);
  v.at_least("parallel.pp", p.pp, 1);
  v.at_least("parallel.tx", p.tx, 1);
  v.at_least("parallel.ty", p.ty, 1);
  v.at_least("parallel.tz", p.tz, 1);
  if (p.zero < 0 || p.zero > 3)
    v.fail("parallel.zero", p.zero, "must be 0, 1, 2 or 3",
           "0 replicates everything; 1 shards AdamW moments; 2 also gradients; 3 also parameters");
  if (p.schedule != "gpipe" && p.schedule != "1f1b" && p.schedule != "interleaved")
    v.fail("parallel.schedule", p.schedule, "must be \"gpipe\", \"1f1b\" or \"interleaved\"",
           "1f1b keeps at most pp micro-batches in flight (the default); interleaved also needs "
           "parallel.virtual_stages >= 2");
  v.at_least("parallel.virtual_stages", p.virtual_stages, 1);
  if (p.schedule == "interleaved" && p.virtual_stages < 2)
    v.fail("parallel.virtual_stages", p.virtual_stages,
           "must be >= 2 with the interleaved schedule",
           "set parallel.virtual_stages = 2 (chunks per stage), or use schedule = \"1f1b\"");
  if (p.schedule != "interleaved" && p.virtual_stages != 1)
    v.fail("parallel.virtual_stages", p.virtual_stages,
           fmt::format("must be 1 with the {} schedule", p.schedule),
           "virtual stages (chunks per stage) need schedule = \"interleaved\"");
  v.finite("parallel.timeout_s", p.timeout_s);
  if (!(p.timeout_s >= 0))
    v.fail("parallel.timeout_s", p.timeout_s, "must be >= 0",
           "0 turns the collective watchdog off");
}

// [goldfish]: k, h, the strategy and its seed.
void validate_goldfish(Validator& v, const RunConfig& c) {
  const auto& g = c.goldfish;
  if (g.k < 0 || g.k == 1)
    v.fail("goldfish.k", g.k, "must be 0 (off) or >= 2",
           "k = 4 leaves about a quarter of the targets out of the loss; 0 turns Goldfish off");
  v.at_least("goldfish.h", g.h, 1, "h is the hashed context width; 13 is the paper's default");
  if (g.strategy != "hash" && g.strategy != "static" && g.strategy != "random")
    v.fail("goldfish.strategy", g.strategy, "must be \"hash\", \"static\" or \"random\"",
           "hash drops by the last h tokens (the default), static every k-th position, random "
           "by (seed, step, position)");
  if (g.seed > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    v.fail("goldfish.seed", g.seed, "must be < 2^63", "TOML integers are 64-bit signed");
}

}  // namespace

void validate(const RunConfig& c) {
  Validator v(c);
  validate_model(v, c);
  validate_data(v, c);
  validate_train(v, c);
  validate_sample_and_hardware(v, c);
  validate_parallel(v, c);
  validate_goldfish(v, c);
}

std::string to_toml(const RunConfig& c) {
  std::string out;
  if (!c.source.empty()) {
    std::string src = c.source;
    std::replace_if(
        src.begin(), src.end(), [](char ch) { return ch == '\n' || ch == '\r'; }, ' ');
    out += fmt::format("# resolved run config (from {})\n", src);
  }
  std::string current;
  for_each_field(c, [&](const char* s, const char* k, const auto& v) {
    if (current != s) {
      out += fmt::format("{}[{}]\n", current.empty() ? "" : "\n", s);
      current = s;
    }
    out += fmt::format("{} = {}\n", k, toml_value(v));
  });
  return out;
}

}  // namespace tessera::train
