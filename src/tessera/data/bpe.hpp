// GPT-2 byte-level BPE, id-for-id compatible with OpenAI's encoder.
//
// Encoding follows the reference: text -> pre-tokenizer regex (PCRE2, UTF + UCP, JIT) -> each piece
// as bytes -> BPE merges by rank -> ids. `<|endoftext|>` is a special token: with allow_special the
// text is first split on it and every occurrence becomes eot_id(); without, it is encoded as plain
// text (several ordinary tokens), exactly like the reference encoders.
//
// Invalid UTF-8 never fails: the regex is compiled with PCRE2_MATCH_INVALID_UTF, and bytes that no
// match covers (the invalid sequences) are encoded as their own pieces through the same byte-level
// BPE, so decode(encode(x)) == x holds for any bytes x.
//
// Thread safety: a Tokenizer is immutable after load_gpt2 except for its piece -> ids cache, which
// is sharded and guarded by mutexes; encode, decode and every other const member may be called
// from many threads at once on the same object. The cache belongs to the object (no global state)
// and is bounded: a shard that grows past its limit is cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class Tokenizer {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe (the original GPT-2 files). Throws tessera::Error
  // naming the file when one is missing or corrupt.
  static Tokenizer load_gpt2(const std::filesystem::path& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // text (any bytes) -> ids (n_tokens,)
  std::vector<std::uint32_t> encode(std::string_view text, bool allow_special = true) const;
  // Same, appending to `out` (n_tokens,) instead of returning a new vector.
  void encode_append(std::string_view text, std::vector<std::uint32_t>& out,
                     bool allow_special = true) const;
  // ids (n_tokens,) -> bytes. An id >= vocab_size() throws tessera::Error.
  std::string decode(std::span<const std::uint32_t> ids) const;
  // The raw bytes of one token (id < vocab_size(), else tessera::Error).
  std::string token_bytes(std::uint32_t id) const;
  std::uint32_t eot_id() const;      // 50256 for GPT-2
  std::size_t vocab_size() const;    // 50257 for GPT-2
  std::size_t merges_count() const;  // 50000 for GPT-2

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Token ids written as text (what `tessera tokenize --decode` reads): decimal ids separated by
// spaces, tabs, newlines, commas or brackets ("[464, 3290]" or "464 3290"). Throws
// tessera::Error naming the first word that is not an id (or is past 2^32 - 1).
std::vector<std::uint32_t> parse_token_ids(std::string_view text);

}  // namespace tessera::data
