// Fuzz target: a Hugging Face tokenizer.json (the tokenizer of a model given as a directory).
// Any bytes: the JSON, the BPE model, the pre-tokenizer and the added tokens are validated; a
// tokenizer that is built passes check_built_tokenizer.
#include "fuzz_util.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tokenizer_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tessera::fuzz::judge([&] {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    tessera::fuzz::check_built_tokenizer(tessera::data::Tokenizer::from_vocab(
        tessera::io::hf_bpe_vocab_from_text(text, "fuzz/tokenizer.json")));
  });
}
