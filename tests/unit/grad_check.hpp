// Finite-difference gradient checking for the fp32 kernels (tests only).
//
// The objective is a scalar L(x) evaluated in double from the fp32 outputs of a forward pass
// (typically L = sum(out * R) for a fixed random R, so dL/dout = R). check_gradient compares an
// analytic gradient with the central difference (L(x+h) - L(x-h)) / (2h), element by element.
// Set TESSERA_GRAD_VERBOSE=1 to print, per checked tensor, the worst |analytic - fd| relative to
// the bound (useful when deriving a tolerance).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "tessera/core/rng.hpp"

namespace tessera::test {

// |analytic - reference| <= atol + rtol * |reference|
struct Tolerance {
  double atol;
  double rtol;
  double bound(double ref) const { return atol + rtol * std::abs(ref); }
};

inline std::vector<float> randn(Rng& rng, std::size_t n, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = shift + scale * rng.normal();
  return v;
}

// sum_i a[i] * b[i], accumulated in double.
inline double dot(const float* a, const float* b, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// All indices 0..n-1 if n <= max_checks, else max_checks distinct random ones (sorted).
inline std::vector<std::size_t> pick_indices(std::size_t n, std::size_t max_checks, Rng& rng) {
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  if (n <= max_checks) return idx;
  for (std::size_t i = 0; i < max_checks; ++i) {
    std::size_t j = i + static_cast<std::size_t>(rng.next_u64() % (n - i));
    std::swap(idx[i], idx[j]);
  }
  idx.resize(max_checks);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Runs the enclosed OpenMP regions on one thread and restores the previous thread count.
class SingleThreaded {
 public:
  SingleThreaded() : prev_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(prev_); }
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;

 private:
  int prev_;
};

struct GradCheckStats {
  std::size_t checked = 0;
  std::size_t failed = 0;
  double worst_err = 0.0;    // max |analytic - fd|
  double worst_ratio = 0.0;  // max |analytic - fd| / bound
};

// Checks analytic[i] against the central difference of loss() w.r.t. x[i] for all (or
// max_checks random) elements. loss() must read x. The step actually taken,
// fl(x+eps) - fl(x-eps), is used as the denominator (in double), so the fp32 rounding of the
// perturbed input does not bias the quotient. x is restored bit-exactly after each element.
// The forward passes inside run single-threaded: thousands of tiny parallel regions would be
// dominated by thread wake-ups (seconds on a loaded machine with OpenMP's default active wait),
// and L(x+h), L(x-h) only need to be computed the same way as each other. The analytic
// gradient is computed by the caller, with its own thread count.
inline GradCheckStats check_gradient(const std::string& name, float* x, std::size_t n,
                                     const float* analytic, const std::function<double()>& loss,
                                     double eps, Tolerance tol, Rng& rng,
                                     std::size_t max_checks = 50) {
  GradCheckStats st;
  SingleThreaded one_thread;
  for (std::size_t i : pick_indices(n, max_checks, rng)) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + eps);
    const float xm = static_cast<float>(x0 - eps);
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    const double err = std::abs(static_cast<double>(analytic[i]) - fd);
    const double b = tol.bound(fd);
    ++st.checked;
    st.worst_err = std::max(st.worst_err, err);
    st.worst_ratio = std::max(st.worst_ratio, err / b);
    if (!(err <= b)) {  // also catches NaN
      ++st.failed;
      if (st.failed <= 5) {
        ADD_FAILURE() << name << "[" << i << "]: analytic " << analytic[i]
                      << " vs finite difference " << fd << ", |diff| " << err << " > bound " << b
                      << " (atol " << tol.atol << ", rtol " << tol.rtol << ", eps " << eps << ")";
      }
    }
  }
  if (st.failed > 5)
    ADD_FAILURE() << name << ": " << st.failed << " of " << st.checked << " failed";
  if (const char* v = std::getenv("TESSERA_GRAD_VERBOSE"); v && *v && *v != '0') {
    std::printf("  grad %-28s checked %4zu  worst |a-fd| %.3e  worst ratio to bound %.3f\n",
                name.c_str(), st.checked, st.worst_err, st.worst_ratio);
  }
  return st;
}

// Elementwise |got - ref| <= tol.bound(ref); reports the first few offenders by index.
inline double expect_close(const std::string& name, const float* got, const double* ref,
                           std::size_t n, Tolerance tol) {
  std::size_t failed = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    const double b = tol.bound(ref[i]);
    worst_ratio = std::max(worst_ratio, err / b);
    if (!(err <= b) && ++failed <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: got " << got[i] << " vs reference " << ref[i]
                    << ", |diff| " << err << " > bound " << b;
    }
  }
  if (failed > 5) ADD_FAILURE() << name << ": " << failed << " of " << n << " out of tolerance";
  if (const char* v = std::getenv("TESSERA_GRAD_VERBOSE"); v && *v && *v != '0') {
    std::printf("  close %-27s n %5zu  worst ratio to bound %.3f\n", name.c_str(), n, worst_ratio);
  }
  return worst_ratio;
}

}  // namespace tessera::test
