// Fuzz target: the original GPT-2 tokenizer files (a --tokenizer directory holding encoder.json
// and vocab.bpe). The input is encoder.json, a NUL byte, then vocab.bpe; both are validated, and
// a tokenizer that is built passes check_built_tokenizer.
#include "fuzz_util.hpp"
#include "tessera/data/bpe.hpp"
#include "tokenizer_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const std::size_t nul = text.find('\0');
    const std::string_view encoder = text.substr(0, nul);
    const std::string_view merges = nul == std::string_view::npos ? "" : text.substr(nul + 1);
    tessera::fuzz::check_built_tokenizer(
        tessera::data::Tokenizer::from_vocab(tessera::data::gpt2_vocab_from_text(
            encoder, merges, "fuzz/encoder.json", "fuzz/vocab.bpe")));
  });
}
