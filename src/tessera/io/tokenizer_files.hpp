// Tokenizers as models ship them: the GGUF file's tokenizer.ggml.* metadata, Hugging Face's
// tokenizer.json, or GPT-2's encoder.json + vocab.bpe. docs/models.md lists what is supported.
//
// What each format says, and how it is read (data::Tokenizer):
//   GGUF         tokenizer.ggml.model "gpt2" (byte-level BPE); .pre names the pre-tokenizer
//                ("gpt-2", "smollm", "llama-bpe"); .tokens spelled in the byte-level alphabet,
//                except control (type 3) and user-defined (type 4) tokens, which are raw text
//                and become special tokens; .merges "left right"; .bos_token_id,
//                .eos_token_id; .add_bos_token (absent: true for Llama 3, as in llama.cpp).
//                Or tokenizer.ggml.model "llama" (SentencePiece): .tokens as spelled, .scores,
//                .token_type (control, user-defined and unknown tokens become special tokens),
//                .unknown_token_id, .bos_token_id, .eos_token_id, .add_bos_token and
//                .add_space_prefix (absent: llama.cpp's defaults, 0, 1, 2, true and true).
//   tokenizer.json  model BPE (vocab, merges as "left right" or [left, right], ignore_merges);
//                the pre_tokenizer ByteLevel, Sequence[Digits, ByteLevel] or Llama 3's
//                Sequence[Split, ByteLevel]; added_tokens become special tokens; a
//                TemplateProcessing post-processor that starts with a special token makes it
//                the BOS added to every sequence; tokenizer_config.json next to it, when present,
//                names bos_token and eos_token. Or, with byte_fallback (SentencePiece as Hugging
//                Face converts it: Llama 2, Mistral, Gemma), the tokens as spelled, all 256 byte
//                tokens <0xXX>, merges by rank, unk_token, and the space prefix as the normalizer
//                Prepend + Replace or Replace alone, or a Metaspace pre-tokenizer (split false).
// Every problem is a tessera::Error naming the file and the key or field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "tessera/data/bpe.hpp"
#include "tessera/io/gguf.hpp"

namespace tessera::io {

// The tokenizer a GGUF file carries. Throws tessera::Error if it has none, or one tessera cannot
// run (e.g. WordPiece, tokenizer.ggml.model "bert").
data::BpeVocab gguf_bpe_vocab(const GgufFile& file);

// A Hugging Face tokenizer.json (and tokenizer_config.json beside it, if there is one).
data::BpeVocab hf_bpe_vocab(const std::filesystem::path& tokenizer_json);
// The same from the text of a tokenizer.json (no tokenizer_config.json); `name` is for messages.
data::BpeVocab hf_bpe_vocab_from_text(std::string_view text, const std::string& name);

// The tokenizer at `path`: a .gguf file, a tokenizer.json file, or a directory holding
// tokenizer.json, or encoder.json and vocab.bpe (GPT-2), or exactly one .gguf file.
data::Tokenizer load_tokenizer(const std::filesystem::path& path);

// The inverse of gguf_bpe_vocab: the tokenizer.ggml.* metadata of `vocab` (model "gpt2", the
// pre-tokenizer's llama.cpp name, tokens spelled in the byte-level alphabet with special tokens
// as their text and type control, merges, BOS/EOS and add_bos_token).
void set_gguf_tokenizer(GgufWriter& writer, const data::BpeVocab& vocab);

// The inverse of hf_bpe_vocab: DIR/tokenizer.json (model BPE with vocab and merges in the
// byte-level alphabet, the pre-tokenizer's Hugging Face form, special tokens also as
// added_tokens, a TemplateProcessing post-processor adding the BOS when the model wants one, else
// ByteLevel's, and the ByteLevel decoder) and DIR/tokenizer_config.json (bos_token, eos_token),
// both written atomically. Hugging Face's tokenizers and tessera read them back as `vocab`.
// Throws tessera::Error when two tokens have the same bytes (a JSON vocab cannot hold both). A
// SentencePiece vocabulary is written as Hugging Face's converters write Llama's and Gemma's:
// model BPE with byte_fallback, its merges (from a tokenizer.json, or every split of a token into
// two, by the tokens' scores), the space prefix as a normalizer or a Metaspace pre-tokenizer.
void write_hf_tokenizer(const std::filesystem::path& dir, const data::BpeVocab& vocab);

// The tokenizer a model saved in DIR carries, in the file load_tokenizer(DIR) finds, in the form
// that holds it exactly: tokenizer.json and tokenizer_config.json (write_hf_tokenizer) for
// byte-level BPE and for SentencePiece read from a tokenizer.json; tokenizer.gguf (a GGUF file of
// the tokenizer's metadata alone) for SentencePiece read from GGUF, whose merges go by score
// (a tokenizer.json's by rank). Returns the file's name.
std::string write_tokenizer_beside(const std::filesystem::path& dir, const data::BpeVocab& vocab);

// Throws tessera::Error unless every id of `tok` is a row of a model with `model_vocab` tokens
// (the tokenizer given with --tokenizer belongs to another model).
void require_tokenizer_fits(const data::Tokenizer& tok, std::int64_t model_vocab);

}  // namespace tessera::io
