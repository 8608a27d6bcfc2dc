#include "tessera/core/paths.hpp"

#include <cstdlib>

namespace tessera {

namespace fs = std::filesystem;

std::vector<fs::path> data_roots() {
  std::vector<fs::path> roots;
  std::error_code ec;
  auto add = [&](const fs::path& p) {
    if (!p.empty() && fs::is_directory(p, ec)) roots.push_back(p);
  };
  if (const char* home = std::getenv("TESSERA_HOME"); home && *home) add(home);
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    const fs::path above = exe.parent_path().parent_path();
    add(above / "share" / "tessera");
    add(above);
  }
  return roots;
}

fs::path find_data_path(const fs::path& p) {
  std::error_code ec;
  if (p.empty() || p.is_absolute() || fs::exists(p, ec)) return p;
  for (const fs::path& root : data_roots())
    if (fs::exists(root / p, ec)) return root / p;
  return p;
}

}  // namespace tessera
