#include "tessera/train/spike.hpp"

#include <cmath>

#include <fmt/format.h>

namespace tessera::train {

std::string SpikeGuard::check(std::int64_t step, double loss) {
  if (!std::isfinite(loss)) return fmt::format("the loss is {}", loss);
  const int n = static_cast<int>(recent_.size());
  if (n == window_) {
    double sum = 0;
    for (const auto& r : recent_) sum += r.second;
    const double mean = sum / n;
    if (loss > factor_ * mean)
      return fmt::format("the loss {:.4g} is above {} x {:.4g}, the mean of the last {} steps",
                         loss, factor_, mean, n);
    recent_.pop_front();
  }
  recent_.emplace_back(step, loss);
  return "";
}

void SpikeGuard::rewind(std::int64_t step) {
  while (!recent_.empty() && recent_.back().first > step) recent_.pop_back();
}

}  // namespace tessera::train
