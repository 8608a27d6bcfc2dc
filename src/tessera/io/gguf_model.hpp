// Pretrained models from GGUF files (llama.cpp's format; io/gguf.hpp reads it), e.g.
// SmolLM2-135M. docs/gguf.md describes the file; this maps it onto tessera's model families
// (model/config.hpp) and Hugging Face's parameter layout (model/layout.hpp):
//   llama    general.architecture "llama"; llama.block_count, .embedding_length,
//            .attention.head_count, .attention.head_count_kv (default head_count),
//            .feed_forward_length, .context_length (block_size), .rope.freq_base (default
//            10000), .attention.layer_norm_rms_epsilon; the head is tied when the file has no
//            output.weight. q_proj and k_proj rows are put back in Hugging Face's order
//            (permute_qk_to_hf, with the heads and the key-value heads).
//   gpt2     general.architecture "gpt2"; gpt2.block_count, .embedding_length,
//            .attention.head_count, .context_length (block_size, the rows of position_embd),
//            .feed_forward_length (must be 4 embedding_length), .attention.layer_norm_epsilon
//            (must be 1e-5, default 1e-5); the head is always tied (an output.weight, as older
//            converters wrote, must equal token_embd.weight). The matrices are stored (out, in),
//            as tessera stores them (llama.cpp's converter transposes GPT-2's Conv1D weights).
//   both     the vocabulary is the rows of token_embd.weight; every tensor of the layout, by
//            llama_hf_to_gguf_name / gpt2_hf_to_gguf_name, in any type the reader dequantizes,
//            its dims the reverse of the layout's (out, in) shape. The padded vocabulary rows
//            stay zero.
// Refused, each with one tessera::Error naming the file: another architecture (e.g. "gemma3"),
// a missing or out-of-range key, values that disagree (rope.dimension_count, attention
// key_length / value_length, vocab_size and the tokenizer's token count against the embedding),
// llama rotary scaling other than linear and llama3-style factors, mixture of experts, llama
// biases, a tensor of the wrong shape, any tensor the model does not use, and NaN or infinite
// weights.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "tessera/data/bpe.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/model/config.hpp"

namespace tessera::io {

// The model configuration of a llama or gpt2 GGUF file (validated with model::validate).
model::ModelConfig gguf_model_config(const GgufFile& f);

// The model of a llama or gpt2 GGUF file, its parameters in tessera's layout (fp32). Every
// tensor is found and checked; those `skip` names (when given) are not read, and stay zeros
// (pages never written: no memory), for a caller that reads them in another form.
using SkipTensor = std::function<bool(const model::ParamTensor&)>;
// The GGUF name of a tensor of the model (its Hugging Face name in tessera's layout), by
// llama_hf_to_gguf_name or gpt2_hf_to_gguf_name.
std::string gguf_name_of(const model::ModelConfig& cfg, const std::string& hf_name);
// llama's q_proj and k_proj rows are in a per-head interleaved order in GGUF files (for
// llama.cpp's rotation; permute_qk_rows): the heads to permute the rows of the layout's tensor
// `hf_name` with (n_head, the kv heads), or 0 for any other tensor.
std::int64_t gguf_qk_heads(const model::ModelConfig& cfg, const std::string& hf_name);
LoadedModel load_gguf_model(const GgufFile& f, const SkipTensor& skip = {});
LoadedModel load_gguf_model(const std::filesystem::path& file);

// Rows of a matrix already encoded for the file (a quantized model's linears carried onto GGUF's
// grid): given the matrix's offset in the layout, its rows and columns and its type in the file,
// the blocks of its rows in the layout's row order (the writer puts llama's q/k rows in GGUF's
// order), or nullopt to encode the fp32 values.
using RowEncoder = std::function<std::optional<std::vector<std::byte>>(
    std::int64_t offset, std::int64_t rows, std::int64_t cols, GgmlType type)>;

// Writes a model as llama.cpp's converter does (llama.* or gpt2.* metadata, GGUF names, llama's
// q/k rows in GGUF's order, 1-D tensors and GPT-2's position embedding in F32, the other
// matrices in `type`: F32, F16, BF16, Q8_0, Q4_0 or Q4_1), with the tokenizer's
// tokenizer.ggml.* metadata when `vocab` is given (its size must be the model's vocabulary).
// With a 4-bit type the embedding and the head are Q8_0 (8 bits where a 4-bit table costs the
// most quality); a matrix whose rows are not a whole number of the type's blocks is F16, as
// llama.cpp's quantizer falls back. Throws tessera::Error for another type.
void save_gguf_model(const std::filesystem::path& file, const model::ParamLayout& layout,
                     const float* params, GgmlType type, const data::BpeVocab* vocab);
// The same file as a writer (general.name = name), to write or take the bytes of; `encode`
// (optional) supplies encoded rows.
GgufWriter gguf_model_writer(const model::ParamLayout& layout, const float* params, GgmlType type,
                             const data::BpeVocab* vocab, const std::string& name,
                             const RowEncoder& encode = {});
// The type a matrix of `cols` columns gets in a file of `type` (the rules above); `table`: the
// embedding or the head.
GgmlType gguf_matrix_type(GgmlType type, std::int64_t cols, bool table);

}  // namespace tessera::io
