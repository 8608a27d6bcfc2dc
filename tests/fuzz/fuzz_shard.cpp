// Fuzz target: a token shard (train.bin / val.bin). The reader maps a file, so the input is
// written to an anonymous in-memory file (memfd) and opened through its /proc path.
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.hpp"
#include "tessera/data/shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = ::memfd_create("fuzz_shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  tessera::fuzz::judge([&] {
    tessera::data::ShardReader shard(path);
    tessera::fuzz::require(
        tessera::data::k_shard_header_bytes + shard.size() * shard.token_bytes() <= size,
        "tokens inside the file");
    std::vector<std::uint32_t> ids(shard.size());
    if (!ids.empty()) shard.read(0, ids.size(), ids.data());
    if (!ids.empty()) tessera::fuzz::require(shard[ids.size() - 1] == ids.back(), "same token");
  });
  ::close(fd);
  return 0;
}
