// Fuzz target: a checkpoint's state index (state_index.json), read by `train --resume`.
// A tiny model's checkpoint is saved once into a private directory under /dev/shm (or the temp
// directory); each input replaces its state_index.json and the checkpoint is loaded.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fuzz_util.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/model/layout.hpp"

namespace fs = std::filesystem;

namespace {

struct Fixture {
  tessera::model::ParamLayout layout{tessera::model::ModelConfig{1, 2, 8, 8, 16}};
  std::vector<float> params, m, v;
  fs::path root, dir;
  Fixture() : params(layout.total(), 0.5f), m(layout.total(), 0.0f), v(layout.total(), 0.0f) {
    const fs::path base =
        fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    root = base / ("tessera_fuzz_state_index_" + std::to_string(::getpid()));
    fs::remove_all(root);
    tessera::io::TrainState st;
    st.step = 3;
    dir = tessera::io::save_checkpoint(root, layout, params.data(), m.data(), v.data(), st, 1);
    // The seed corpus's index was written this way: TESSERA_FUZZ_SEED_OUT=file.
    if (const char* out = std::getenv("TESSERA_FUZZ_SEED_OUT"))
      fs::copy_file(dir / "state_index.json", out, fs::copy_options::overwrite_existing);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture f;
  {
    std::ofstream out(f.dir / "state_index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  return tessera::fuzz::judge([&] {
    auto st =
        tessera::io::load_checkpoint(f.dir, f.layout, f.params.data(), f.m.data(), f.v.data());
    tessera::fuzz::require(st.step >= 0, "non-negative step");
  });
}
