#include "tessera/core/cpu_peak.hpp"

#include <cpuid.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "tessera/core/cpu.hpp"

namespace tessera {

namespace {

bool is_zen1(const CpuVectorUnits& u) {
  return u.amd && u.family == 0x17 && u.model < 0x30;
}

// The value after "key<spaces>:" on a /proc/cpuinfo line, or empty.
std::string_view field(std::string_view line, std::string_view key) {
  if (line.substr(0, key.size()) != key) return {};
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return {};
  for (std::size_t i = key.size(); i < colon; ++i)
    if (line[i] != ' ' && line[i] != '\t') return {};  // a longer key ("model name")
  std::string_view v = line.substr(colon + 1);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return v;
}

double to_double(std::string_view s) {
  double v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

// cpufreq's highest clock of cpu0 in GHz, 0 where the kernel does not expose it (most VMs).
double cpufreq_max_ghz() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (!(in >> khz)) return 0;
  return khz / 1e6;
}

}  // namespace

CpuVectorUnits cpu_vector_units() {
  CpuVectorUnits u;
  u.amd = __builtin_cpu_is("amd");
  u.intel = __builtin_cpu_is("intel");
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const int base_family = (a >> 8) & 0xF, base_model = (a >> 4) & 0xF;
    u.family = base_family == 0xF ? base_family + ((a >> 20) & 0xFF) : base_family;
    u.model = base_family == 0x6 || base_family == 0xF ? base_model | (((a >> 16) & 0xF) << 4)
                                                       : base_model;
  }
  u.avx = __builtin_cpu_supports("avx");
  u.avx2 = __builtin_cpu_supports("avx2");
  u.fma = __builtin_cpu_supports("fma");
  u.avx512f = __builtin_cpu_supports("avx512f");
  u.avx512_bf16 = cpu_has_avx512_bf16();
  u.amx_bf16 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u);
  return u;
}

int fp32_flops_per_cycle(const CpuVectorUnits& u, std::string* unit_name) {
  std::pair<int, const char*> r{8, "SSE"};
  if (u.avx512f && u.amd && u.family == 0x19)
    r = {32, "AVX-512 on 256-bit FMA pipes (Zen 4)"};
  else if (u.avx512f)
    r = {64, "AVX-512, 2 FMA pipes"};
  else if (u.avx2 && u.fma && is_zen1(u))
    r = {16, "AVX2 FMA on 128-bit pipes (Zen 1)"};
  else if (u.avx2 && u.fma)
    r = {32, "AVX2, 2 FMA pipes"};
  else if (u.avx)
    r = {16, "AVX"};
  if (unit_name) *unit_name = r.second;
  return r.first;
}

int bf16_flops_per_cycle(const CpuVectorUnits& u, std::string* unit_name) {
  if (u.amx_bf16) {
    if (unit_name) *unit_name = "AMX bf16 tiles";
    return 1024;
  }
  const int fp32 = fp32_flops_per_cycle(u, unit_name);
  if (u.avx512_bf16) {
    if (unit_name) *unit_name += " with AVX-512 BF16 dot products";
    return 2 * fp32;
  }
  if (unit_name) *unit_name += " (no native bf16)";
  return fp32;
}

CpuInfo parse_cpuinfo(std::string_view text) {
  CpuInfo info;
  std::set<std::pair<std::string, std::string>> cores;
  std::string physical_id;
  int processors = 0;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    if (!field(line, "processor").empty()) ++processors;
    if (auto v = field(line, "physical id"); !v.empty()) physical_id = v;
    if (auto v = field(line, "core id"); !v.empty()) cores.emplace(physical_id, v);
    if (auto v = field(line, "cpu MHz"); !v.empty())
      info.max_mhz = std::max(info.max_mhz, to_double(v));
  }
  info.physical_cores = cores.empty() ? processors : static_cast<int>(cores.size());
  return info;
}

std::string CpuPeak::describe() const {
  return fmt::format("{} core{} x {:.2f} GHz ({}) x {} FLOP/cycle ({})", cores,
                     cores == 1 ? "" : "s", ghz, clock_source, flops_per_cycle, unit);
}

CpuPeak cpu_peak(int threads, bool bf16) {
  CpuPeak peak;
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  const CpuInfo info = parse_cpuinfo(text.str());
  const CpuVectorUnits units = cpu_vector_units();
  peak.flops_per_cycle =
      bf16 ? bf16_flops_per_cycle(units, &peak.unit) : fp32_flops_per_cycle(units, &peak.unit);
  peak.cores = std::min(std::max(threads, 1), std::max(info.physical_cores, 1));
  peak.ghz = cpufreq_max_ghz();
  peak.clock_source = "cpufreq maximum";
  if (peak.ghz <= 0) {
    peak.ghz = info.max_mhz / 1e3;
    peak.clock_source = "/proc/cpuinfo";
  }
  return peak;
}

}  // namespace tessera
