// The bf16 flash attention (kernels/cuda/flash_attention.cu), and cuDNN's fused attention where the
// machine has cuDNN, against causal attention computed in
// double on the host from the same bf16-rounded inputs, forward (out, lse) and backward (dq, dk,
// dv), for every supported head size and for sequence lengths that are not multiples of the
// 64-row tile. Outputs are poisoned with NaN first, so an element the kernels never write fails.
//
// Bounds, with u = 2^-8 (bf16 unit roundoff) and p the exact softmax probabilities: the kernels
// round P to bf16 before P V and P^T dO, round dS to bf16 before dS K and dS^T Q, use the bf16
// output O in D = rowsum(dO O), and round every output to bf16: at most three relative roundings
// of u on each term of each sum (everything else is fp32, ~1e-7). So
//   |out_id - ref| <= 3u sum_j p_ij |v_jd|,         |dv_jd - ref| <= 3u sum_i p_ij |dO_id|,
//   |dk_jd - ref| <= 3u scale sum_i m_ij |q_id|,    |dq_id - ref| <= 3u scale sum_j m_ij |k_jd|,
// with m_ij = p_ij (|dp_ij| + |D_i| + sum_d |dO_id o_id|) >= |ds_ij| plus the error of D; plus
// 1e-6 absolute for the fp32 arithmetic. lse is all fp32: sums of at most T terms, 1e-4 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "tessera/kernels/cuda/cudnn_attention.hpp"
#include "tessera/kernels/cuda/ops.hpp"

namespace {

using namespace gpu_test;

struct Case {
  int B, T, NH, hs;
};

struct Reference {
  std::vector<float> out, lse, dqkv;          // values
  std::vector<double> out_bound, dqkv_bound;  // element-wise bounds
};

// Causal attention and its gradients in double; q, k, v, dout are the bf16-rounded inputs.
Reference reference(const Case& cs, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int B = cs.B, T = cs.T, NH = cs.NH, hs = cs.hs, C = NH * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference r;
  r.out.assign(static_cast<std::size_t>(B) * T * C, 0.0f);
  r.out_bound.assign(r.out.size(), 1e-6);
  r.lse.assign(static_cast<std::size_t>(B) * NH * T, 0.0f);
  r.dqkv.assign(qkv.size(), 0.0f);
  r.dqkv_bound.assign(qkv.size(), 1e-6);
  auto at = [&](int b, int t, int part, int h, int d) {
    return (static_cast<std::size_t>(b) * T + t) * 3 * C + part * C + h * hs + d;
  };
  std::vector<double> p(T), dp(T), o(hs), dq(static_cast<std::size_t>(T) * hs),
      dk(static_cast<std::size_t>(T) * hs), dv(static_cast<std::size_t>(T) * hs), bq(dq.size()),
      bk(dq.size()), bv(dq.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      std::fill(bq.begin(), bq.end(), 0.0);
      std::fill(bk.begin(), bk.end(), 0.0);
      std::fill(bv.begin(), bv.end(), 0.0);
      for (int i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int d = 0; d < hs; ++d) s += double(qkv[at(b, i, 0, h, d)]) * qkv[at(b, j, 1, h, d)];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        for (int j = 0; j <= i; ++j) p[j] = std::exp(p[j] - lse);
        r.lse[(static_cast<std::size_t>(b) * NH + h) * T + i] = static_cast<float>(lse);
        const std::size_t orow = (static_cast<std::size_t>(b) * T + i) * C + h * hs;
        double D = 0, Dmag = 0;
        for (int d = 0; d < hs; ++d) {
          double acc = 0, mag = 0;
          for (int j = 0; j <= i; ++j) {
            acc += p[j] * qkv[at(b, j, 2, h, d)];
            mag += p[j] * std::abs(qkv[at(b, j, 2, h, d)]);
          }
          o[d] = acc;
          r.out[orow + d] = static_cast<float>(acc);
          r.out_bound[orow + d] += 3 * k_u_bf16 * mag;
          D += dout[orow + d] * acc;
          Dmag += std::abs(dout[orow + d] * acc);
        }
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int d = 0; d < hs; ++d) s += double(dout[orow + d]) * qkv[at(b, j, 2, h, d)];
          dp[j] = s;
          const double ds = p[j] * (dp[j] - D);
          const double m = p[j] * (std::abs(dp[j]) + std::abs(D) + Dmag);
          for (int d = 0; d < hs; ++d) {
            const std::size_t ii = static_cast<std::size_t>(i) * hs + d;
            const std::size_t jj = static_cast<std::size_t>(j) * hs + d;
            dv[jj] += p[j] * dout[orow + d];
            bv[jj] += p[j] * std::abs(dout[orow + d]);
            dq[ii] += scale * ds * qkv[at(b, j, 1, h, d)];
            bq[ii] += scale * m * std::abs(qkv[at(b, j, 1, h, d)]);
            dk[jj] += scale * ds * qkv[at(b, i, 0, h, d)];
            bk[jj] += scale * m * std::abs(qkv[at(b, i, 0, h, d)]);
          }
        }
      }
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < hs; ++d) {
          const std::size_t td = static_cast<std::size_t>(t) * hs + d;
          r.dqkv[at(b, t, 0, h, d)] = static_cast<float>(dq[td]);
          r.dqkv[at(b, t, 1, h, d)] = static_cast<float>(dk[td]);
          r.dqkv[at(b, t, 2, h, d)] = static_cast<float>(dv[td]);
          r.dqkv_bound[at(b, t, 0, h, d)] += 3 * k_u_bf16 * bq[td];
          r.dqkv_bound[at(b, t, 1, h, d)] += 3 * k_u_bf16 * bk[td];
          r.dqkv_bound[at(b, t, 2, h, d)] += 3 * k_u_bf16 * bv[td];
        }
    }
  return r;
}

std::vector<std::uint16_t> rounded(Rng& rng, std::size_t n, std::vector<float>& values) {
  std::vector<std::uint16_t> bits(n);
  values.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    bits[i] = to_bf16(rng.normal());
    values[i] = from_bf16(bits[i]);
  }
  return bits;
}

std::vector<float> widened(const std::vector<std::uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) v[i] = from_bf16(bits[i]);
  return v;
}

// Runs one implementation's forward then backward on device buffers.
using AttentionRun = std::function<void(const Case&, gpu::DeviceBuffer& out, gpu::DeviceBuffer& lse,
                                        gpu::DeviceBuffer& dqkv, const gpu::DeviceBuffer& qkv,
                                        const gpu::DeviceBuffer& dout)>;

void check_against_reference(const char* name, const AttentionRun& run, const Case* cases,
                             std::size_t n_cases) {
  Rng rng(2024);
  for (std::size_t c = 0; c < n_cases; ++c) {
    const Case& cs = cases[c];
    SCOPED_TRACE(std::string(name) + " B=" + std::to_string(cs.B) + " T=" + std::to_string(cs.T) +
                 " NH=" + std::to_string(cs.NH) + " hs=" + std::to_string(cs.hs));
    const int C = cs.NH * cs.hs;
    const std::size_t n_qkv = static_cast<std::size_t>(cs.B) * cs.T * 3 * C;
    const std::size_t n_out = static_cast<std::size_t>(cs.B) * cs.T * C;
    std::vector<float> qkv, dout;
    auto qkv_bits = rounded(rng, n_qkv, qkv);
    auto dout_bits = rounded(rng, n_out, dout);
    Reference ref = reference(cs, qkv, dout);

    auto d_qkv = upload(qkv_bits), d_dout = upload(dout_bits);
    auto d_out = upload(std::vector<std::uint16_t>(n_out, 0x7fc0));  // NaN
    auto d_lse = upload(std::vector<float>(static_cast<std::size_t>(cs.B) * cs.NH * cs.T,
                                           std::numeric_limits<float>::quiet_NaN()));
    auto d_dqkv = upload(std::vector<std::uint16_t>(n_qkv, 0x7fc0));
    run(cs, d_out, d_lse, d_dqkv, d_qkv, d_dout);
    auto out = widened(download<std::uint16_t>(d_out, n_out));
    auto lse = download<float>(d_lse, ref.lse.size());
    auto dqkv = widened(download<std::uint16_t>(d_dqkv, n_qkv));
    expect_within(out, ref.out, ref.out_bound, "forward out");
    expect_close(lse, ref.lse, 1e-4, 0.0, "forward lse");
    expect_within(dqkv, ref.dqkv, ref.dqkv_bound, "backward dqkv");
  }
}

const Case k_cases[] = {
    {2, 200, 3, 64}, {1, 64, 2, 32}, {1, 37, 2, 64}, {1, 130, 2, 128}, {2, 256, 2, 64}};

TEST(FlashAttention, MatchesDoubleReferenceForwardAndBackward) {
  REQUIRE_GPU();
  check_against_reference(
      "flash",
      [](const Case& cs, gpu::DeviceBuffer& out, gpu::DeviceBuffer& lse, gpu::DeviceBuffer& dqkv,
         const gpu::DeviceBuffer& qkv, const gpu::DeviceBuffer& dout) {
        const int C = cs.NH * cs.hs;
        ASSERT_TRUE(gpu::flash_attention_supports(C, cs.NH));
        gpu::DeviceBuffer ws(gpu::flash_attention_workspace_bytes(cs.B, cs.T, C, cs.NH));
        gpu::flash_attention_forward(out.as<std::uint16_t>(), lse.as<float>(),
                                     qkv.as<std::uint16_t>(), cs.B, cs.T, C, cs.NH, nullptr);
        gpu::flash_attention_backward(dqkv.as<std::uint16_t>(), dout.as<std::uint16_t>(),
                                      qkv.as<std::uint16_t>(), out.as<std::uint16_t>(),
                                      lse.as<float>(), ws.as<float>(), cs.B, cs.T, C, cs.NH,
                                      nullptr);
      },
      k_cases, std::size(k_cases));
}

// cuDNN's fused attention under the same bounds: it is a FlashAttention-2 style kernel with the
// same roundings (P and dS to bf16 before their products, D from the bf16 output, outputs in
// bf16). Skipped where the machine has no cuDNN 9; a shape without an engine fails.
TEST(CudnnAttention, MatchesDoubleReferenceForwardAndBackward) {
  REQUIRE_GPU();
  std::string why;
  if (!gpu::CudnnAttention::create(1, 1, 64, &why)) GTEST_SKIP() << why;
  check_against_reference(
      "cuDNN",
      [](const Case& cs, gpu::DeviceBuffer& out, gpu::DeviceBuffer& lse, gpu::DeviceBuffer& dqkv,
         const gpu::DeviceBuffer& qkv, const gpu::DeviceBuffer& dout) {
        auto att = gpu::CudnnAttention::create(cs.NH, cs.NH, cs.hs, nullptr);
        ASSERT_TRUE(att && att->supports(cs.B, cs.T)) << "no cuDNN engine";
        att->forward(out.as<std::uint16_t>(), lse.as<float>(), qkv.as<std::uint16_t>(), cs.B, cs.T,
                     nullptr);
        att->backward(dqkv.as<std::uint16_t>(), dout.as<std::uint16_t>(), qkv.as<std::uint16_t>(),
                      out.as<std::uint16_t>(), lse.as<float>(), cs.B, cs.T, nullptr);
        gpu::synchronize();
      },
      k_cases, std::size(k_cases));
}

// The tensor-core kernels against the fp32 kernels of attention.cu on the same inputs: the two
// GPU paths agree within the bf16 bounds above (checked loosely here, normwise, 2e-2).
TEST(FlashAttention, AgreesWithFp32KernelNormwise) {
  REQUIRE_GPU();
  const int B = 2, T = 300, NH = 4, hs = 64, C = NH * hs;
  Rng rng(7);
  std::vector<float> qkv, dout;
  auto qkv_bits = rounded(rng, static_cast<std::size_t>(B) * T * 3 * C, qkv);
  auto dout_bits = rounded(rng, static_cast<std::size_t>(B) * T * C, dout);
  auto f_qkv = upload(qkv), f_dout = upload(dout);
  gpu::DeviceBuffer f_out(dout.size() * 4), f_lse(static_cast<std::size_t>(B) * NH * T * 4),
      f_dqkv(qkv.size() * 4);
  gpu::attention_forward(f_out.as<float>(), f_lse.as<float>(), f_qkv.as<float>(), B, T, NH, NH, hs,
                         nullptr);
  gpu::attention_backward(f_dqkv.as<float>(), f_dout.as<float>(), f_qkv.as<float>(),
                          f_out.as<float>(), f_lse.as<float>(), B, T, NH, NH, hs, nullptr);
  auto b_qkv = upload(qkv_bits), b_dout = upload(dout_bits);
  gpu::DeviceBuffer b_out(dout.size() * 2), b_lse(static_cast<std::size_t>(B) * NH * T * 4),
      b_dqkv(qkv.size() * 2), ws(gpu::flash_attention_workspace_bytes(B, T, C, NH));
  gpu::flash_attention_forward(b_out.as<std::uint16_t>(), b_lse.as<float>(),
                               b_qkv.as<std::uint16_t>(), B, T, C, NH, nullptr);
  gpu::flash_attention_backward(b_dqkv.as<std::uint16_t>(), b_dout.as<std::uint16_t>(),
                                b_qkv.as<std::uint16_t>(), b_out.as<std::uint16_t>(),
                                b_lse.as<float>(), ws.as<float>(), B, T, C, NH, nullptr);
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
      den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel(widened(download<std::uint16_t>(b_out, dout.size())),
                download<float>(f_out, dout.size())),
            2e-2);
  EXPECT_LT(rel(widened(download<std::uint16_t>(b_dqkv, qkv.size())),
                download<float>(f_dqkv, qkv.size())),
            2e-2);
}

}  // namespace
