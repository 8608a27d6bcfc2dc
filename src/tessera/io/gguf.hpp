// GGUF: llama.cpp's model file format, version 3 (the format pretrained models such as
// SmolLM2 and Gemma 3 ship in). docs/gguf.md describes what is read and written.
//
// Layout (little-endian throughout):
//   4 bytes   magic "GGUF"
//   u32       version (3)
//   u64       tensor count, u64 metadata count
//   metadata  count x {string key, u32 value type, value}
//   tensors   count x {string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset}
//   padding   zeros up to a multiple of the alignment (metadata "general.alignment", default 32)
//   data      each tensor at data start + offset, a multiple of the alignment
// A string is a u64 byte length and the bytes (no terminator); an array is a u32 element type,
// a u64 count and the elements. dims are listed innermost first (ggml's ne): dims[0] is the row
// length, so a (rows, cols) matrix has dims [cols, rows].
//
// GgufFile validates everything on open and never reads outside the file: every problem is a
// tessera::Error naming the file, and no claimed count or length is allocated before the bytes
// it claims are known to be there. GgufWriter builds a file in memory and writes it atomically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/file.hpp"
#include "tessera/io/gguf_quants.hpp"

namespace tessera::io {

constexpr std::uint64_t k_gguf_default_alignment = 32;

// Metadata value types; the numbers are those of the file format.
enum class GgufType : std::uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
// "uint32", "string", "array", as gguf-py spells them (lower case).
std::string_view gguf_type_name(GgufType type);

// One metadata value, held as its encoding in the file (the bytes after the type tag), so that a
// value read from one file is written to another unchanged. Built by the factories below or by
// GgufFile; the as_* getters decode it and throw tessera::Error, naming `what` (e.g. "metadata
// 'llama.block_count' in model.gguf"), when the value has another type.
class GgufValue {
 public:
  static GgufValue u8(std::uint8_t v);
  static GgufValue i8(std::int8_t v);
  static GgufValue u16(std::uint16_t v);
  static GgufValue i16(std::int16_t v);
  static GgufValue u32(std::uint32_t v);
  static GgufValue i32(std::int32_t v);
  static GgufValue u64(std::uint64_t v);
  static GgufValue i64(std::int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string_view v);
  // Arrays; `element` is any type but Array (nested arrays are not supported).
  static GgufValue array_u8(std::span<const std::uint8_t> v);
  static GgufValue array_i8(std::span<const std::int8_t> v);
  static GgufValue array_u16(std::span<const std::uint16_t> v);
  static GgufValue array_i16(std::span<const std::int16_t> v);
  static GgufValue array_u32(std::span<const std::uint32_t> v);
  static GgufValue array_i32(std::span<const std::int32_t> v);
  static GgufValue array_u64(std::span<const std::uint64_t> v);
  static GgufValue array_i64(std::span<const std::int64_t> v);
  static GgufValue array_f32(std::span<const float> v);
  static GgufValue array_f64(std::span<const double> v);
  static GgufValue array_bool(std::span<const bool> v);
  static GgufValue array_string(std::span<const std::string> v);

  GgufType type() const { return type_; }
  GgufType element_type() const { return element_type_; }  // arrays only
  std::uint64_t size() const { return count_; }            // array length; 1 for a scalar
  const std::string& encoding() const { return encoding_; }
  // "uint32", "string", "array of 3 float32": the type, for messages.
  std::string describe() const;
  bool operator==(const GgufValue&) const = default;

  std::string as_string(std::string_view what) const;
  std::int64_t as_int(std::string_view what) const;  // any integer type (uint64 up to INT64_MAX)
  double as_float(std::string_view what) const;      // float32 or float64
  bool as_bool(std::string_view what) const;
  std::vector<std::string> as_strings(std::string_view what) const;
  std::vector<std::int64_t> as_ints(std::string_view what) const;  // array of any integer type
  std::vector<double> as_floats(std::string_view what) const;      // array of float32/float64

  // The value whose encoding starts at data[0]; `end` receives the bytes it takes. Throws
  // tessera::Error (with `what` and the byte offset `base_offset + i` of the problem) if it runs
  // past `data` or is malformed (a nested array, a bool other than 0 or 1, an unknown type).
  static GgufValue decode(GgufType type, std::span<const std::byte> data, std::size_t& end,
                          std::string_view what, std::uint64_t base_offset);

 private:
  GgufValue(GgufType type, GgufType element_type, std::uint64_t count, std::string encoding)
      : type_(type), element_type_(element_type), count_(count), encoding_(std::move(encoding)) {}
  void require(GgufType type, std::string_view what) const;
  void require_array(std::string_view what) const;

  GgufType type_ = GgufType::U8;
  GgufType element_type_ = GgufType::U8;
  std::uint64_t count_ = 1;
  std::string encoding_;
};

struct GgufMetadata {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<std::int64_t> dims;  // innermost first: dims[0] is the row length (ggml's ne)
  std::uint64_t offset = 0;        // from the start of the data section
  std::uint64_t nbytes = 0;
  std::int64_t numel() const;  // product of dims (1 for no dims)
  std::vector<std::int64_t> shape()
      const;  // outermost first (row-major, as PyTorch): dims reversed
};

class GgufFile {
 public:
  // Maps the file read-only (mmap) and validates it; throws tessera::Error.
  static GgufFile open(const std::filesystem::path& path);
  // Same validation over bytes in memory; `name` is used in messages.
  static GgufFile from_bytes(std::string bytes, std::filesystem::path name);

  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }  // where the data section starts
  std::size_t file_size() const;

  // ---- metadata, in file order ----
  const std::vector<GgufMetadata>& metadata() const { return metadata_; }
  const GgufValue* find_metadata(std::string_view key) const;  // nullptr if absent
  const GgufValue& metadata(std::string_view key) const;       // throws if absent
  std::string get_string(std::string_view key) const;
  std::int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::vector<std::string> get_strings(std::string_view key) const;
  std::vector<std::int64_t> get_ints(std::string_view key) const;
  std::vector<double> get_floats(std::string_view key) const;

  // ---- tensors, in the order of the tensor infos ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find(std::string_view name) const;    // nullptr if absent
  const GgufTensorInfo& tensor(std::string_view name) const;  // throws if absent
  // The tensor's bytes as stored (no alignment guarantee beyond the file's: copy, don't cast).
  std::span<const std::byte> bytes(const GgufTensorInfo& t) const;
  // The tensor as numel() floats; throws tessera::Error for a type tessera cannot decode.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;
  void dequantize(const GgufTensorInfo& t, std::span<float> out) const;  // out: numel() floats

  const std::filesystem::path& path() const { return path_; }

 private:
  class Parser;
  GgufFile() = default;
  static GgufFile parse(std::shared_ptr<const FileBytes> storage, std::filesystem::path path);
  std::string what(std::string_view key) const;

  std::shared_ptr<const FileBytes> storage_;  // shared: copies of a GgufFile share the bytes
  std::uint64_t alignment_ = k_gguf_default_alignment;
  std::uint64_t data_offset_ = 0;
  std::vector<GgufMetadata> metadata_;
  std::map<std::string, std::size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
  std::filesystem::path path_;
};

// Builds a GGUF file: header, metadata in the order first set, tensor infos in the order added,
// then the data, each tensor padded with zeros to the alignment (the layout of gguf-py's
// GGUFWriter and of llama.cpp). Adds no metadata of its own.
class GgufWriter {
 public:
  // Sets a metadata value (replacing an earlier one in its place). "general.alignment" must be a
  // uint32 power of two; it becomes the alignment of the data section.
  void set_metadata(std::string key, GgufValue value);
  // Adds a tensor of any type from its encoded bytes (copied), e.g. those of a GgufFile's tensor;
  // data.size() must be what `dims` take in `type`. dims: innermost first, at most 4.
  void add_encoded(std::string name, GgmlType type, std::vector<std::int64_t> dims,
                   std::span<const std::byte> data);
  // Adds numel(dims) floats (row-major: dims[0] varies fastest), encoded now as `type` (one
  // can_quantize accepts). Values must be finite, except for F32, and within the range of F16
  // for F16, Q8_0, Q4_0 and Q4_1 (below 65520 in magnitude: their values or scales are F16).
  void add_f32(std::string name, GgmlType type, std::vector<std::int64_t> dims,
               std::span<const float> values);

  std::uint64_t alignment() const { return alignment_; }
  std::size_t tensor_count() const { return tensors_.size(); }
  // The whole file.
  std::string to_bytes() const;
  // Writes to_bytes() atomically ("<path>.tmp.<pid>", fsync, rename).
  void write(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<std::int64_t> dims;
    std::string data;
  };
  std::uint64_t check_tensor(const std::string& name, GgmlType type,
                             const std::vector<std::int64_t>& dims) const;

  std::vector<GgufMetadata> metadata_;
  std::vector<Tensor> tensors_;
  std::uint64_t alignment_ = k_gguf_default_alignment;
};

// ---- Llama and GPT-2 layouts (pure functions; docs/gguf.md) ----

// GGUF's llama tensor names <-> Hugging Face LlamaForCausalLM names, e.g. "blk.3.attn_q.weight"
// <-> "model.layers.3.self_attn.q_proj.weight", "token_embd.weight" <->
// "model.embed_tokens.weight", "output.weight" <-> "lm_head.weight". Both ".weight" and ".bias"
// map. std::nullopt for a name outside the map (e.g. "rope_freqs.weight").
std::optional<std::string> llama_gguf_to_hf_name(std::string_view gguf_name);
std::optional<std::string> llama_hf_to_gguf_name(std::string_view hf_name);

// GGUF's gpt2 tensor names <-> Hugging Face GPT2LMHeadModel names (without "transformer."), e.g.
// "blk.3.attn_qkv.weight" <-> "h.3.attn.c_attn.weight", "token_embd.weight" <-> "wte.weight",
// "position_embd.weight" <-> "wpe.weight", "output_norm.bias" <-> "ln_f.bias". std::nullopt
// for a name outside the map (e.g. "output.weight": GPT-2's head is tied to wte).
std::optional<std::string> gpt2_gguf_to_hf_name(std::string_view gguf_name);
std::optional<std::string> gpt2_hf_to_gguf_name(std::string_view hf_name);

// llama.cpp's converter reorders the rows of q_proj and k_proj (n_head = the attention heads for
// q, the key-value heads for k): each head's rows [first half, second half] (Hugging Face's
// rotate-half RoPE) become interleaved pairs (GGUF's RoPE on adjacent elements). With
// rows = n_head * head_dim, HF row h*head_dim + s*head_dim/2 + i becomes GGUF row
// h*head_dim + 2i + s (i < head_dim/2, s = 0, 1): the rows reshaped as (n_head, 2, head_dim/2)
// with the two inner axes swapped. `to_hf` applies the inverse.
// Any row size: in and out hold `rows` rows of in.size() / rows bytes each, so quantized rows
// move as they are. Throws tessera::Error if rows is not a multiple of 2 * n_head or the sizes
// disagree.
void permute_qk_rows(std::span<const std::byte> in, std::span<std::byte> out, std::int64_t n_head,
                     std::int64_t rows, bool to_hf);
// The same for a (rows, cols) fp32 matrix, row-major.
std::vector<float> permute_qk_to_gguf(std::span<const float> w, std::int64_t n_head,
                                      std::int64_t rows, std::int64_t cols);
std::vector<float> permute_qk_to_hf(std::span<const float> w, std::int64_t n_head,
                                    std::int64_t rows, std::int64_t cols);

}  // namespace tessera::io
