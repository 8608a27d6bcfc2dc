// Machine descriptions for the performance model: one device type per cluster, the link
// hierarchy inside a node, and the network. Loaded from configs/clusters/*.toml (format in
// docs/performance-model.md); `tessera probe` writes one for the machine it runs on.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::perf {

// The most devices the performance model takes, in a node or in a job (the planner, the
// simulator, the scaling study): 2^20, far beyond any machine built. Below it the grids of any
// device count are enumerated in seconds.
constexpr long k_max_devices = 1L << 20;

enum class DType { BF16, FP16, FP32 };
const char* dtype_name(DType d);
DType parse_dtype(const std::string& s);  // "bf16", "fp16", "fp32"; throws tessera::Error

// One level of the link hierarchy inside a node, innermost first. A group of devices whose
// extent fits inside `group` consecutive devices (aligned) communicates at this level.
struct LinkLevel {
  std::string name;         // "nvlink", "infinity-fabric-pair", ...
  int group = 1;            // devices covered by the level (a divisor of the node's devices)
  double bw_gbps = 0;       // per device, one direction, hardware figure (GB/s)
  double efficiency = 0.8;  // fraction a ring collective sustains
  double latency_us = 2.0;  // per message step
};

struct ClusterSpec {
  std::string name, description, source;  // source: the file it was read from
  // device
  std::string device;
  double peak_tflops_bf16 = 0, peak_tflops_fp16 = 0, peak_tflops_fp32 = 0;  // dense matrix
  double memory_gib = 0;                                                    // per device
  double memory_bw_gbps = 0;  // per device (HBM / DRAM)
  double reserved_gib = 0;    // runtime context, allocator fragmentation: not usable
  // GEMM efficiency vs shape: eff(M,N,K) = max_efficiency * prod_d d/(d + half_dim)
  double gemm_max_efficiency = 0.8;
  double gemm_half_dim = 64;
  // node and network
  int devices_per_node = 1;
  std::vector<LinkLevel> links;  // innermost first; the last covers the whole node
  // Fraction of a non-blocking collective's time that can hide behind computation running at the
  // same time: 1 where a copy engine / NCCL kernel moves the data while the device computes; a
  // CPU MPI library without a progress thread moves it only inside MPI calls (tessera probe
  // measures it: a GEMM and an all-reduce, alone and together).
  double overlap = 1.0;
  // The same when the computation calls into the library between its pieces (tessera's
  // data-parallel reduction tests its requests at every layer boundary): the probe's GEMM in
  // slices with a test between them. Defaults to `overlap`.
  double overlap_polled = 1.0;
  // How many of the node's devices can compute at full speed at once: 0 (or `devices`) for
  // devices of their own (GPUs); fewer where ranks share cores (tessera probe: cores / threads
  // per rank). The device rates in the file are the rates with every device busy; a device
  // whose neighbours idle (a pipeline's fill and drain) runs faster, up to devices / slots times.
  int compute_slots = 0;
  // Bus bandwidth of the library's all-gather and reduce-scatter relative to its all-reduce on
  // the same links (1: ring algorithms for all three, as NCCL; some MPI libraries' (v-)variants
  // are slower; tessera probe measures them).
  double all_gather_factor = 1.0, reduce_scatter_factor = 1.0;
  double injection_gbps = 0;  // per node, one direction (sum of its NICs)
  double network_efficiency = 0.8;
  double network_latency_us = 5.0;
  int max_nodes = 0;  // 0: no limit

  double peak_tflops(DType d) const;
};

// Parses and validates; throws tessera::Error("file: [section] key: problem", hint).
ClusterSpec parse_cluster(std::string_view toml_text, std::string_view source_name);
ClusterSpec load_cluster(const std::filesystem::path& file);
// The fraction of a full-speed device each of `ranks` busy devices of one node gets (1 unless the
// node's compute_slots are fewer than its busy devices).
double compute_share(const ClusterSpec& c, long ranks);
void validate(const ClusterSpec& c);  // throws tessera::Error on inconsistent specs
std::string to_toml(const ClusterSpec& c);

// Effective bandwidth (bytes/s) and per-step latency (s) of a collective group of `size`
// devices whose members are `stride` ranks apart (rank order is the topology order, innermost
// axis fastest; nodes hold consecutive ranks). A group inside a node uses the smallest link
// level covering its extent; a group that spans nodes shares each node's injection bandwidth
// with the other groups interleaved with it (min(stride, devices_per_node) of them), the AxoNN
// bandwidth model (docs/performance-model.md).
struct GroupLink {
  double bw = 0;                // bytes/s per device, one direction
  double latency = 0;           // s per ring step
  double ag_bw = 0, rs_bw = 0;  // the same for all-gather / reduce-scatter (0: bw)
  bool inter_node = false;
};
GroupLink group_link(const ClusterSpec& c, long stride, long size);

// Ring collective times in seconds for `bytes` (the full buffer: all-reduce input, all-gather
// output, reduce-scatter input) over a group of `size` devices.
double all_reduce_time(const GroupLink& l, long size, double bytes);
double all_gather_time(const GroupLink& l, long size, double bytes);
double reduce_scatter_time(const GroupLink& l, long size, double bytes);
double p2p_time(const GroupLink& l, double bytes);

// Fraction of peak a GEMM of (M x K) @ (K x N) reaches.
double gemm_efficiency(const ClusterSpec& c, double M, double N, double K);

}  // namespace tessera::perf
