// Optional time accounting per op family, for "where does the step go" reports. Pass a pointer
// to forward/backward; null means no timing.
#pragma once

#include <chrono>
#include <string>

namespace tessera::kernels {

enum class OpFamily {
  Gemm,
  Attention,
  LayerNorm,
  Gelu,
  CrossEntropy,
  Embedding,
  Elementwise,
  Optimizer,
  Count
};

inline const char* op_family_name(OpFamily f) {
  static const char* names[] = {"gemm",          "attention", "layernorm",   "gelu",
                                "cross_entropy", "embedding", "elementwise", "optimizer"};
  return names[static_cast<int>(f)];
}

struct Profile {
  double seconds[static_cast<int>(OpFamily::Count)] = {};
  double& operator[](OpFamily f) { return seconds[static_cast<int>(f)]; }
  double operator[](OpFamily f) const { return seconds[static_cast<int>(f)]; }
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
  void reset() { *this = Profile{}; }
};

// Adds the lifetime of the scope to profile[f] (no-op when profile is null).
class ProfileScope {
 public:
  ProfileScope(Profile* p, OpFamily f) : p_(p), f_(f) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (p_)
      (*p_)[f_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profile* p_;
  OpFamily f_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace tessera::kernels
