#include "tessera/io/tokenizer_files.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/paths.hpp"

namespace tessera::io {
namespace {

using data::BpeVocab;
using data::PreTokenizer;
using data::TokenType;
using nlohmann::json;

constexpr std::string_view k_supported_pre = "gpt-2, smollm, llama-bpe";

// GGUF token types (llama.cpp's llama_token_type).
constexpr std::int64_t k_token_control = 3;
constexpr std::int64_t k_token_user_defined = 4;

std::optional<PreTokenizer> pre_from_gguf_name(std::string_view name) {
  if (name == "gpt-2" || name == "gpt2") return PreTokenizer::Gpt2;
  if (name == "smollm") return PreTokenizer::Digits;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizer::Llama3;
  return std::nullopt;
}

// "left right" (each side spelled in the byte-level alphabet) -> raw bytes.
using Sides = std::pair<std::string, std::string>;

// A merge's two sides as written: "left right" (one space), or a tokenizer.json's [left, right].
std::optional<Sides> merge_text_sides(std::string_view merge) {
  const std::size_t sp = merge.find(' ');
  if (sp == std::string_view::npos || merge.find(' ', sp + 1) != std::string_view::npos)
    return std::nullopt;
  return Sides{std::string(merge.substr(0, sp)), std::string(merge.substr(sp + 1))};
}
std::optional<Sides> merge_sides(const json& m) {
  if (m.is_string()) return merge_text_sides(m.get_ref<const std::string&>());
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return Sides{m[0].get<std::string>(), m[1].get<std::string>()};
  return std::nullopt;
}

// Sides spelled in the byte-level alphabet -> raw bytes.
bool byte_level_sides(const std::optional<Sides>& sides, Sides& out) {
  if (!sides) return false;
  auto left = data::byte_level_decode(sides->first);
  auto right = data::byte_level_decode(sides->second);
  if (!left || !right) return false;
  out = {std::move(*left), std::move(*right)};
  return true;
}

std::optional<std::uint32_t> gguf_token_id(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find_metadata(key);
  if (!v) return std::nullopt;
  const std::int64_t id = v->as_int(fmt::format("metadata '{}' in {}", key, f.path().string()));
  if (id < 0 || id > 0xFFFFFFFFll)
    throw Error(
        fmt::format("metadata '{}' in {} is {}, not a token id", key, f.path().string(), id));
  return static_cast<std::uint32_t>(id);
}

void gguf_tokens(const GgufFile& f, BpeVocab& vocab) {
  const std::string file = f.path().string();
  auto spelled = f.get_strings("tokenizer.ggml.tokens");
  std::vector<std::int64_t> types;
  if (f.find_metadata("tokenizer.ggml.token_type")) {
    types = f.get_ints("tokenizer.ggml.token_type");
    if (types.size() != spelled.size())
      throw Error(fmt::format("{}: tokenizer.ggml.token_type has {} entries for {} tokens", file,
                              types.size(), spelled.size()));
  }
  vocab.tokens.resize(spelled.size());
  for (std::size_t id = 0; id < spelled.size(); ++id) {
    const bool special =
        !types.empty() && (types[id] == k_token_control || types[id] == k_token_user_defined);
    if (special) {
      vocab.tokens[id] = std::move(spelled[id]);  // raw text
      if (!vocab.tokens[id].empty()) vocab.special_ids.push_back(static_cast<std::uint32_t>(id));
      continue;
    }
    auto bytes = data::byte_level_decode(spelled[id]);
    if (!bytes)
      throw Error(
          fmt::format("{}: token {} of tokenizer.ggml.tokens is not spelled in the "
                      "byte-level alphabet",
                      file, id));
    vocab.tokens[id] = std::move(*bytes);
  }
}

// j[key] when j is an object holding it with the type asked for; `fallback` when it is absent;
// tessera::Error when it has another type.
bool json_bool(const json& j, const char* key, bool fallback, const std::string& file) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw Error(fmt::format("{}: '{}' is not true or false", file, key));
  return j[key].get<bool>();
}
std::string json_string(const json& j, const char* key, const std::string& file) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  if (!j[key].is_string()) throw Error(fmt::format("{}: '{}' is not a string", file, key));
  return j[key].get<std::string>();
}

// tokenizer.json's pre_tokenizer -> the pre-tokenizer it is; throws for anything else.
PreTokenizer hf_pre(const json& pre, const std::string& file) {
  auto bad = [&](std::string_view why) {
    return Error(fmt::format("{}: pre_tokenizer {} is not supported ({})", file,
                             pre.dump().substr(0, 200), why),
                 "tessera reads ByteLevel, Sequence[Digits, ByteLevel] (SmolLM2) and "
                 "Sequence[Split, ByteLevel] (Llama 3)");
  };
  auto type_of = [&](const json& j) { return json_string(j, "type", file); };
  auto byte_level = [&](const json& j, bool regex) {
    if (type_of(j) != "ByteLevel") return false;
    if (json_bool(j, "add_prefix_space", false, file)) throw bad("add_prefix_space is true");
    return json_bool(j, "use_regex", true, file) == regex;
  };
  if (byte_level(pre, true)) return PreTokenizer::Gpt2;
  if (type_of(pre) != "Sequence" || !pre.contains("pretokenizers") ||
      !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 2)
    throw bad("not one of the known forms");
  const json& first = pre["pretokenizers"][0];
  const json& second = pre["pretokenizers"][1];
  if (type_of(first) == "Digits" && json_bool(first, "individual_digits", false, file) &&
      byte_level(second, true))
    return PreTokenizer::Digits;
  if (type_of(first) == "Split" && byte_level(second, false) &&
      json_string(first, "behavior", file) == "Isolated" &&
      !json_bool(first, "invert", false, file) && first.contains("pattern")) {
    if (json_string(first["pattern"], "Regex", file) ==
        data::pre_tokenizer_regexes(PreTokenizer::Llama3).at(0))
      return PreTokenizer::Llama3;
    throw bad("its Split regex is not Llama 3's");
  }
  throw bad("not one of the known forms");
}

Sides hf_merge(const json& m, std::size_t rank, const std::string& file) {
  Sides out;
  if (!byte_level_sides(merge_sides(m), out))
    throw Error(
        fmt::format("{}: merge {} is not \"left right\" in the byte-level alphabet", file, rank));
  return out;
}

// model.vocab and added_tokens -> vocab.tokens and vocab.special_ids; the vocab's keys are
// spelled in the byte-level alphabet, or (`byte_level` false: SentencePiece) as they are.
void hf_tokens(const json& j, BpeVocab& vocab, const std::string& file, bool byte_level = true) {
  const json& model = j["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
    throw Error(fmt::format("{}: model.vocab is not an object of token ids", file));
  const bool have_added = j.contains("added_tokens") && j["added_tokens"].is_array();
  // Ids are 0..n-1 over the vocab and the added tokens, so a larger one leaves a gap.
  const std::size_t entries = model["vocab"].size() + (have_added ? j["added_tokens"].size() : 0);
  std::vector<char> seen;
  auto place = [&](std::uint64_t id, std::string bytes, bool added) {
    if (id >= entries)
      throw Error(fmt::format("{}: token id {} is past the {} entries (ids are 0..n-1)", file, id,
                              entries));
    if (id >= vocab.tokens.size()) {
      vocab.tokens.resize(id + 1);
      seen.resize(id + 1, 0);
    }
    if (seen[id] && !added)  // an added token may restate a vocab entry
      throw Error(fmt::format("{}: token id {} is used twice in model.vocab", file, id));
    vocab.tokens[id] = std::move(bytes);
    seen[id] = 1;
  };
  for (const auto& [spelled, id] : model["vocab"].items()) {
    auto bytes = byte_level ? data::byte_level_decode(spelled)
                            : (spelled.empty() ? std::nullopt : std::optional(spelled));
    if (!id.is_number_unsigned() || !bytes)
      throw Error(fmt::format("{}: model.vocab entry '{}' is not a {} token with an id", file,
                              spelled.substr(0, 60), byte_level ? "byte-level" : "non-empty"));
    place(id.get<std::uint64_t>(), std::move(*bytes), false);
  }
  if (have_added) {
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_unsigned() ||
          !t.contains("content") || !t["content"].is_string() ||
          t["content"].get<std::string>().empty())
        throw Error(fmt::format("{}: an added_tokens entry has no id or content", file));
      const auto id = t["id"].get<std::uint64_t>();
      place(id, t["content"].get<std::string>(), true);
      vocab.special_ids.push_back(static_cast<std::uint32_t>(id));
    }
  }
  for (std::size_t id = 0; id < seen.size(); ++id)
    if (!seen[id]) throw Error(fmt::format("{}: no token has id {}", file, id));
}

std::optional<std::uint32_t> find_token(const BpeVocab& vocab, std::string_view text) {
  for (std::uint32_t id : vocab.special_ids)
    if (vocab.tokens[id] == text) return id;
  return std::nullopt;
}

// tokenizer_config.json's "bos_token" / "eos_token": a string or {"content": ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const json& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string())
    return t["content"].get<std::string>();
  return std::nullopt;
}

// The BOS added to every sequence: the post-processor's leading special token.
void hf_bos(const json& j, BpeVocab& vocab) {
  if (!j.contains("post_processor")) return;
  const json& post = j["post_processor"];
  if (!post.is_object() || !post.contains("type") || post["type"] != "TemplateProcessing" ||
      !post.contains("single") || !post["single"].is_array() || post["single"].empty())
    return;
  const json& first = post["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken") || !first["SpecialToken"].is_object() ||
      !first["SpecialToken"].contains("id") || !first["SpecialToken"]["id"].is_string())
    return;
  vocab.bos = find_token(vocab, first["SpecialToken"]["id"].get<std::string>());
  vocab.add_bos = vocab.bos.has_value();
}

// tokenizer_config.json, when there is one: the names of the BOS and EOS tokens.
void hf_config(const std::filesystem::path& cfg_path, BpeVocab& vocab) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg_path, ec)) return;
  json cfg;
  try {
    cfg = json::parse(read_file(cfg_path, "tokenizer_config.json"));
  } catch (const json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", cfg_path.string(), library_message(e)));
  }
  if (!cfg.is_object()) return;
  if (auto bos = config_token(cfg, "bos_token"); bos && !vocab.bos)
    vocab.bos = find_token(vocab, *bos);
  if (auto eos = config_token(cfg, "eos_token")) vocab.eos = find_token(vocab, *eos);
}

// A SentencePiece vocabulary's tokens, scores (absent: 0) and types (absent: all normal); the
// control, user-defined and unknown tokens are its special tokens.
void gguf_spm_pieces(const GgufFile& f, BpeVocab& vocab) {
  const std::string file = f.path().string();
  vocab.tokens = f.get_strings("tokenizer.ggml.tokens");
  const std::size_t n = vocab.tokens.size();
  auto sized = [&](std::string_view key, std::size_t got) {
    if (got != n)
      throw Error(fmt::format("{}: {} has {} entries for {} tokens", file, key, got, n));
  };
  vocab.scores.assign(n, 0.0f);
  if (f.find_metadata("tokenizer.ggml.scores")) {
    const auto scores = f.get_floats("tokenizer.ggml.scores");
    sized("tokenizer.ggml.scores", scores.size());
    std::copy(scores.begin(), scores.end(), vocab.scores.begin());
  }
  vocab.types.assign(n, TokenType::Normal);
  if (f.find_metadata("tokenizer.ggml.token_type")) {
    const auto types = f.get_ints("tokenizer.ggml.token_type");
    sized("tokenizer.ggml.token_type", types.size());
    for (std::size_t id = 0; id < n; ++id) {
      if (types[id] < 1 || types[id] > 6)
        throw Error(fmt::format("{}: token {} has type {} (tokenizer.ggml.token_type: 1 to 6)",
                                file, id, types[id]));
      vocab.types[id] = static_cast<TokenType>(types[id]);
    }
  }
  for (std::size_t id = 0; id < n; ++id) {
    const TokenType t = vocab.types[id];
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) &&
        !vocab.tokens[id].empty())
      vocab.special_ids.push_back(static_cast<std::uint32_t>(id));
  }
}

// A SentencePiece vocabulary (tokenizer.ggml.model "llama"): its pieces, and where the file leaves
// them out llama.cpp's defaults (<unk> 0, <s> 1, </s> 2, BOS added, a space before the text).
BpeVocab gguf_spm_vocab(const GgufFile& f) {
  BpeVocab vocab;
  vocab.source = fmt::format("GGUF file {}", f.path().string());
  vocab.kind = data::TokenizerKind::SentencePiece;
  gguf_spm_pieces(f, vocab);
  const std::size_t n = vocab.tokens.size();
  auto id_or = [&](std::string_view key, std::uint32_t fallback) -> std::optional<std::uint32_t> {
    if (auto id = gguf_token_id(f, key)) return id;
    return fallback < n ? std::optional(fallback) : std::nullopt;
  };
  vocab.unk = id_or("tokenizer.ggml.unknown_token_id", 0);
  vocab.bos = id_or("tokenizer.ggml.bos_token_id", 1);
  vocab.eos = id_or("tokenizer.ggml.eos_token_id", 2);
  auto flag = [&](std::string_view key) { return f.find_metadata(key) ? f.get_bool(key) : true; };
  vocab.add_bos = flag("tokenizer.ggml.add_bos_token");
  vocab.space_prefix = flag("tokenizer.ggml.add_space_prefix") ? data::SpacePrefix::EveryPart
                                                               : data::SpacePrefix::None;
  return vocab;
}

// Where a SentencePiece-style tokenizer.json puts a space before the text: its normalizer
// (Prepend "▁" then Replace " " by "▁": before every part; the Replace alone: nowhere) or its
// Metaspace pre-tokenizer (prepend_scheme always, first or never; split false).
data::SpacePrefix hf_spm_prefix(const json& j, const std::string& file) {
  const json none;
  const json& norm = j.contains("normalizer") ? j["normalizer"] : none;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none;
  auto bad = [&](const std::string& what) {
    return Error(fmt::format("{}: {} is not supported with byte_fallback", file, what),
                 "tessera reads SentencePiece-style tokenizer.json files: the normalizer "
                 "Prepend(\u2581) + Replace(' ', \u2581), or a Metaspace pre-tokenizer");
  };
  auto type_of = [&](const json& x) { return json_string(x, "type", file); };
  auto replace = [&](const json& x) {
    return type_of(x) == "Replace" && x.contains("pattern") &&
           json_string(x["pattern"], "String", file) == " " &&
           json_string(x, "content", file) == "\u2581";
  };
  if (!norm.is_null()) {
    if (!pre.is_null()) throw bad("a pre_tokenizer beside the normalizer");
    const bool seq = type_of(norm) == "Sequence" && norm.contains("normalizers") &&
                     norm["normalizers"].is_array();
    const json steps = seq ? norm["normalizers"] : json::array({norm});
    if (steps.size() == 2 && type_of(steps[0]) == "Prepend" &&
        json_string(steps[0], "prepend", file) == "\u2581" && replace(steps[1]))
      return data::SpacePrefix::EveryPart;
    if (steps.size() == 1 && replace(steps[0])) return data::SpacePrefix::None;
    throw bad(fmt::format("the normalizer {}", norm.dump().substr(0, 200)));
  }
  if (type_of(pre) != "Metaspace" || json_string(pre, "replacement", file) != "\u2581" ||
      json_bool(pre, "split", true, file))
    throw bad(fmt::format("the pre_tokenizer {}", pre.dump().substr(0, 200)));
  const std::string scheme = json_string(pre, "prepend_scheme", file);
  if (scheme == "always" || (scheme.empty() && json_bool(pre, "add_prefix_space", true, file)))
    return data::SpacePrefix::EveryPart;
  if (scheme == "first") return data::SpacePrefix::Start;
  if (scheme == "never" || scheme.empty()) return data::SpacePrefix::None;
  throw bad(fmt::format("prepend_scheme '{}'", scheme));
}

// The merges of a SentencePiece-style tokenizer.json ("left right" or [left, right], spelled as
// the vocabulary spells them), and each token's score for GGUF (minus the rank of the first
// merge that makes it; 0 for the tokens no merge makes). A merge that joins a byte token is
// refused: tessera's encoder, like llama.cpp's, falls back to bytes after merging, not before.
void hf_spm_merges(const json& merges, BpeVocab& vocab, const std::string& file) {
  std::unordered_map<std::string, std::uint32_t> id_of;
  for (std::uint32_t id = 0; id < vocab.tokens.size(); ++id) id_of.emplace(vocab.tokens[id], id);
  vocab.scores.assign(vocab.tokens.size(), 0.0f);
  std::vector<char> made(vocab.tokens.size(), 0);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::optional<Sides> sides = merge_sides(m);
    if (!sides)
      throw Error(fmt::format("{}: merge {} is not \"left right\" or [left, right]", file, rank));
    Sides& lr = *sides;
    const auto l = id_of.find(lr.first), r = id_of.find(lr.second);
    const auto t = id_of.find(lr.first + lr.second);
    if (l == id_of.end() || r == id_of.end() || t == id_of.end())
      throw Error(fmt::format("{}: merge {} joins pieces that are not tokens", file, rank));
    if (vocab.types[l->second] == TokenType::Byte || vocab.types[r->second] == TokenType::Byte)
      throw Error(
          fmt::format("{}: merge {} joins a byte token, which tessera does not run", file, rank));
    if (!made[t->second]++) vocab.scores[t->second] = -static_cast<float>(rank);
    vocab.merges.push_back(std::move(lr));
  }
}

// A SentencePiece-style tokenizer.json (model BPE with byte_fallback: Llama 2, Mistral, Gemma as
// Hugging Face ships them): the tokens as spelled, byte tokens <0xXX> for every byte, the merges,
// the unknown token, the space prefix, the added tokens as special tokens.
BpeVocab hf_spm_vocab(const json& j, const std::string& file) {
  const json& model = j["model"];
  BpeVocab vocab;
  vocab.source = fmt::format("tokenizer.json {}", file);
  vocab.kind = data::TokenizerKind::SentencePiece;
  vocab.space_prefix = hf_spm_prefix(j, file);
  hf_tokens(j, vocab, file, false);
  vocab.types.assign(vocab.tokens.size(), TokenType::Normal);
  int bytes = 0;
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id)
    if (data::byte_token_value(vocab.tokens[id])) {
      vocab.types[id] = TokenType::Byte;
      ++bytes;
    }
  for (std::uint32_t id : vocab.special_ids) vocab.types[id] = TokenType::Control;
  if (bytes < 256)
    throw Error(fmt::format("{}: byte_fallback with {} of the 256 byte tokens <0xXX>", file, bytes),
                "tessera falls back to bytes only where every byte has its token");
  if (const std::string unk = json_string(model, "unk_token", file); !unk.empty()) {
    for (std::uint32_t id = 0; id < vocab.tokens.size() && !vocab.unk; ++id)
      if (vocab.tokens[id] == unk) vocab.unk = id;
    if (!vocab.unk) throw Error(fmt::format("{}: unk_token '{}' is not a token", file, unk));
    vocab.types[*vocab.unk] = TokenType::Unknown;
  }
  if (!model.contains("merges") || !model["merges"].is_array())
    throw Error(fmt::format("{}: model.merges is not a list", file));
  hf_spm_merges(model["merges"], vocab, file);
  hf_bos(j, vocab);
  return vocab;
}

}  // namespace

data::BpeVocab gguf_bpe_vocab(const GgufFile& f) {
  const std::string file = f.path().string();
  if (!f.find_metadata("tokenizer.ggml.model"))
    throw Error(fmt::format("{} carries no tokenizer (no tokenizer.ggml.model)", file),
                "pass the tokenizer with --tokenizer");
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") return gguf_spm_vocab(f);
  if (model != "gpt2")
    throw Error(fmt::format("{}: tokenizer.ggml.model '{}' is not supported", file, model),
                "tessera runs byte-level BPE ('gpt2') and SentencePiece ('llama') tokenizers, "
                "not WordPiece ('bert'), Unigram ('t5') or others");
  BpeVocab vocab;
  vocab.source = fmt::format("GGUF file {}", file);
  const std::string pre_name = f.find_metadata("tokenizer.ggml.pre")
                                   ? f.get_string("tokenizer.ggml.pre")
                                   : std::string("gpt-2");
  const auto pre = pre_from_gguf_name(pre_name);
  if (!pre)
    throw Error(
        fmt::format("{}: pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported", file, pre_name),
        fmt::format("supported: {}", k_supported_pre));
  vocab.pre = *pre;
  vocab.ignore_merges = *pre == PreTokenizer::Llama3;
  gguf_tokens(f, vocab);
  const auto merges = f.get_strings("tokenizer.ggml.merges");
  vocab.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    vocab.merges.emplace_back();
    if (!byte_level_sides(merge_text_sides(merges[i]), vocab.merges.back()))
      throw Error(
          fmt::format("{}: tokenizer.ggml.merges[{}] is not \"left right\" in the "
                      "byte-level alphabet",
                      file, i));
  }
  vocab.bos = gguf_token_id(f, "tokenizer.ggml.bos_token_id");
  vocab.eos = gguf_token_id(f, "tokenizer.ggml.eos_token_id");
  vocab.add_bos = f.find_metadata("tokenizer.ggml.add_bos_token")
                      ? f.get_bool("tokenizer.ggml.add_bos_token")
                      : *pre == PreTokenizer::Llama3;
  return vocab;
}

data::BpeVocab hf_bpe_vocab_from_text(std::string_view text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{} is not valid JSON: {}", file, library_message(e)));
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(fmt::format("{} has no tokenizer model", file));
  const json& model = j["model"];
  const json type = model.contains("type") ? model["type"] : json("BPE");
  if (type != "BPE")
    throw Error(
        fmt::format("{}: model type {} is not supported", file, type.dump()),
        "tessera runs BPE tokenizers: byte-level, or SentencePiece-style with byte_fallback");
  if (json_bool(model, "byte_fallback", false, file)) return hf_spm_vocab(j, file);
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw Error(fmt::format("{}: a normalizer is not supported", file),
                "byte-level BPE tokenizers (GPT-2, SmolLM2, Llama 3) have none");
  BpeVocab vocab;
  vocab.source = fmt::format("tokenizer.json {}", file);
  vocab.pre = hf_pre(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), file);
  vocab.ignore_merges = json_bool(model, "ignore_merges", false, file);
  hf_tokens(j, vocab, file);
  if (!model.contains("merges") || !model["merges"].is_array())
    throw Error(fmt::format("{}: model.merges is not a list", file));
  for (const json& m : model["merges"])
    vocab.merges.push_back(hf_merge(m, vocab.merges.size(), file));
  hf_bos(j, vocab);
  return vocab;
}

data::BpeVocab hf_bpe_vocab(const std::filesystem::path& path) {
  BpeVocab vocab = hf_bpe_vocab_from_text(read_file(path, "tokenizer.json"), path.string());
  hf_config(path.parent_path() / "tokenizer_config.json", vocab);
  return vocab;
}

data::Tokenizer load_tokenizer(const std::filesystem::path& given) {
  const std::filesystem::path path = find_data_path(given);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::is_regular_file(path / "tokenizer.json", ec))
      return data::Tokenizer::from_vocab(hf_bpe_vocab(path / "tokenizer.json"));
    if (std::filesystem::is_regular_file(path / "encoder.json", ec))
      return data::Tokenizer::load_gpt2(path);
    std::vector<std::filesystem::path> ggufs;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.path().extension() == ".gguf") ggufs.push_back(e.path());
    if (ggufs.size() == 1)
      return data::Tokenizer::from_vocab(gguf_bpe_vocab(GgufFile::open(ggufs[0])));
    throw Error(fmt::format("no tokenizer in {}", path.string()),
                "expected tokenizer.json, encoder.json + vocab.bpe, or one .gguf file");
  }
  const InputKind kind = input_kind(path, "tokenizer");
  if (kind == InputKind::Missing)
    throw Error(fmt::format("tokenizer not found: {}", path.string()),
                "run scripts/setup for GPT-2's (data/gpt2), or pass a .gguf file, a "
                "tokenizer.json, or a directory holding one");
  if (kind != InputKind::RegularFile)  // a FIFO or a device: nothing to read it from
    throw Error(fmt::format("tokenizer {} is not a regular file", path.string()),
                "pass a .gguf file, a tokenizer.json, or a directory holding one");
  if (path.extension() == ".gguf")
    return data::Tokenizer::from_vocab(gguf_bpe_vocab(GgufFile::open(path)));
  return data::Tokenizer::from_vocab(hf_bpe_vocab(path));
}

namespace {

// The metadata gguf_spm_vocab reads, all of it written.
void set_gguf_spm_tokenizer(GgufWriter& w, const data::BpeVocab& vocab) {
  std::vector<std::int32_t> types;
  types.reserve(vocab.types.size());
  for (TokenType t : vocab.types) types.push_back(static_cast<std::int32_t>(t));
  w.set_metadata("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set_metadata("tokenizer.ggml.tokens", GgufValue::array_string(vocab.tokens));
  w.set_metadata("tokenizer.ggml.scores", GgufValue::array_f32(vocab.scores));
  w.set_metadata("tokenizer.ggml.token_type", GgufValue::array_i32(types));
  if (vocab.unk) w.set_metadata("tokenizer.ggml.unknown_token_id", GgufValue::u32(*vocab.unk));
  if (vocab.bos) w.set_metadata("tokenizer.ggml.bos_token_id", GgufValue::u32(*vocab.bos));
  if (vocab.eos) w.set_metadata("tokenizer.ggml.eos_token_id", GgufValue::u32(*vocab.eos));
  w.set_metadata("tokenizer.ggml.add_bos_token", GgufValue::boolean(vocab.add_bos));
  // (llama.cpp's prefix is also after special tokens: a Start prefix becomes EveryPart)
  w.set_metadata("tokenizer.ggml.add_space_prefix",
                 GgufValue::boolean(vocab.space_prefix != data::SpacePrefix::None));
}

}  // namespace

void set_gguf_tokenizer(GgufWriter& w, const data::BpeVocab& vocab) {
  if (vocab.kind == data::TokenizerKind::SentencePiece) {
    set_gguf_spm_tokenizer(w, vocab);
    return;
  }
  const char* pre = vocab.pre == PreTokenizer::Digits   ? "smollm"
                    : vocab.pre == PreTokenizer::Llama3 ? "llama-bpe"
                                                        : "gpt-2";
  std::vector<bool> special(vocab.tokens.size(), false);
  for (auto id : vocab.special_ids)
    if (id < special.size()) special[id] = true;
  std::vector<std::string> tokens;
  std::vector<std::int32_t> types;
  tokens.reserve(vocab.tokens.size());
  for (std::size_t i = 0; i < vocab.tokens.size(); ++i) {
    tokens.push_back(special[i] ? vocab.tokens[i] : data::byte_level_encode(vocab.tokens[i]));
    types.push_back(special[i] ? static_cast<std::int32_t>(k_token_control) : 1);
  }
  std::vector<std::string> merges;
  merges.reserve(vocab.merges.size());
  for (const auto& [left, right] : vocab.merges)
    merges.push_back(data::byte_level_encode(left) + " " + data::byte_level_encode(right));
  w.set_metadata("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set_metadata("tokenizer.ggml.pre", GgufValue::string(pre));
  w.set_metadata("tokenizer.ggml.tokens", GgufValue::array_string(tokens));
  w.set_metadata("tokenizer.ggml.token_type", GgufValue::array_i32(types));
  w.set_metadata("tokenizer.ggml.merges", GgufValue::array_string(merges));
  if (vocab.bos) w.set_metadata("tokenizer.ggml.bos_token_id", GgufValue::u32(*vocab.bos));
  if (vocab.eos) w.set_metadata("tokenizer.ggml.eos_token_id", GgufValue::u32(*vocab.eos));
  w.set_metadata("tokenizer.ggml.add_bos_token", GgufValue::boolean(vocab.add_bos));
}

void require_tokenizer_fits(const data::Tokenizer& tok, std::int64_t model_vocab) {
  if (static_cast<std::int64_t>(tok.vocab_size()) <= model_vocab) return;
  throw Error(fmt::format("the tokenizer has {} tokens but the model only {}", tok.vocab_size(),
                          model_vocab),
              "pass the tokenizer the model was trained with (--tokenizer)");
}

namespace {

json hf_pre_json(PreTokenizer pre) {
  auto byte_level = [](bool regex) {
    return json{{"type", "ByteLevel"},
                {"add_prefix_space", false},
                {"trim_offsets", true},
                {"use_regex", regex}};
  };
  switch (pre) {
    case PreTokenizer::Gpt2:
      return byte_level(true);
    case PreTokenizer::Digits:
      return json{{"type", "Sequence"},
                  {"pretokenizers",
                   {json{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
    case PreTokenizer::Llama3:
      return json{
          {"type", "Sequence"},
          {"pretokenizers",
           {json{
                {"type", "Split"},
                {"pattern",
                 {{"Regex", std::string(data::pre_tokenizer_regexes(PreTokenizer::Llama3).at(0))}}},
                {"behavior", "Isolated"},
                {"invert", false}},
            byte_level(false)}}};
  }
  return json();
}

// Adds the BOS to every sequence (and pair) when the model wants one; else ByteLevel's offsets
// (nothing for SentencePiece).
json hf_post_processor(const data::BpeVocab& vocab) {
  if ((!vocab.add_bos || !vocab.bos) && vocab.kind == data::TokenizerKind::SentencePiece)
    return json();
  if (!vocab.add_bos || !vocab.bos)
    return json{{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", false},
                {"use_regex", true}};
  const std::string bos = vocab.tokens[*vocab.bos];
  auto special = json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  auto seq = [](const char* id, int type) {
    return json{{"Sequence", {{"id", id}, {"type_id", type}}}};
  };
  return json{{"type", "TemplateProcessing"},
              {"single", {special, seq("A", 0)}},
              {"pair", {special, seq("A", 0), special, seq("B", 1)}},
              {"special_tokens", {{bos, {{"id", bos}, {"ids", {*vocab.bos}}, {"tokens", {bos}}}}}}};
}

// Every token, special ones too, is in model.vocab: Hugging Face's tokenizers gives an added
// token that the vocabulary lacks a new id after it, whatever added_tokens says.
json hf_model_json(const data::BpeVocab& vocab) {
  json v = json::object();
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id) {
    auto spelled = data::byte_level_encode(vocab.tokens[id]);
    if (v.contains(spelled))
      throw Error(fmt::format("{}: tokens {} and {} have the same bytes, which a tokenizer.json "
                              "vocabulary cannot hold",
                              vocab.source, v[spelled].get<std::size_t>(), id),
                  "keep the tokenizer in its original file");
    v[spelled] = id;
  }
  json merges = json::array();
  for (const auto& [left, right] : vocab.merges)
    merges.push_back({data::byte_level_encode(left), data::byte_level_encode(right)});
  return json{{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", vocab.ignore_merges},
              {"vocab", std::move(v)},
              {"merges", std::move(merges)}};
}

// A SentencePiece vocabulary's space prefix as Hugging Face's converters write it: the
// normalizer Prepend + Replace (before every part) or the Replace alone, or (before the text
// only) a Metaspace pre-tokenizer with prepend_scheme "first".
json hf_spm_normalizer(data::SpacePrefix prefix) {
  const json replace{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  if (prefix == data::SpacePrefix::Start) return json();
  json steps = json::array();
  if (prefix == data::SpacePrefix::EveryPart)
    steps.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  steps.push_back(replace);
  return json{{"type", "Sequence"}, {"normalizers", std::move(steps)}};
}
json hf_spm_pre_tokenizer(data::SpacePrefix prefix) {
  if (prefix != data::SpacePrefix::Start) return json();
  return json{{"type", "Metaspace"},
              {"replacement", "\u2581"},
              {"prepend_scheme", "first"},
              {"split", false}};
}
// Byte tokens to bytes, U+2581 to spaces, the space put before the text taken off.
json hf_spm_decoder(data::SpacePrefix prefix) {
  json steps = json::array(
      {json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}},
       json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}}});
  if (prefix != data::SpacePrefix::None)
    steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return json{{"type", "Sequence"}, {"decoders", std::move(steps)}};
}

// The merges a SentencePiece vocabulary implies, as Hugging Face's converters list them: every
// split of a token (at a character) into two tokens; the tokens by descending score (ties in id
// order), a token's splits by descending scores of their left, then right part.
std::vector<std::pair<std::string, std::string>> spm_merges(const data::BpeVocab& vocab) {
  std::unordered_map<std::string, float> score_of;
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id)
    score_of.insert_or_assign(vocab.tokens[id], vocab.scores[id]);
  struct Split {
    float score, left, right;
    std::string l, r;
  };
  std::vector<Split> all;
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id) {
    const std::string& t = vocab.tokens[id];
    std::vector<Split> local;
    for (std::size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) continue;  // inside a character
      const auto l = score_of.find(t.substr(0, k)), r = score_of.find(t.substr(k));
      if (l != score_of.end() && r != score_of.end())
        local.push_back({vocab.scores[id], l->second, r->second, l->first, r->first});
    }
    std::stable_sort(local.begin(), local.end(), [](const Split& a, const Split& b) {
      return a.left != b.left ? a.left > b.left : a.right > b.right;
    });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Split& a, const Split& b) { return a.score > b.score; });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (auto& s : all) out.emplace_back(std::move(s.l), std::move(s.r));
  return out;
}

// model: BPE with byte fallback over the tokens as spelled; its merges (those read from a
// tokenizer.json, or those the scores imply).
json hf_spm_model_json(const data::BpeVocab& vocab) {
  json v = json::object();
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id) v[vocab.tokens[id]] = id;
  json merges = json::array();
  for (const auto& [l, r] : vocab.merges.empty() ? spm_merges(vocab) : vocab.merges)
    merges.push_back({l, r});
  return json{{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", vocab.unk ? json(vocab.tokens[*vocab.unk]) : json()},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", true},
              {"byte_fallback", true},
              {"ignore_merges", false},
              {"vocab", std::move(v)},
              {"merges", std::move(merges)}};
}

}  // namespace

std::string write_tokenizer_beside(const std::filesystem::path& dir, const data::BpeVocab& vocab) {
  if (vocab.kind != data::TokenizerKind::SentencePiece || !vocab.merges.empty()) {
    write_hf_tokenizer(dir, vocab);
    return "tokenizer.json";
  }
  GgufWriter w;
  w.set_metadata("general.architecture", GgufValue::string("llama"));
  set_gguf_tokenizer(w, vocab);
  w.write(dir / "tokenizer.gguf");
  return "tokenizer.gguf";
}

void write_hf_tokenizer(const std::filesystem::path& dir, const data::BpeVocab& vocab) {
  const bool spm = vocab.kind == data::TokenizerKind::SentencePiece;
  json added = json::array();
  for (auto id : vocab.special_ids)
    added.push_back({{"id", id},
                     {"content", vocab.tokens[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  json tok{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added)},
      {"normalizer", spm ? hf_spm_normalizer(vocab.space_prefix) : json()},
      {"pre_tokenizer", spm ? hf_spm_pre_tokenizer(vocab.space_prefix) : hf_pre_json(vocab.pre)},
      {"post_processor", hf_post_processor(vocab)},
      {"decoder", spm ? hf_spm_decoder(vocab.space_prefix)
                      : json{{"type", "ByteLevel"},
                             {"add_prefix_space", true},
                             {"trim_offsets", true},
                             {"use_regex", true}}},
      {"model", spm ? hf_spm_model_json(vocab) : hf_model_json(vocab)}};
  json cfg{{"tokenizer_class", "PreTrainedTokenizerFast"},
           {"add_bos_token", vocab.add_bos},
           {"clean_up_tokenization_spaces", false}};
  if (vocab.bos) cfg["bos_token"] = vocab.tokens[*vocab.bos];
  if (vocab.eos) cfg["eos_token"] = vocab.tokens[*vocab.eos];
  write_file_atomic(dir / "tokenizer.json", tok.dump(2) + "\n");
  write_file_atomic(dir / "tokenizer_config.json", cfg.dump(2) + "\n");
}

}  // namespace tessera::io
