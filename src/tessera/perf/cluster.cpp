#include "tessera/perf/cluster.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/toml_reader.hpp"

namespace tessera::perf {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::BF16:
      return "bf16";
    case DType::FP16:
      return "fp16";
    case DType::FP32:
      return "fp32";
  }
  return "?";
}

DType parse_dtype(const std::string& s) {
  if (s == "bf16") return DType::BF16;
  if (s == "fp16") return DType::FP16;
  if (s == "fp32") return DType::FP32;
  throw Error(fmt::format("unknown dtype '{}'", s), "use bf16, fp16 or fp32");
}

double ClusterSpec::peak_tflops(DType d) const {
  switch (d) {
    case DType::BF16:
      return peak_tflops_bf16;
    case DType::FP16:
      return peak_tflops_fp16;
    case DType::FP32:
      return peak_tflops_fp32;
  }
  return 0;
}

namespace {
constexpr const char* k_hint = "see docs/performance-model.md for the cluster file format";

[[noreturn]] void bad(const ClusterSpec& c, const std::string& msg) {
  throw Error(fmt::format("{}: {}", c.source.empty() ? c.name : c.source, msg), k_hint);
}
}  // namespace

void validate(const ClusterSpec& c) {
  if (c.name.empty()) bad(c, "name missing");
  if (!(c.peak_tflops_bf16 > 0 || c.peak_tflops_fp16 > 0 || c.peak_tflops_fp32 > 0))
    bad(c, "[device] needs a positive peak_tflops_bf16, peak_tflops_fp16 or peak_tflops_fp32");
  if (c.peak_tflops_bf16 < 0 || c.peak_tflops_fp16 < 0 || c.peak_tflops_fp32 < 0)
    bad(c, "[device] peak_tflops_* must be >= 0");
  if (!(c.memory_gib > 0)) bad(c, "[device] memory_gib must be positive");
  if (!(c.memory_bw_gbps > 0)) bad(c, "[device] memory_bw_gbps must be positive");
  if (c.reserved_gib < 0 || c.reserved_gib >= c.memory_gib)
    bad(c,
        fmt::format("[device] reserved_gib must be in [0, memory_gib) (got {})", c.reserved_gib));
  if (!(c.gemm_max_efficiency > 0 && c.gemm_max_efficiency <= 1))
    bad(c, fmt::format("[gemm] max_efficiency must be in (0, 1] (got {})", c.gemm_max_efficiency));
  if (!(c.gemm_half_dim >= 0)) bad(c, "[gemm] half_dim must be >= 0");
  if (c.devices_per_node < 1 || c.devices_per_node > k_max_devices)
    bad(c, fmt::format("[node] devices must be in [1, {}] (got {})", k_max_devices,
                       c.devices_per_node));
  if (c.devices_per_node > 1 && c.links.empty())
    bad(c, "[[node.links]] missing: a node with several devices needs at least one link level");
  int prev = 1;
  for (const auto& l : c.links) {
    if (l.group < 2 || l.group % prev != 0 || c.devices_per_node % l.group != 0 || l.group <= prev)
      bad(c, fmt::format("[[node.links]] '{}': group {} must grow from level to level, divide the "
                         "next level and the node's {} devices",
                         l.name, l.group, c.devices_per_node));
    if (!(l.bw_gbps > 0))
      bad(c, fmt::format("[[node.links]] '{}': bw_gbps must be positive", l.name));
    if (!(l.efficiency > 0 && l.efficiency <= 1))
      bad(c, fmt::format("[[node.links]] '{}': efficiency must be in (0, 1]", l.name));
    if (l.latency_us < 0)
      bad(c, fmt::format("[[node.links]] '{}': latency_us must be >= 0", l.name));
    prev = l.group;
  }
  if (!c.links.empty() && c.links.back().group != c.devices_per_node)
    bad(c, fmt::format("[[node.links]]: the last level must cover the node's {} devices (got {})",
                       c.devices_per_node, c.links.back().group));
  if (c.max_nodes != 1 && !(c.injection_gbps > 0))
    bad(c, "[network] injection_gbps must be positive (or set max_nodes = 1)");
  if (!(c.network_efficiency > 0 && c.network_efficiency <= 1))
    bad(c, "[network] efficiency must be in (0, 1]");
  if (c.max_nodes < 0) bad(c, "max_nodes must be >= 0");
  if (!(c.overlap >= 0 && c.overlap <= 1)) bad(c, "[node] overlap must be in [0, 1]");
  if (!(c.overlap_polled >= 0 && c.overlap_polled <= 1))
    bad(c, "[node] overlap_polled must be in [0, 1]");
  if (c.compute_slots < 0 || c.compute_slots > c.devices_per_node)
    bad(c, fmt::format("[node] compute_slots must be in [0, devices = {}] (0: every device)",
                       c.devices_per_node));
  if (!(c.all_gather_factor > 0 && c.all_gather_factor <= 4) ||
      !(c.reduce_scatter_factor > 0 && c.reduce_scatter_factor <= 4))
    bad(c, "[node] all_gather_factor and reduce_scatter_factor must be in (0, 4]");
}

namespace {

// [device]: what one accelerator computes and holds.
void read_device(TomlReader& r, ClusterSpec& c) {
  const auto* dev = r.table("device", true);
  r.only_keys(dev, "device",
              {"name", "peak_tflops_bf16", "peak_tflops_fp16", "peak_tflops_fp32", "memory_gib",
               "memory_bw_gbps", "reserved_gib"});
  c.device = r.string(dev, "device", "name", true);
  c.peak_tflops_bf16 = r.number(dev, "device", "peak_tflops_bf16", false);
  c.peak_tflops_fp16 = r.number(dev, "device", "peak_tflops_fp16", false, c.peak_tflops_bf16);
  c.peak_tflops_fp32 = r.number(dev, "device", "peak_tflops_fp32", false);
  c.memory_gib = r.number(dev, "device", "memory_gib", true);
  c.memory_bw_gbps = r.number(dev, "device", "memory_bw_gbps", true);
  c.reserved_gib = r.number(dev, "device", "reserved_gib", false, 0);
}

// [[node.links]] of the [node] table `node`: the levels of the node's interconnect.
void read_links(TomlReader& r, const toml::table* node, ClusterSpec& c) {
  const toml::node* ln = node->get("links");
  if (!ln) return;
  const toml::array* arr = ln->as_array();
  if (!arr) r.fail("[node] links", "must be an array of tables ([[node.links]])");
  for (const auto& e : *arr) {
    const toml::table* t = e.as_table();
    if (!t) r.fail("[[node.links]]", "each entry must be a table");
    r.only_keys(t, "node.links", {"name", "group", "bw_gbps", "efficiency", "latency_us"});
    LinkLevel l;
    l.name = r.string(t, "node.links", "name", true);
    l.group = r.integer(t, "node.links", "group", true);
    l.bw_gbps = r.number(t, "node.links", "bw_gbps", true);
    l.efficiency = r.number(t, "node.links", "efficiency", false, 0.8);
    l.latency_us = r.number(t, "node.links", "latency_us", false, 2.0);
    c.links.push_back(l);
  }
}

// [node]: its devices, how communication overlaps computation, and its links.
void read_node(TomlReader& r, ClusterSpec& c) {
  const auto* node = r.table("node", true);
  r.only_keys(node, "node",
              {"devices", "links", "overlap", "overlap_polled", "compute_slots",
               "all_gather_factor", "reduce_scatter_factor"});
  c.devices_per_node = r.integer(node, "node", "devices", true);
  c.overlap = r.number(node, "node", "overlap", false, 1.0);
  c.overlap_polled = r.number(node, "node", "overlap_polled", false, c.overlap);
  c.compute_slots = static_cast<int>(r.integer(node, "node", "compute_slots", false, 0));
  c.all_gather_factor = r.number(node, "node", "all_gather_factor", false, 1.0);
  c.reduce_scatter_factor = r.number(node, "node", "reduce_scatter_factor", false, 1.0);
  read_links(r, node, c);
}

}  // namespace

ClusterSpec parse_cluster(std::string_view text, std::string_view source_name) {
  TomlReader r(text, std::string(source_name), k_hint);
  ClusterSpec c;
  c.source = std::string(source_name);
  const auto* root = r.table("", true);
  r.only_keys(root, "", {"name", "description", "max_nodes", "device", "gemm", "node", "network"});
  c.name = r.string(root, "", "name", true);
  c.description = r.string(root, "", "description", false);
  c.max_nodes = r.integer(root, "", "max_nodes", false, 0);
  read_device(r, c);
  const auto* gemm = r.table("gemm", false);
  r.only_keys(gemm, "gemm", {"max_efficiency", "half_dim"});
  c.gemm_max_efficiency = r.number(gemm, "gemm", "max_efficiency", false, 0.8);
  c.gemm_half_dim = r.number(gemm, "gemm", "half_dim", false, 64);
  read_node(r, c);
  const auto* net = r.table("network", false);
  r.only_keys(net, "network", {"injection_gbps", "efficiency", "latency_us"});
  c.injection_gbps = r.number(net, "network", "injection_gbps", false, 0);
  c.network_efficiency = r.number(net, "network", "efficiency", false, 0.8);
  c.network_latency_us = r.number(net, "network", "latency_us", false, 5.0);
  validate(c);
  return c;
}

ClusterSpec load_cluster(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw Error(fmt::format("cluster file not found: {}", file.string()),
                "cluster specs are in configs/clusters/ (e.g. configs/clusters/selene.toml)");
  return parse_cluster(read_file(file, "cluster file"), file.string());
}

std::string to_toml(const ClusterSpec& c) {
  std::string s;
  s += fmt::format("name = \"{}\"\n", c.name);
  if (!c.description.empty()) s += fmt::format("description = \"{}\"\n", c.description);
  if (c.max_nodes) s += fmt::format("max_nodes = {}\n", c.max_nodes);
  s += "\n[device]\n";
  s += fmt::format("name = \"{}\"\n", c.device);
  s += fmt::format(
      "peak_tflops_bf16 = {:.6g}\npeak_tflops_fp16 = {:.6g}\npeak_tflops_fp32 = {:.6g}\n",
      c.peak_tflops_bf16, c.peak_tflops_fp16, c.peak_tflops_fp32);
  s += fmt::format("memory_gib = {:.6g}\nmemory_bw_gbps = {:.6g}\nreserved_gib = {:.6g}\n",
                   c.memory_gib, c.memory_bw_gbps, c.reserved_gib);
  s += fmt::format("\n[gemm]\nmax_efficiency = {:.4f}\nhalf_dim = {:.6g}\n", c.gemm_max_efficiency,
                   c.gemm_half_dim);
  s += fmt::format(
      "\n[node]\ndevices = {}\ncompute_slots = {}\noverlap = {:.3f}\noverlap_polled = {:.3f}\n"
      "all_gather_factor = {:.3f}\nreduce_scatter_factor = {:.3f}\n",
      c.devices_per_node, c.compute_slots, c.overlap, c.overlap_polled, c.all_gather_factor,
      c.reduce_scatter_factor);
  for (const auto& l : c.links)
    s += fmt::format(
        "\n[[node.links]]\nname = \"{}\"\ngroup = {}\nbw_gbps = {:.6g}\nefficiency = {:.4f}\n"
        "latency_us = {:.6g}\n",
        l.name, l.group, l.bw_gbps, l.efficiency, l.latency_us);
  s += fmt::format(
      "\n[network]\ninjection_gbps = {:.6g}\nefficiency = {:.4f}\nlatency_us = {:.6g}\n",
      c.injection_gbps, c.network_efficiency, c.network_latency_us);
  return s;
}

namespace {
// The smallest intra-node level covering `extent` consecutive devices.
const LinkLevel* level_for(const ClusterSpec& c, long extent) {
  for (const auto& l : c.links)
    if (extent <= l.group) return &l;
  return c.links.empty() ? nullptr : &c.links.back();
}
}  // namespace

double compute_share(const ClusterSpec& c, long ranks) {
  const long busy = std::min<long>(std::max<long>(ranks, 1), c.devices_per_node);
  if (c.compute_slots <= 0 || c.compute_slots >= busy) return 1.0;
  return static_cast<double>(c.compute_slots) / static_cast<double>(busy);
}

GroupLink group_link(const ClusterSpec& c, long stride, long size) {
  GroupLink g;
  if (size <= 1) return g;
  const long dpn = c.devices_per_node;
  const long extent = stride * (size - 1) + 1;
  if (stride * size <= dpn || extent <= dpn) {
    const LinkLevel* l = level_for(c, extent);
    if (!l) return g;  // one device per node and size 1: nothing to do
    g.bw = l->bw_gbps * 1e9 * l->efficiency;
    g.latency = l->latency_us * 1e-6;
    g.ag_bw = g.bw * c.all_gather_factor;
    g.rs_bw = g.bw * c.reduce_scatter_factor;
    return g;
  }
  g.inter_node = true;
  // Members of this group inside one node, and the interleaved groups sharing the node's NICs.
  const long members = stride >= dpn ? 1 : dpn / stride;
  const long sharing = stride >= dpn ? dpn : stride;
  double bw = c.injection_gbps * 1e9 * c.network_efficiency / static_cast<double>(sharing);
  double lat = c.network_latency_us * 1e-6;
  if (members > 1) {
    const LinkLevel* l = level_for(c, stride * (members - 1) + 1);
    if (l) bw = std::min(bw, l->bw_gbps * 1e9 * l->efficiency);
  }
  g.bw = bw;
  g.latency = lat;
  g.ag_bw = g.bw * c.all_gather_factor;
  g.rs_bw = g.bw * c.reduce_scatter_factor;
  return g;
}

double all_reduce_time(const GroupLink& l, long size, double bytes) {
  if (size <= 1 || bytes <= 0) return 0;
  const double p = static_cast<double>(size);
  return 2 * (p - 1) / p * bytes / l.bw + 2 * (p - 1) * l.latency;
}

double all_gather_time(const GroupLink& l, long size, double bytes) {
  if (size <= 1 || bytes <= 0) return 0;
  const double p = static_cast<double>(size);
  return (p - 1) / p * bytes / (l.ag_bw > 0 ? l.ag_bw : l.bw) + (p - 1) * l.latency;
}

double reduce_scatter_time(const GroupLink& l, long size, double bytes) {
  if (size <= 1 || bytes <= 0) return 0;
  const double p = static_cast<double>(size);
  return (p - 1) / p * bytes / (l.rs_bw > 0 ? l.rs_bw : l.bw) + (p - 1) * l.latency;
}

double p2p_time(const GroupLink& l, double bytes) {
  if (bytes <= 0 || l.bw <= 0) return 0;
  return bytes / l.bw + l.latency;
}

double gemm_efficiency(const ClusterSpec& c, double M, double N, double K) {
  const double h = c.gemm_half_dim;
  auto f = [h](double d) { return d / (d + h); };
  return c.gemm_max_efficiency * f(M) * f(N) * f(K);
}

}  // namespace tessera::perf
