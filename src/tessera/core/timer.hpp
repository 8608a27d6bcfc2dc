#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tessera {

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double ms() const { return seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Wall-clock time: seconds since the Unix epoch (the "time" of metrics rows and TensorBoard
// events).
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The median seconds of run(): two warm-up runs, then timed runs until there are at least
// min_reps and min_seconds have passed (benchmarks and the GEMM rate probes).
template <class Run>
double median_seconds(Run&& run, int min_reps, double min_seconds) {
  run();
  run();
  std::vector<double> t;
  Timer total;
  do {
    Timer one;
    run();
    t.push_back(one.seconds());
  } while (static_cast<int>(t.size()) < min_reps || total.seconds() < min_seconds);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace tessera
