// SentencePiece tokenizers as GGUF files carry them (tokenizer.ggml.model "llama": Llama 2,
// Mistral, Gemma), encoded as llama.cpp encodes them.
//
// A small vocabulary built here pins each rule (the merge order by score, the leftmost of equal
// scores, the space before the text and after special tokens, byte tokens and the unknown token
// for what no token spells, the defaults of a file that leaves keys out, the round trip through
// GGUF); llama.cpp's own test strings and ids for Llama 2's vocabulary check the whole
// (skipped, saying so, without scripts/setup --with-models).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../scratch_dir.hpp"
#include "expect_error.hpp"
#include "llama_cpp_vectors.hpp"
#include "tessera/core/file.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/tokenizer_files.hpp"

using tessera::data::Tokenizer;
using tessera::data::TokenizerKind;
using tessera::io::GgufFile;
using tessera::io::GgufValue;
using tessera::io::GgufWriter;
using tessera::test::expect_error;
using Ids = std::vector<std::uint32_t>;
namespace fs = std::filesystem;

namespace {

const fs::path k_data = TESSERA_DATA;
const fs::path k_fixtures = fs::path(TESSERA_FIXTURES) / "tokenizers";

// <unk>, <s>, </s>, the 256 byte tokens, then a few pieces (U+2581 is SentencePiece's space).
constexpr std::uint32_t k_unk = 0, k_bos = 1, k_eos = 2;
constexpr std::uint32_t byte_token(unsigned char b) {
  return 3 + b;
}
constexpr std::uint32_t k_space = 259, k_a = 260, k_b = 261, k_c = 262, k_ab = 263, k_bc = 264,
                        k_space_a = 265, k_sep = 266, k_aa = 267;

struct Piece {
  std::string text;
  float score;
  std::int32_t type;  // GGUF's: 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte
};

std::vector<Piece> small_pieces() {
  std::vector<Piece> p = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}};
  for (int b = 0; b < 256; ++b) p.push_back({fmt::format("<0x{:02X}>", b), 0, 6});
  // "bc" outscores "ab", "\u2581a" outscores both; "aa" for the ties.
  p.insert(p.end(), {{"\u2581", -1, 1},
                     {"a", -2, 1},
                     {"b", -3, 1},
                     {"c", -4, 1},
                     {"ab", -5, 1},
                     {"bc", -1.5f, 1},
                     {"\u2581a", -0.5f, 1},
                     {"<sep>", 0, 4},
                     {"aa", -2.5f, 1}});
  return p;
}

// The GGUF file of `pieces`; `edit` changes or adds metadata after the defaults are set.
std::string spm_gguf(const std::vector<Piece>& pieces,
                     const std::function<void(GgufWriter&)>& edit = {}) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  for (const Piece& p : pieces) {
    tokens.push_back(p.text);
    scores.push_back(p.score);
    types.push_back(p.type);
  }
  GgufWriter w;
  w.set_metadata("general.architecture", GgufValue::string("llama"));
  w.set_metadata("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set_metadata("tokenizer.ggml.tokens", GgufValue::array_string(tokens));
  w.set_metadata("tokenizer.ggml.scores", GgufValue::array_f32(scores));
  w.set_metadata("tokenizer.ggml.token_type", GgufValue::array_i32(types));
  if (edit) edit(w);
  return w.to_bytes();
}

Tokenizer spm_tokenizer(const std::string& bytes) {
  return Tokenizer::from_vocab(
      tessera::io::gguf_bpe_vocab(GgufFile::from_bytes(bytes, "spm.gguf")));
}

std::string read(const fs::path& p) {
  return tessera::read_file(p, "test file");
}

}  // namespace

TEST(SentencePiece, MergesByScoreLeftmostFirst) {
  const Tokenizer tok = spm_tokenizer(spm_gguf(small_pieces()));
  EXPECT_EQ(tok.kind(), TokenizerKind::SentencePiece);
  EXPECT_EQ(tok.merges_count(), 0u);
  EXPECT_EQ(tok.bytes_without_token(), 0u);
  // "\u2581abc": "\u2581a" (-0.5) first, then "bc" (-1.5); "ab" (-5) never gets its turn.
  EXPECT_EQ(tok.encode("abc"), (Ids{k_space_a, k_bc}));
  // "aaa" without the space: the two "aa" pairs score alike, and the left one merges.
  const Tokenizer bare = spm_tokenizer(spm_gguf(small_pieces(), [](GgufWriter& w) {
    w.set_metadata("tokenizer.ggml.add_space_prefix", GgufValue::boolean(false));
  }));
  EXPECT_EQ(bare.encode("aaa"), (Ids{k_aa, k_a}));
  EXPECT_EQ(bare.encode("ab"), (Ids{k_ab}));
  EXPECT_EQ(bare.encode("a b"), (Ids{k_a, k_space, k_b}));  // "\u2581b" is no token
  EXPECT_TRUE(bare.encode("").empty());
}

TEST(SentencePiece, BytesSpecialTokensAndDecoding) {
  const Tokenizer tok = spm_tokenizer(spm_gguf(small_pieces()));
  // A character no token spells is its bytes' tokens.
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{k_space, byte_token(0xC3), byte_token(0xA9)}));
  // Special tokens are split out; the space goes before the text after each of them too.
  EXPECT_EQ(tok.encode("a</s>b<sep>"), (Ids{k_space_a, k_eos, k_space, k_b, k_sep}));
  // Without special tokens the text is one piece: "<", "/", ... as bytes.
  EXPECT_EQ(tok.encode("a</s>b", false), (Ids{k_space_a, byte_token('<'), byte_token('/'),
                                              byte_token('s'), byte_token('>'), k_b}));
  // Decoding: U+2581 as a space, byte tokens as their byte, special tokens as their text; the
  // space put before the text comes back with it.
  EXPECT_EQ(tok.decode(Ids{k_space_a, k_bc, byte_token(0x0A), k_eos}), " abc\n</s>");
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(tok.decode(tok.encode(stress, false)), " " + stress);
  EXPECT_EQ(tok.bos_id(), k_bos);  // llama.cpp's defaults where the file names none
  EXPECT_EQ(tok.eot_id(), k_eos);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.prompt("c"), (std::vector<std::int32_t>{k_bos, k_space, k_c}));
}

TEST(SentencePiece, UnknownTokenWhereAByteHasNone) {
  const Tokenizer tok = spm_tokenizer(spm_gguf({{"<unk>", 0, 2}, {"\u2581", -1, 1}, {"a", -2, 1}}));
  EXPECT_EQ(tok.bytes_without_token(), 255u);  // only "a" (0x61) is a byte's token
  EXPECT_EQ(tok.encode("a\xC3\xA9"), (Ids{1, 2, k_unk, k_unk}));
  EXPECT_EQ(tok.bos_id(), 1u);  // llama.cpp's default ids where the file names none
}

TEST(SentencePiece, RoundTripsThroughGgufAndBesideAModel) {
  const Tokenizer tok = spm_tokenizer(spm_gguf(small_pieces(), [](GgufWriter& w) {
    w.set_metadata("tokenizer.ggml.add_bos_token", GgufValue::boolean(false));
    w.set_metadata("tokenizer.ggml.eos_token_id", GgufValue::u32(k_sep));
  }));
  const std::string text = "abc aaa<sep>\xC3\xA9</s> b";
  GgufWriter w;
  w.set_metadata("general.architecture", GgufValue::string("llama"));
  tessera::io::set_gguf_tokenizer(w, tok.vocab());
  const Tokenizer back = spm_tokenizer(w.to_bytes());
  EXPECT_EQ(back.encode(text), tok.encode(text));
  EXPECT_EQ(back.vocab().tokens, tok.vocab().tokens);
  EXPECT_EQ(back.vocab().scores, tok.vocab().scores);
  EXPECT_EQ(back.vocab().types, tok.vocab().types);
  EXPECT_EQ(back.eos_id(), k_sep);
  EXPECT_FALSE(back.add_bos());
  // Beside a model: tokenizer.gguf, which load_tokenizer finds in the folder.
  tessera::test::ScratchDir scratch("spm_");
  EXPECT_EQ(tessera::io::write_tokenizer_beside(scratch.path(), tok.vocab()), "tokenizer.gguf");
  EXPECT_EQ(tessera::io::load_tokenizer(scratch.path()).encode(text), tok.encode(text));
  // As a Hugging Face tokenizer.json: the merges its scores imply, merged by rank when read back.
  const fs::path hf = scratch.path() / "hf";
  fs::create_directories(hf);
  tessera::io::write_hf_tokenizer(hf, tok.vocab());
  const Tokenizer from_json = tessera::io::load_tokenizer(hf);
  EXPECT_EQ(from_json.kind(), TokenizerKind::SentencePiece);
  EXPECT_EQ(from_json.vocab().merges.size(), 4u);  // "\u2581a", "bc", "aa", "ab": by score
  EXPECT_EQ(from_json.vocab().merges.front().first, "\u2581");
  EXPECT_EQ(from_json.encode(text), tok.encode(text));
  EXPECT_EQ(from_json.eos_id(), k_sep);
  // and, with them, beside a model as a tokenizer.json (which holds its merges exactly)
  EXPECT_EQ(tessera::io::write_tokenizer_beside(hf, from_json.vocab()), "tokenizer.json");
}

namespace {

// The small vocabulary's tokenizer.json as tessera writes it, edited by `edit`, read back.
Tokenizer small_json(const std::function<void(nlohmann::json&)>& edit) {
  tessera::test::ScratchDir scratch("spm_json_");
  tessera::io::write_hf_tokenizer(scratch.path(), spm_tokenizer(spm_gguf(small_pieces())).vocab());
  auto j = nlohmann::json::parse(read(scratch.path() / "tokenizer.json"));
  edit(j);
  return Tokenizer::from_vocab(tessera::io::hf_bpe_vocab_from_text(j.dump(), "small.json"));
}

}  // namespace

// The forms Hugging Face's converters write a SentencePiece vocabulary's space prefix in, and
// what tessera refuses of the rest.
TEST(SentencePiece, TokenizerJsonForms) {
  using nlohmann::json;
  const Ids every{k_space_a, k_eos, k_space, k_b};  // a space after the special token too
  EXPECT_EQ(small_json([](json&) {}).encode("a</s>b"), every);
  const json metaspace{{"type", "Metaspace"}, {"replacement", "\u2581"}, {"split", false}};
  auto with_metaspace = [&](const char* scheme) {
    return small_json([&](json& j) {
      j["normalizer"] = nullptr;
      j["pre_tokenizer"] = metaspace;
      j["pre_tokenizer"]["prepend_scheme"] = scheme;
    });
  };
  EXPECT_EQ(with_metaspace("always").encode("a</s>b"), every);
  EXPECT_EQ(with_metaspace("first").encode("a</s>b"), (Ids{k_space_a, k_eos, k_b}));
  EXPECT_EQ(with_metaspace("first").encode("</s>b"), (Ids{k_eos, k_b}));
  EXPECT_EQ(with_metaspace("never").encode("ab"), (Ids{k_ab}));
  const Tokenizer replace_only = small_json([](json& j) {
    j["normalizer"]["normalizers"].erase(0);  // Prepend
  });
  EXPECT_EQ(replace_only.encode("ab a"), (Ids{k_ab, k_space_a}));
  auto refused = [](const std::function<void(json&)>& edit, const std::string& needle) {
    expect_error([&] { (void)small_json(edit); }, needle);
  };
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "ByteLevel"}};
      },
      "a pre_tokenizer beside the normalizer is not supported with byte_fallback");
  refused(
      [&](json& j) {
        j["normalizer"] = nullptr;
        j["pre_tokenizer"] = metaspace;
        j["pre_tokenizer"]["split"] = true;
      },
      "the pre_tokenizer");
  refused([](json& j) { j["model"]["vocab"].erase("<0x41>"); }, "no token has id");
  refused(
      [](json& j) {
        j["model"]["merges"].push_back({"a", "zz"});
      },
      "merge 4 joins pieces that are not tokens");
  refused([](json& j) { j["model"]["unk_token"] = "<nope>"; }, "unk_token '<nope>' is not a token");
}

TEST(SentencePiece, BadVocabulariesAreRefused) {
  auto refused = [](const std::function<void(GgufWriter&)>& edit, const std::string& needle) {
    expect_error([&] { (void)spm_tokenizer(spm_gguf(small_pieces(), edit)); }, needle);
  };
  refused([](GgufWriter& w) { w.set_metadata("tokenizer.ggml.scores", GgufValue::array_f32({})); },
          "tokenizer.ggml.scores has 0 entries");
  auto with_piece = [](std::size_t id, Piece piece) {
    auto pieces = small_pieces();
    pieces[id] = std::move(piece);
    return pieces;
  };
  expect_error(
      [&] {
        (void)spm_tokenizer(spm_gguf(with_piece(k_a, {"a", -2, 9})));
      },
      "token 260 has type 9");
  expect_error(
      [&] {
        (void)spm_tokenizer(spm_gguf(with_piece(byte_token(1), {"<0xZZ>", 0, 6})));
      },
      "byte token 4 is not spelled <0xXX>");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_error(
      [&] {
        (void)spm_tokenizer(spm_gguf(with_piece(k_b, {"b", nan, 1})));
      },
      "token 261 has the score nan");
  refused([](GgufWriter& w) { w.set_metadata("tokenizer.ggml.bos_token_id", GgufValue::u32(999)); },
          "token id 999 is past the 268 tokens");
  tessera::data::BpeVocab bytes_lost;  // (a GGUF file always has one: <unk> is 0 by default)
  bytes_lost.kind = TokenizerKind::SentencePiece;
  bytes_lost.tokens = {"ab", "cd"};
  bytes_lost.scores = {0, 0};
  bytes_lost.types.assign(2, tessera::data::TokenType::Normal);
  expect_error([&] { (void)Tokenizer::from_vocab(bytes_lost); },
               "no byte has a token and none is unknown");
}

TEST(SentencePiece, Llama2MatchesLlamaCpp) {
  const fs::path gguf = k_data / "models/vocab/ggml-vocab-llama-spm.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " missing (scripts/setup --with-models)";
  const Tokenizer tok = tessera::io::load_tokenizer(gguf);
  EXPECT_EQ(tok.kind(), TokenizerKind::SentencePiece);
  EXPECT_EQ(tok.vocab_size(), 32000u);
  EXPECT_EQ(tok.bos_id(), 1u);  // <s>
  EXPECT_EQ(tok.eot_id(), 2u);  // </s>
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.bytes_without_token(), 0u);
  const std::string stress = read(k_fixtures / "stress.txt");
  EXPECT_EQ(tok.decode(tok.encode(stress, false)), " " + stress);
  tessera::test::expect_matches_llama_cpp(tok, gguf);
  // Written as a tokenizer.json (61,249 merges, those Hugging Face's converter lists) and read
  // back, merged by rank: the same ids.
  tessera::test::ScratchDir scratch("spm_llama2_");
  tessera::io::write_hf_tokenizer(scratch.path(), tok.vocab());
  const Tokenizer back = tessera::io::load_tokenizer(scratch.path());
  EXPECT_EQ(back.vocab().merges.size(), 61249u);
  tessera::test::expect_matches_llama_cpp(back, gguf);
  EXPECT_EQ(back.encode(stress), tok.encode(stress));
}
