// Byte-level BPE: GPT-2's (id-for-id compatible with OpenAI's encoder) and the other byte-level
// BPE vocabularies models ship with (SmolLM2, Llama 3; read from GGUF or tokenizer.json files by
// io/tokenizer_files.hpp); and SentencePiece vocabularies as GGUF files carry them (Llama 2,
// Gemma: tokenizer.ggml.model "llama"), encoded as llama.cpp encodes them (see below).
//
// Encoding follows the reference encoders: text -> special tokens split out -> pre-tokenizer
// (one or more regex splits, PCRE2 with UTF + UCP, JIT) -> each piece as bytes -> BPE merges by
// rank -> ids. Special tokens (GPT-2's `<|endoftext|>`, a model's control tokens): with
// allow_special the text is first split on them (leftmost, then longest) and every occurrence
// becomes its id; without, they are encoded as plain text (several ordinary tokens), exactly like
// the reference encoders.
//
// SentencePiece: the text (special tokens split out as above) has a space put before it where the
// vocabulary says so (SpacePrefix: at its start, and after each special token too), every space
// written as U+2581, and is cut into UTF-8 characters; then, as long as two neighbours together
// spell a token, the pair whose token scores highest (the leftmost of equal scores) becomes one.
// What is left and is not a token is written as its bytes' tokens (<0x41>), or the unknown token
// where a byte has none. Decoding writes U+2581 back as a space and byte tokens as their byte.
//
// Invalid UTF-8 never fails: the regex is compiled with PCRE2_MATCH_INVALID_UTF, and bytes that no
// match covers (the invalid sequences) are encoded as their own pieces through the same byte-level
// BPE, so decode(encode(x)) == x holds for any bytes x when every byte has a token (GPT-2,
// Llama 3; see bytes_without_token).
//
// Thread safety: a Tokenizer is immutable after it is built except for its piece -> ids cache,
// which is sharded and guarded by mutexes; encode, decode and every other const member may be
// called from many threads at once on the same object. The cache belongs to the object (no global
// state) and is bounded: a shard that grows past its limit is cleared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::data {

// How text is cut into pieces before the merges.
enum class PreTokenizer {
  Gpt2,    // GPT-2's regex (also SmolLM2's, after Digits)
  Digits,  // every digit (\p{N}) its own piece, then GPT-2's regex: SmolLM2 ("smollm")
  Llama3,  // Llama 3's regex: case-insensitive contractions, numbers in runs of up to 3 digits
};
// "gpt2", "smollm", "llama-bpe": the names GGUF's tokenizer.ggml.pre uses.
std::string_view pre_tokenizer_name(PreTokenizer pre);
// The regexes that cut text, applied in order, each to the pieces of the one before (PCRE2
// syntax, which is also Hugging Face's for these).
std::vector<std::string_view> pre_tokenizer_regexes(PreTokenizer pre);

// How ordinary text becomes tokens (GGUF's tokenizer.ggml.model).
enum class TokenizerKind {
  ByteLevelBpe,   // "gpt2": GPT-2, SmolLM2, Llama 3
  SentencePiece,  // "llama": Llama 2, Mistral, Gemma
};

// GGUF's token types (tokenizer.ggml.token_type), which SentencePiece vocabularies keep.
enum class TokenType : std::int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,  // spelled <0xXX>: the byte XX
};

// Where a SentencePiece vocabulary puts a space before the text.
enum class SpacePrefix {
  None,
  Start,      // before the text only (Hugging Face's Metaspace, prepend_scheme "first")
  EveryPart,  // before the text and after each special token (llama.cpp's add_space_prefix,
              // Hugging Face's Prepend normalizer)
};

// Everything a tokenizer is made of, as the file formats hold it.
struct BpeVocab {
  std::string source;  // for messages: "GGUF file m.gguf", "tokenizer.json x"
  TokenizerKind kind = TokenizerKind::ByteLevelBpe;
  // id -> raw bytes (vocab,); SentencePiece: the token as the file spells it (U+2581 for a
  // space, <0x0A> for a byte token)
  std::vector<std::string> tokens;
  // in rank order: raw bytes; SentencePiece: spelled, only from a tokenizer.json (whose pairs
  // then merge by rank, not by score)
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::uint32_t> special_ids;  // matched whole in the text (control tokens)
  // SentencePiece only: each token's score (the higher merges first) and type, (vocab,) each;
  // the token for a byte or piece that has none; a space before the text.
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::optional<std::uint32_t> unk;
  SpacePrefix space_prefix = SpacePrefix::None;
  PreTokenizer pre = PreTokenizer::Gpt2;
  bool ignore_merges = false;        // a piece that is itself a token is that token (Llama 3)
  std::optional<std::uint32_t> bos;  // beginning of sequence
  std::optional<std::uint32_t> eos;  // end of sequence
  bool add_bos = false;              // the model expects bos before every sequence
};

// The original GPT-2 files' vocabulary from their texts (encoder.json: token -> id; vocab.bpe:
// the merges), each named in messages by its path. Throws tessera::Error naming the file that is
// corrupt.
BpeVocab gpt2_vocab_from_text(std::string_view encoder_json, std::string_view merges,
                              const std::filesystem::path& encoder_path,
                              const std::filesystem::path& merges_path);

class Tokenizer {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe (the original GPT-2 files). Throws tessera::Error
  // naming the file when one is missing or corrupt.
  static Tokenizer load_gpt2(const std::filesystem::path& dir);
  // Builds a tokenizer from its parts. Throws tessera::Error naming vocab.source when they do not
  // make one: no tokens for bytes at all, a merge whose parts or result are not tokens, an id out
  // of range, scores or types not one per token. Byte-level tokens with the same bytes: the
  // first (lowest id) is the one encoding produces; SentencePiece's, the last (as llama.cpp).
  static Tokenizer from_vocab(BpeVocab vocab);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // What the tokenizer was built from (to write it into a model file).
  const BpeVocab& vocab() const;

  // text (any bytes) -> ids (n_tokens,)
  std::vector<std::uint32_t> encode(std::string_view text, bool allow_special = true) const;
  // Same, appending to `out` (n_tokens,) instead of returning a new vector.
  void encode_append(std::string_view text, std::vector<std::uint32_t>& out,
                     bool allow_special = true) const;
  // ids (n_tokens,) -> bytes. An id >= vocab_size() throws tessera::Error. (A SentencePiece
  // vocabulary that puts a space before the text gets it back: decode(encode(x)) == " " + x.)
  std::string decode(std::span<const std::uint32_t> ids) const;
  // The raw bytes of one token (id < vocab_size(), else tessera::Error).
  std::string token_bytes(std::uint32_t id) const;
  // The token that separates documents: `<|endoftext|>` when the vocabulary has it (50256 for
  // GPT-2, 0 for SmolLM2), else the end-of-sequence token (Llama 3's `<|end_of_text|>`).
  // Throws tessera::Error if there is neither.
  std::uint32_t eot_id() const;
  std::optional<std::uint32_t> bos_id() const;  // beginning of sequence, if the model has one
  std::optional<std::uint32_t> eos_id() const;  // end of sequence, if the model has one
  bool add_bos() const;  // true: a sequence the model reads starts with bos_id()
  // The tokens a model generates after, from a prompt: bos_id() first where add_bos(), then the
  // text's tokens; with neither, an end of text (eot_id()), after which a new document starts.
  std::vector<std::int32_t> prompt(std::string_view text) const;
  PreTokenizer pre_tokenizer() const;  // byte-level BPE only
  TokenizerKind kind() const;
  std::size_t vocab_size() const;    // 50257 for GPT-2
  std::size_t merges_count() const;  // 50000 for GPT-2; 0 for SentencePiece
  // How many of the 256 bytes have no token (0 for GPT-2 and Llama 3; 21 for SmolLM2, whose
  // vocabulary lacks bytes such as 0x04 and 0xF5..0xFF). Encoding leaves such bytes out, as
  // Hugging Face's tokenizers and llama.cpp do, so decode(encode(x)) == x holds for every x only
  // when this is 0, and otherwise for every x without them (all valid UTF-8 without those
  // control characters).
  std::size_t bytes_without_token() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Byte-level BPE's alphabet, as vocabulary files (encoder.json, tokenizer.json, GGUF) spell
// tokens: each byte as one printable code point (GPT-2's bytes_to_unicode: printable latin-1
// bytes as themselves, the other 68 as U+0100..U+0143; a space is 'Ġ').
// The bytes a spelled token stands for; nullopt if it is empty or holds another code point.
std::optional<std::string> byte_level_decode(std::string_view spelled);
// The spelling of raw bytes (UTF-8 of the stand-ins).
std::string byte_level_encode(std::string_view bytes);

// A SentencePiece byte token's byte: "<0x41>" -> 0x41 (two hex digits, either case); nullopt for
// any other spelling.
std::optional<unsigned char> byte_token_value(std::string_view spelled);

// Token ids written as text (what `tessera tokenize --decode` reads): decimal ids separated by
// spaces, tabs, newlines, commas or brackets ("[464, 3290]" or "464 3290"). Throws
// tessera::Error naming the first word that is not an id (or is past 2^32 - 1).
std::vector<std::uint32_t> parse_token_ids(std::string_view text);

}  // namespace tessera::data
