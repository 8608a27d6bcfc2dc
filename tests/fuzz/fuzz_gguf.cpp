// Fuzz target: a GGUF model file (pretrained models imported from llama.cpp's format).
// Any bytes: header, metadata, tensor infos and the data layout are validated; then every
// metadata value is decoded and every tensor read back and, when modest, dequantized; a
// tokenizer in the metadata is built and encodes and decodes a text, and a llama or gpt2 model in
// it loads (or is refused), and so do its quantized matrices for the packed kernels (a seed of a
// llama whose matrices mix Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 starts the fuzzer there).
#include "fuzz_util.hpp"
#include "tessera/io/gguf.hpp"
#include "tessera/io/gguf_model.hpp"
#include "tessera/io/tokenizer_files.hpp"
#include "tessera/quant/gguf_import.hpp"
#include "tessera/quant/packed.hpp"
#include "tokenizer_check.hpp"

namespace {

// A model file loads as a model or is refused (a small one only: the fuzzer's memory limit).
void check_model(const tessera::io::GgufFile& file) {
  if (!file.find_metadata("general.architecture")) return;
  const auto cfg = tessera::io::gguf_model_config(file);
  if (tessera::model::param_count(cfg) > 1e6) return;
  const auto m = tessera::io::load_gguf_model(file);
  tessera::fuzz::require(m.config == cfg, "the loaded model has the file's configuration");
  int packed = 0;
  const auto pack = [&](std::size_t, tessera::quant::QuantizedLinear&& q) {
    (void)tessera::quant::pack(q);
    ++packed;
  };
  tessera::quant::AnyModel any;
  std::string why;
  if (tessera::quant::read_gguf_quantized(file, {pack, pack}, any, why))
    tessera::fuzz::require(any.quantized && packed >= 4 * cfg.n_layer && why.empty(),
                           "a quantized file hands every block linear");
}

void check_tokenizer(const tessera::io::GgufFile& file) {
  if (!file.find_metadata("tokenizer.ggml.model")) return;
  tessera::fuzz::check_built_tokenizer(
      tessera::data::Tokenizer::from_vocab(tessera::io::gguf_bpe_vocab(file)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::io;
  return tessera::fuzz::judge([&] {
    const auto file =
        GgufFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.gguf");
    tessera::fuzz::require(file.data_offset() % file.alignment() == 0, "aligned data section");
    for (const auto& m : file.metadata()) {
      tessera::fuzz::require(file.find_metadata(m.key) == &m.value, "every key found");
      const GgufValue& v = m.value;
      try {  // the getter of the value's own type succeeds; others throw tessera::Error
        if (v.type() == GgufType::String) (void)v.as_string("fuzz");
        if (v.type() == GgufType::Array && v.element_type() == GgufType::String)
          (void)v.as_strings("fuzz");
        (void)v.as_int("fuzz");
      } catch (const tessera::Error&) {
      }
      try {
        (void)v.as_ints("fuzz");
      } catch (const tessera::Error&) {
      }
      try {
        (void)v.as_floats("fuzz");
      } catch (const tessera::Error&) {
      }
    }
    for (const auto& t : file.tensors()) {
      tessera::fuzz::require(file.find(t.name) == &t, "every tensor found by name");
      tessera::fuzz::require(t.offset % file.alignment() == 0 &&
                                 file.data_offset() + t.offset + t.nbytes <= file.file_size(),
                             "tensor inside the file and aligned");
      (void)file.bytes(t);
      if (can_dequantize(t.type) && t.numel() <= (1 << 20)) (void)file.dequantize(t);
    }
    check_tokenizer(file);
    check_model(file);
  });
}
