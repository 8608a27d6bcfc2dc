#include "tessera/core/team_barrier.hpp"

#include <cctype>
#include <cstdlib>
#include <string>

namespace tessera {

std::chrono::microseconds TeamBarrier::openmp_spin() {
  const char* v = std::getenv("OMP_WAIT_POLICY");
  std::string policy = v ? v : "";
  for (char& c : policy) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return policy == "passive" ? std::chrono::microseconds{0} : k_spin;
}

}  // namespace tessera
