// What every tokenizer a fuzz target manages to build must satisfy: ids inside its vocabulary,
// and for byte-level BPE decode(encode(text)) == text where its vocabulary has every byte and no
// special token matched (special tokens decode to their text too, but a lookalike may be split
// differently). A SentencePiece vocabulary gives the text back only up to its spaces and U+2581,
// and only when its pieces are sane (a fuzzed one may spell "<0x41>" as a piece that merges):
// the fuzz_tokenizer target checks that property on a vocabulary of its own.
#pragma once

#include <string>

#include "fuzz_util.hpp"
#include "tessera/data/bpe.hpp"

namespace tessera::fuzz {

inline void check_built_tokenizer(const data::Tokenizer& tok) {
  const std::string text = "Hello, world! 123 <|end|> \xff\xfe caf\xc3\xa9";
  const auto ids = tok.encode(text);
  for (auto id : ids) require(id < tok.vocab_size(), "ids inside the vocabulary");
  const std::string back = tok.decode(ids);
  if (tok.kind() == data::TokenizerKind::ByteLevelBpe && tok.bytes_without_token() == 0 &&
      tok.encode(text, false) == ids)
    require(back == text, "decode(encode(text)) == text");
}

}  // namespace tessera::fuzz
