// Fuzz target: the GPT-2 tokenizer's two inputs. The first byte picks the mode: even, the rest
// is text to encode (any bytes; decoding the ids must give the bytes back); odd, the rest is what
// `tessera tokenize --decode` reads (ids separated by spaces, commas, brackets).
#include "fuzz_util.hpp"
#include "tessera/data/bpe.hpp"

#ifndef TESSERA_DATA
#error "TESSERA_DATA (the data directory with gpt2/) must be defined"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using tessera::data::Tokenizer;
  static const Tokenizer tok = Tokenizer::load_gpt2(TESSERA_DATA "/gpt2");
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  return tessera::fuzz::judge([&] {
    if (data[0] % 2 == 0) {
      const auto ids = tok.encode(rest);
      tessera::fuzz::require(tok.decode(ids) == rest, "decode(encode(text)) == text");
    } else {
      const auto ids = tessera::data::parse_token_ids(rest);
      (void)tok.decode(ids);
    }
  });
}
