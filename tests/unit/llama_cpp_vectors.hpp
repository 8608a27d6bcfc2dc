// llama.cpp's tokenizer test vectors, which ship next to its vocabulary files: NAME.gguf.inp
// holds texts separated by "\n__ggml_vocab_test__\n", NAME.gguf.out the ids llama.cpp gives each
// (a line of ids per text; encoded without special tokens, as llama.cpp's test does).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tessera/core/file.hpp"
#include "tessera/data/bpe.hpp"

namespace tessera::test {

inline void expect_matches_llama_cpp(const data::Tokenizer& tok,
                                     const std::filesystem::path& gguf) {
  const std::string inp = read_file(gguf.string() + ".inp", "llama.cpp test texts");
  const std::string out = read_file(gguf.string() + ".out", "llama.cpp test ids");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (std::size_t pos = 0; pos < inp.size();) {
    const std::size_t end = std::min(inp.find(sep, pos), inp.size());
    texts.push_back(inp.substr(pos, end - pos));
    pos = end + sep.size();
  }
  std::vector<std::vector<std::uint32_t>> want;
  for (std::size_t pos = 0; pos < out.size();) {
    const std::size_t end = std::min(out.find('\n', pos), out.size());
    want.push_back(data::parse_token_ids(out.substr(pos, end - pos)));
    pos = end + 1;
  }
  ASSERT_EQ(texts.size(), want.size());
  ASSERT_GT(texts.size(), 40u);
  for (std::size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tok.encode(texts[i], false), want[i]) << "text " << i << ": " << texts[i];
}

}  // namespace tessera::test
