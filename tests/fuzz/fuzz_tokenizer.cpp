// Fuzz target: the tokenizers' inputs. The first byte picks the mode (its value mod 4): 0, the
// rest is text for GPT-2's byte-level BPE (any bytes; decoding the ids must give the bytes back);
// 2, the same text for a small SentencePiece vocabulary (every byte has a token, so decoding gives
// the text back with a space before it, up to U+2581 and spaces); 1 and 3, the rest is what
// `tessera tokenize --decode` reads (ids separated by spaces, commas, brackets), decoded by the
// one or the other.
#include <string>

#include "fuzz_util.hpp"
#include "tessera/data/bpe.hpp"

#ifndef TESSERA_DATA
#error "TESSERA_DATA (the data directory with gpt2/) must be defined"
#endif

namespace {

// <unk>, <s>, </s>, the 256 byte tokens, then pieces that merge in a few orders.
tessera::data::Tokenizer small_sentencepiece() {
  using tessera::data::TokenType;
  tessera::data::BpeVocab v;
  v.source = "fuzz SentencePiece vocabulary";
  v.kind = tessera::data::TokenizerKind::SentencePiece;
  auto add = [&v](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::Unknown);
  add("<s>", 0, TokenType::Control);
  add("</s>", 0, TokenType::Control);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, TokenType::Byte);
  const char* pieces[] = {"\u2581",       "a",     "b", "ab", "ba", "\u2581a", "aa",
                          "\u2581\u2581", "\u00e9"};
  float score = -1;
  for (const char* p : pieces) add(p, score -= 0.5f, TokenType::Normal);
  v.special_ids = {0, 1, 2};
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  v.space_prefix = tessera::data::SpacePrefix::EveryPart;
  return tessera::data::Tokenizer::from_vocab(std::move(v));
}

// `text` with U+2581 written as a space. Decoding a SentencePiece encoding gives back the text
// it saw (a space first, spaces as U+2581) with the U+2581 of its tokens written as spaces and the
// rest as bytes (invalid UTF-8 can cut a U+2581 into byte tokens), so this of the two is equal.
std::string spaces(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    if (text.substr(i).starts_with("\u2581")) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using tessera::data::Tokenizer;
  static const Tokenizer gpt2 = Tokenizer::load_gpt2(TESSERA_DATA "/gpt2");
  static const Tokenizer spm = small_sentencepiece();
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Tokenizer& tok = data[0] % 4 < 2 ? gpt2 : spm;
  return tessera::fuzz::judge([&] {
    if (data[0] % 2 == 1) {
      (void)tok.decode(tessera::data::parse_token_ids(rest));
    } else if (&tok == &gpt2) {
      const auto ids = tok.encode(rest);
      tessera::fuzz::require(tok.decode(ids) == rest, "decode(encode(text)) == text");
    } else {
      const auto ids = tok.encode(rest, false);
      std::string seen(rest.empty() ? 0 : 1, ' ');  // the space put before a text
      seen.append(rest);
      tessera::fuzz::require(spaces(tok.decode(ids)) == spaces(seen),
                             "decode(encode(text)) == the text SentencePiece sees");
    }
  });
}
