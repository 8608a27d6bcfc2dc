// Fuzz target: a safetensors file (model weights, checkpoint shards, quantized models).
// Any bytes: the header and offsets are validated, then every tensor is read back.
#include "fuzz_util.hpp"
#include "tessera/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tessera::io;
  return tessera::fuzz::judge([&] {
    auto file = SafetensorsFile::from_bytes(std::string(reinterpret_cast<const char*>(data), size),
                                            "fuzz.safetensors");
    for (const auto& t : file.tensors()) {
      tessera::fuzz::require(t.end <= file.data_size() && t.begin <= t.end, "offsets in range");
      tessera::fuzz::require(file.find(t.name) == &t, "every tensor found by name");
      (void)file.bytes(t);
      if (is_float_dtype(t.dtype))
        (void)file.read_f32(t.name);
      else
        (void)file.read_i64(t.name);
    }
  });
}
