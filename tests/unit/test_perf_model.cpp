// The performance model (perf/): cluster and model files, FLOPs, memory (ZeRO accounting,
// Korthikanti's activation formulas), AxoNN's communication volumes and bandwidth lookup, the
// planner and the schedule simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../scratch_dir.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model_spec.hpp"
#include "tessera/perf/planner.hpp"
#include "tessera/perf/probe.hpp"
#include "tessera/perf/simulator.hpp"

using namespace tessera::perf;
using tessera::comm::Axis;
using tessera::comm::GridShape;
using tessera::parallel::ScheduleKind;

namespace {

std::string path(const std::string& rel) {
  return std::string(TESSERA_DATA) + "/../" + rel;
}

std::string error_of(const std::string& toml) {
  try {
    parse_cluster(toml, "bad.toml");
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

const char* k_small = R"(
name = "small"
[device]
name = "dev"
peak_tflops_bf16 = 100.0
memory_gib = 16.0
memory_bw_gbps = 1000.0
[node]
devices = 4
[[node.links]]
name = "link"
group = 4
bw_gbps = 100.0
[network]
injection_gbps = 50.0
)";

ModelSpec gpt(int l, int a, int h, int V = 51200) {
  ModelSpec m;
  m.cfg.n_layer = l;
  m.cfg.n_head = a;
  m.cfg.n_embd = h;
  m.cfg.vocab_size = V;
  m.cfg.block_size = 2048;
  return m;
}

}  // namespace

TEST(PerfCluster, EveryShippedFileLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(path("configs/clusters"))) {
    auto c = load_cluster(e.path());  // (a file `tessera probe` wrote here must load too)
    EXPECT_GT(std::max({c.peak_tflops_bf16, c.peak_tflops_fp16, c.peak_tflops_fp32}), 0);
    EXPECT_EQ(c.links.empty(), c.devices_per_node == 1) << e.path();
    // to_toml reads back to the same spec
    auto again = parse_cluster(to_toml(c), "again");
    EXPECT_EQ(again.devices_per_node, c.devices_per_node);
    EXPECT_NEAR(again.injection_gbps, c.injection_gbps, 1e-6);
    EXPECT_EQ(again.links.size(), c.links.size());
    ++n;
  }
  EXPECT_GE(n, 5);
  auto frontier = load_cluster(path("configs/clusters/frontier.toml"));
  EXPECT_EQ(frontier.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(frontier.memory_gib, 64);
  EXPECT_DOUBLE_EQ(frontier.peak_tflops_bf16, 191.5);
}

TEST(PerfCluster, BadFilesGiveClearErrors) {
  EXPECT_NE(error_of("name = 'x'").find("[device]: section missing"), std::string::npos);
  std::string s = k_small;
  EXPECT_EQ(error_of(s), "");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = s;
    t.replace(t.find(from), from.size(), to);
    return error_of(t);
  };
  EXPECT_NE(with("memory_gib = 16.0", "memory_gb = 16.0").find("unknown key"), std::string::npos);
  EXPECT_NE(with("memory_gib = 16.0", "memory_gib = \"lots\"").find("must be a number"),
            std::string::npos);
  EXPECT_NE(with("group = 4", "group = 3").find("group 3"), std::string::npos);
  EXPECT_NE(with("devices = 4", "devices = 0").find("devices must be in [1, 1048576] (got 0)"),
            std::string::npos);
  EXPECT_NE(with("devices = 4", "devices = 2147483647").find("devices must be in [1, 1048576]"),
            std::string::npos);
  EXPECT_NE(with("injection_gbps = 50.0", "injection_gbps = 0.0").find("injection_gbps"),
            std::string::npos);
  EXPECT_NE(with("devices = 4", "devices = 4\noverlap = 1.5").find("overlap must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(with("devices = 4", "devices = 4\ncompute_slots = 5").find("compute_slots must be"),
            std::string::npos);
  EXPECT_NE(error_of("name = [").find("TOML syntax error"), std::string::npos);
  EXPECT_THROW(load_cluster("configs/clusters/nope.toml"), tessera::Error);
  // no number of a cluster file may be infinite or nan, whichever section it is in
  for (const char* bad : {"inf", "-inf", "+inf", "nan"}) {
    EXPECT_NE(with("memory_gib = 16.0", fmt::format("memory_gib = {}", bad))
                  .find("'device.memory_gib' in bad.toml (line 6) must be a finite number"),
              std::string::npos)
        << bad;
    EXPECT_NE(with("bw_gbps = 100.0", fmt::format("bw_gbps = 100.0\nlatency_us = {}", bad))
                  .find("'node.links.latency_us'"),
              std::string::npos)
        << bad;
    EXPECT_NE(
        with("[node]", fmt::format("[gemm]\nhalf_dim = {}\n[node]", bad)).find("finite number"),
        std::string::npos)
        << bad;
    EXPECT_NE(with("injection_gbps = 50.0", fmt::format("injection_gbps = {}", bad))
                  .find("finite number"),
              std::string::npos)
        << bad;
  }
}

TEST(PerfModelSpec, FilesLoadAndParameterCountsMatchTheMegatronTable) {
  const std::pair<const char*, double> rows[] = {
      {"megatron-1.7b", 1.7},     {"megatron-3.6b", 3.6},     {"megatron-7.5b", 7.5},
      {"megatron-18.4b", 18.4},   {"megatron-39.1b", 39.1},   {"megatron-76.1b", 76.1},
      {"megatron-145.6b", 145.6}, {"megatron-310.1b", 310.1}, {"megatron-529.6b", 529.6},
      {"megatron-1t", 1008.0}};
  for (const auto& [name, billions] : rows) {
    auto m = load_model_spec(path(std::string("configs/models/") + name + ".toml"));
    EXPECT_NEAR(parameter_count(m.cfg) / 1e9, billions, 0.003 * billions + 0.05) << name;
  }
  auto g = load_model_spec(path("configs/models/gpt2-124m.toml"));
  EXPECT_NEAR(parameter_count(g.cfg) / 1e6, 124.4, 0.5);  // GPT-2 small, padded vocab 50304
  EXPECT_THROW(parse_model_spec("name = 'x'\nn_layer = 2\nn_head = 3\nn_embd = 64\n", "m"),
               tessera::Error);  // heads must divide the width
  EXPECT_THROW(parse_model_spec("name = 'x'\nn_layers = 2\n", "m"), tessera::Error);
}

TEST(PerfModel, FlopsAreNarayanansFormula) {
  auto m = gpt(128, 160, 25600);
  const double B = 3072, s = 2048, l = 128, h = 25600, V = 51200;
  const double base = B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(step_flops(m.cfg, 2048, 3072, Recompute::Full) / (96 * base), 1, 1e-12);
  // Without recomputation the layers cost 72/96 of that, the LM head (never recomputed) the same
  // 6 B s h V: "72 B s l h^2 (...)" would scale the head term too.
  const double none = 72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V;
  EXPECT_NEAR(step_flops(m.cfg, 2048, 3072, Recompute::None) / none, 1, 1e-12);
  const double sel = step_flops(m.cfg, 2048, 3072, Recompute::Selective);
  EXPECT_NEAR(sel - none, 4 * B * s * s * l * h, 1e-6 * sel);
}

TEST(PerfModel, ZeroModelStatesArePaperAccounting) {
  const double P = 1e9;
  for (int N : {1, 4, 64}) {
    auto sum = [&](int z) {
      auto b = model_state_bytes(P, N, z, DType::BF16);
      return b[0] + b[1] + b[2];
    };
    EXPECT_DOUBLE_EQ(sum(0), 16 * P);
    EXPECT_DOUBLE_EQ(sum(1), 4 * P + 12 * P / N);
    EXPECT_DOUBLE_EQ(sum(2), 2 * P + 14 * P / N);
    EXPECT_DOUBLE_EQ(sum(3), 16 * P / N);
  }
  auto f = model_state_bytes(P, 2, 0, DType::FP32);  // tessera's fp32 path: w, g, m, v
  EXPECT_DOUBLE_EQ(f[0] + f[1] + f[2], 16 * P);
}

TEST(PerfModel, ActivationsAreKorthikantisFormulas) {
  auto m = gpt(1, 32, 4096);
  const double s = 2048, b = 4, h = 4096, a = 32, t = 8;
  auto act = [&](GridShape g, Recompute r, bool sp, bool flash = false) {
    return layer_activation_bytes(m.cfg, 2048, 4, g, r, sp, flash, DType::BF16);
  };
  // Megatron's split is ty alone; sequence parallelism is tx alone (the trainer's 1D mode),
  // which without it replicates the attention and MLP regions over tx
  const GridShape one{}, tp{1, 1, 1, 8, 1}, tpx{1, 1, 8, 1, 1};
  EXPECT_NEAR(act(one, Recompute::None, false), s * b * h * (34 + 5 * a * s / h), 1);
  EXPECT_NEAR(act(tp, Recompute::None, false), s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), 1);
  EXPECT_NEAR(act(tpx, Recompute::None, true), s * b * h / t * (34 + 5 * a * s / h), 1);
  EXPECT_NEAR(act(tpx, Recompute::Selective, true), 34 * s * b * h / t, 1);
  EXPECT_NEAR(act(tpx, Recompute::None, false), s * b * h * (10 / t + 24 + 5 * a * s / h), 1);
  EXPECT_NEAR(act(one, Recompute::Full, false), 2 * s * b * h, 1);
  EXPECT_NEAR(act(one, Recompute::None, false, true), 34 * s * b * h, 1);  // flash attention
  // the batch is split over tz
  EXPECT_NEAR(act(GridShape{1, 1, 1, 1, 4}, Recompute::Full, false), 2 * s * b * h / 4, 1);
}

TEST(PerfModel, LlamaActivationsCountGroupedKvHeadsAndTheGatedMlp) {
  // Llama 3 8B's shape: h 4096, 32 query heads over 8 kv heads, F 14336, SwiGLU. The split
  // region keeps q 2 + k, v 2 * 8/32 each + attention output 2 + gate|up 4F/h + SwiGLU 2F/h
  // bytes per token and channel (2-byte elements): 4 + 1 + 6 * 3.5 = 26 (GPT-2's 24).
  tessera::model::ModelConfig cfg{32, 32, 4096, 8192, 128256};
  cfg.family = tessera::model::Family::Llama;
  cfg.n_kv_head = 8;
  cfg.intermediate_size = 14336;
  EXPECT_DOUBLE_EQ(split_region_activations(cfg), 26.0);
  EXPECT_DOUBLE_EQ(split_region_activations(gpt(1, 32, 4096).cfg), 24.0);
  const double s = 2048, b = 4, h = 4096, t = 8;
  const GridShape tp{1, 1, 1, 8, 1};
  EXPECT_NEAR(layer_activation_bytes(cfg, 2048, 4, tp, Recompute::None, false, true, DType::BF16),
              s * b * h * (10 + 26 / t), 1);
}

TEST(PerfModel, AxonnBandwidthLookupOnPerlmutter) {
  auto c = load_cluster(path("configs/clusters/perlmutter.toml"));
  auto gbps = [&](long ip, long my) { return group_link(c, ip, my).bw / 1e9; };
  // AxoNN's measured table (papers.md §2.4): ip=1: my=2 76, my>=8 80; ip=2, my>=4: 40;
  // ip>=4: 20. The model gives the same within 10%.
  EXPECT_NEAR(gbps(1, 2), 76, 7.6);
  EXPECT_NEAR(gbps(1, 8), 80, 8);
  EXPECT_NEAR(gbps(2, 4), 40, 4);
  EXPECT_NEAR(gbps(4, 4), 20, 2);
  EXPECT_NEAR(gbps(16, 4), 20, 2);
  EXPECT_FALSE(group_link(c, 1, 4).inter_node);
  EXPECT_TRUE(group_link(c, 4, 2).inter_node);
}

TEST(PerfModel, TensorCommunicationVolumesAreAxonns) {
  // AxoNN's comm model (papers.md §2.4) per step for one grid, without the ring factors: the
  // forward all-reduce over X of each linear's output (twice with recomputation), the backward
  // all-reduce over Y of its input gradient, 3 weight-block transfers over Z per micro-batch.
  auto m = gpt(4, 16, 2048);
  auto c = load_cluster(path("configs/clusters/perlmutter.toml"));
  const int Gc = 2, Gr = 4, Gd = 2, Gdata = 2, mb = 4;
  const long B = 64;
  Workload w{m.cfg, 2048, B};
  PlanPoint p;
  p.grid = GridShape{Gdata, 1, Gc, Gr, Gd};
  p.micro_batch = mb;
  p.recompute = Recompute::Full;
  auto r = predict(w, p, c);
  const double H = 2048, S = 2048, e = 2, L = 4;
  const double micro = static_cast<double>(B) / (Gdata * mb);
  const double rows = mb / static_cast<double>(Gd) * S;  // per micro-batch per device
  double col = 0, row = 0, depth = 0;
  struct Lin {
    double K;
    bool transposed;
  };
  for (Lin lin : {Lin{3, false}, Lin{1, true}, Lin{4, false}, Lin{4, true}}) {
    double in = lin.transposed ? lin.K * H : H, out = lin.transposed ? H : lin.K * H;
    double pi = lin.transposed ? Gr : Gc, po = lin.transposed ? Gc : Gr;
    // the forward all-reduce runs over the input axis, the backward over the output axis
    (lin.transposed ? row : col) += 2 * rows * out / po * e;
    (lin.transposed ? col : row) += rows * in / pi * e;
    depth += 3 * in * out / (Gc * Gr) * e;
  }
  EXPECT_NEAR(r.comm[static_cast<int>(Axis::TX)].bytes, micro * L * col, 1e-6 * micro * L * col);
  EXPECT_NEAR(r.comm[static_cast<int>(Axis::TY)].bytes, micro * L * row, 1e-6 * micro * L * row);
  EXPECT_NEAR(r.comm[static_cast<int>(Axis::TZ)].bytes, micro * L * depth,
              1e-6 * micro * L * depth);
}

TEST(PerfModel, TradeOffsGoTheRightWay) {
  auto m = gpt(32, 32, 4096);
  auto c = load_cluster(path("configs/clusters/selene.toml"));
  Workload w{m.cfg, 2048, 256};
  PlanPoint p;
  p.recompute = Recompute::Full;  // the point's former default
  p.grid = GridShape{4, 4, 1, 4, 1};
  p.micro_batch = 1;
  auto at = [&](auto&& change) {
    PlanPoint q = p;
    change(q);
    return predict(w, q, c);
  };
  auto none = at([](PlanPoint& q) { q.recompute = Recompute::None; });
  auto full = at([](PlanPoint& q) { q.recompute = Recompute::Full; });
  EXPECT_GT(full.step_s, none.step_s);
  EXPECT_LT(full.memory.activations, none.memory.activations);
  EXPECT_NEAR(full.hw_flops / none.hw_flops, 4.0 / 3, 0.05);
  auto f1b = at([](PlanPoint& q) { q.schedule = ScheduleKind::OneF1B; });
  auto gpipe = at([](PlanPoint& q) { q.schedule = ScheduleKind::GPipe; });
  auto inter = at([](PlanPoint& q) {
    q.schedule = ScheduleKind::Interleaved;
    q.virtual_stages = 2;
  });
  EXPECT_LT(inter.bubble_s, f1b.bubble_s);
  EXPECT_GT(gpipe.memory.activations, f1b.memory.activations);                  // m in flight vs pp
  EXPECT_NEAR(f1b.bubble_s / (f1b.pipeline_s - f1b.bubble_s), 3.0 / 64, 0.01);  // (p-1)/m
  // Without overlap (a CPU MPI library without a progress thread) every collective is exposed:
  // slower, by at most the communication time the overlap had hidden.
  {
    ClusterSpec serial = c;
    serial.overlap = 0;
    PlanPoint q = p;
    q.grid = GridShape{4, 2, 2, 2, 2};
    q.micro_batch = 2;
    const auto with = predict(w, q, c), without = predict(w, q, serial);
    EXPECT_GT(without.step_s, with.step_s);
    double comm = 0;
    for (const auto& a : with.comm) comm += a.seconds;
    // (the fill and drain of the pipeline add (pp-1)/m of a stage's exposure once more)
    EXPECT_LE(without.step_s - with.step_s, comm * (1 + 1.0 / with.micro_batches) + 1e-9);
    EXPECT_DOUBLE_EQ(parse_cluster(to_toml(serial), "again").overlap, 0.0);
  }
  auto z0 = at([](PlanPoint& q) { q.zero = 0; });
  auto z1 = at([](PlanPoint& q) { q.zero = 1; });
  EXPECT_LT(z1.memory.optimizer, z0.memory.optimizer / 3.9);
  // infeasible points are named
  PlanPoint bad = p;
  bad.grid.ty = 3;
  EXPECT_EQ(infeasible_reason(w, bad, c), "heads not divisible by ty");
  EXPECT_THROW(predict(w, bad, c), tessera::Error);
}

TEST(PerfModel, SharedCoresLetIdleStagesLendTheirCores) {
  // Four ranks on two cores (compute_slots = 2): the device rates are with every rank busy; a
  // pipeline stage runs faster while its neighbour idles in the fill and drain, and the node
  // cannot do more work than its cores.
  auto dedicated = parse_cluster(k_small, "small");
  ClusterSpec shared = dedicated;
  shared.compute_slots = 2;
  EXPECT_EQ(parse_cluster(to_toml(shared), "again").compute_slots, 2);
  EXPECT_DOUBLE_EQ(compute_share(shared, 4), 0.5);
  EXPECT_DOUBLE_EQ(compute_share(shared, 2), 1.0);  // two busy ranks, two cores
  EXPECT_DOUBLE_EQ(compute_share(dedicated, 4), 1.0);
  auto m = gpt(8, 16, 1024);
  Workload w{m.cfg, 512, 16};
  PlanPoint p;
  p.recompute = Recompute::Full;  // the point's former default
  p.grid = GridShape{1, 2, 2, 1, 1};
  p.micro_batch = 2;  // 8 micro-batches
  const auto ded = predict(w, p, dedicated), sh = predict(w, p, shared);
  EXPECT_LT(sh.step_s, ded.step_s);
  // the pipeline is the longer of the schedule at twice the rate and the mean stage's work
  double work = 0;
  for (const auto& st : ded.chunk_cost)
    for (const auto& cc : st) work += cc.fwd_compute + cc.fwd_comm + cc.bwd_compute + cc.bwd_comm;
  work = work * ded.micro_batches / p.grid.pp;
  EXPECT_GE(sh.pipeline_s, work * (1 - 1e-12));
  EXPECT_GE(sh.pipeline_s, 0.5 * ded.pipeline_s * (1 - 1e-12));
  EXPECT_LE(sh.pipeline_s, ded.pipeline_s);
  // without a pipeline every rank is busy all the time: nothing to lend
  PlanPoint q = p;
  q.grid = GridShape{2, 1, 2, 1, 1};
  q.micro_batch = 2;
  EXPECT_DOUBLE_EQ(predict(w, q, shared).step_s, predict(w, q, dedicated).step_s);
  // the simulator applies the same rule and still accounts every second of every rank
  auto sim = simulate(sh);
  EXPECT_NEAR(sim.step_s / sh.step_s, 1, 0.05);
  for (const auto& r : sim.ranks) EXPECT_NEAR(r.busy + r.comm + r.idle, sim.step_s, 1e-9);
}

TEST(PerfPlanner, EnumeratesRanksAndCountsRejections) {
  EXPECT_EQ(enumerate_grids(8).size(), 35u);  // ordered factorizations of 2^3 into 5 factors
  // divisors in increasing order up to the largest int (a prime), without overflow
  using tessera::parallel::divisors;
  EXPECT_EQ(divisors(1), std::vector<int>({1}));
  EXPECT_EQ(divisors(12), std::vector<int>({1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(divisors(49), std::vector<int>({1, 7, 49}));
  EXPECT_EQ(divisors(2147483647), std::vector<int>({1, 2147483647}));
  EXPECT_EQ(divisors(2147483646).size(), 192u);  // 2 x 3^2 x 7 x 11 x 31 x 151 x 331
  // 2^20 devices at most, and the grids of the largest are enumerated at once
  EXPECT_EQ(enumerate_grids(static_cast<int>(k_max_devices)).size(), 10626u);  // C(24, 4)
  auto m = load_model_spec(path("configs/models/gpt-22b.toml"));
  auto c = load_cluster(path("configs/clusters/frontier.toml"));
  Workload w{m.cfg, 2048, 256};
  PlanSearch s;
  s.devices = 64;
  s.top = 5;
  auto r = plan(w, c, s);
  ASSERT_EQ(r.best.size(), 5u);
  for (std::size_t i = 1; i < r.best.size(); ++i) EXPECT_LE(r.best[i - 1].step_s, r.best[i].step_s);
  long rejected = 0;
  for (const auto& [why, n] : r.rejected) rejected += n;
  EXPECT_EQ(r.considered, r.feasible + rejected);
  EXPECT_GT(r.rejected["out of memory"], 0);
  for (const auto& b : r.best) {
    EXPECT_TRUE(b.fits);
    EXPECT_EQ(b.point.grid.world_size(), 64);
  }
  // 22B does not fit on one 64 GB GCD
  s.devices = 1;
  EXPECT_TRUE(plan(w, c, s).best.empty());
  // searches it cannot run are refused before any work
  auto refused = [&](PlanSearch bad, const std::string& needle) {
    try {
      plan(w, c, bad);
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << needle;
  };
  PlanSearch big = s;
  big.devices = static_cast<int>(k_max_devices) + 1;
  refused(big, "--gpus 1048577 is more than the 1048576 devices");
  big.devices = 2147483647;
  refused(big, "--gpus 2147483647 is more than");
  PlanSearch no_mb = s;
  no_mb.max_micro_batch = 0;
  refused(no_mb, "--max-micro-batch must be >= 1 (got 0)");
  PlanSearch no_chunks = s;
  no_chunks.max_chunks = -1;
  refused(no_chunks, "--max-chunks must be >= 1 (got -1)");
  // a huge interleaving or micro-batch limit is searched as far as the model and batch allow
  PlanSearch wide = s;
  wide.devices = 64;
  wide.max_chunks = 2147483647;
  wide.max_micro_batch = 2147483647;
  EXPECT_FALSE(plan(w, c, wide).best.empty());
}

// The llama family in the performance model: the shipped model files load with their public
// parameter counts (GQA projections, SwiGLU, tied or untied heads; SmolLM2-135M to the parameter,
// as the layout counts it), FLOPs per step follow the shapes, and the planner ranks Llama 3
// 405B on 16,384 H100s (the search is instant) with key-value heads that ty must divide.
TEST(PerfPlanner, LlamaModelsAndTheirPlans) {
  const std::pair<const char*, double> rows[] = {{"smollm2-360m", 0.362}, {"smollm2-1.7b", 1.711},
                                                 {"llama3.2-1b", 1.236},  {"llama3-8b", 8.030},
                                                 {"llama3-70b", 70.554},  {"llama3-405b", 405.85},
                                                 {"mistral-7b", 7.242},   {"qwen2.5-0.5b", 0.494}};
  for (const auto& [name, billions] : rows) {
    auto m = load_model_spec(path(std::string("configs/models/") + name + ".toml"));
    EXPECT_TRUE(m.cfg.llama()) << name;
    EXPECT_NEAR(parameter_count(m.cfg) / 1e9, billions, 0.005 * billions) << name;
  }
  auto smol = load_model_spec(path("configs/models/smollm2-135m.toml"));
  EXPECT_EQ(parameter_count(smol.cfg), 134515008.0);
  // a step's FLOPs: 6 x (linear parameters) per token + attention, as for GPT-2
  const auto& c8 = load_model_spec(path("configs/models/llama3-8b.toml")).cfg;
  const double h = c8.n_embd, F = c8.ffn(), kv = c8.kv_heads() * c8.head_dim();
  const double linear = c8.n_layer * (h * (h + 2 * kv) + h * h + 3 * h * F) + h * c8.padded_vocab();
  const double want = 6 * linear * 8192 + 12 * c8.n_layer * 8192.0 * 8192.0 * h;
  EXPECT_NEAR(step_flops(c8, 8192, 1, Recompute::None) / want, 1.0, 1e-12);

  auto m = load_model_spec(path("configs/models/llama3-405b.toml"));
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  Workload w{m.cfg, 8192, 2048};
  PlanSearch s;
  s.devices = 16384;
  s.top = 3;
  auto r = plan(w, c, s);
  ASSERT_EQ(r.best.size(), 3u);
  EXPECT_GT(r.rejected["key-value heads not divisible by ty"], 0);
  for (const auto& b : r.best) {
    EXPECT_TRUE(b.fits);
    EXPECT_EQ(m.cfg.kv_heads() % b.point.grid.ty, 0);
  }
}

TEST(PerfSimulator, ReplayMatchesTheModelAndAccountsEverySecond) {
  auto m = gpt(32, 32, 4096);
  auto c = load_cluster(path("configs/clusters/selene.toml"));
  Workload w{m.cfg, 2048, 128};
  for (ScheduleKind k : {ScheduleKind::OneF1B, ScheduleKind::GPipe, ScheduleKind::Interleaved}) {
    PlanPoint p;
    p.recompute = Recompute::Full;  // the point's former default
    p.grid = GridShape{2, 4, 1, 2, 1};
    p.micro_batch = 2;
    p.schedule = k;
    p.virtual_stages = k == ScheduleKind::Interleaved ? 2 : 1;
    auto pred = predict(w, p, c);
    auto sim = simulate(pred);
    EXPECT_FALSE(sim.deadlock);
    ASSERT_EQ(sim.ranks.size(), 16u);
    // sends are non-blocking in the replay, the model serializes them: within 5%
    EXPECT_NEAR(sim.step_s / pred.step_s, 1, 0.05) << tessera::parallel::schedule_name(k);
    for (const auto& r : sim.ranks) EXPECT_NEAR(r.busy + r.comm + r.idle, sim.step_s, 1e-9);
    // the first stage waits least in 1F1B's warm-up; every stage idles (p-1)/m-ish
    EXPECT_GT(sim.stages.back().idle, 0);
  }
}

TEST(PerfSimulator, WritesAChromeTrace) {
  auto m = gpt(8, 16, 1024);
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  Workload w{m.cfg, 1024, 16};
  PlanPoint p;
  p.recompute = Recompute::Full;  // the point's former default
  p.grid = GridShape{1, 4, 1, 2, 1};
  p.micro_batch = 2;
  auto pred = predict(w, p, c);
  auto dir = tessera::test::fresh_scratch("perf_trace");
  TraceOptions t;
  t.path = dir / "trace.json";
  simulate(pred, t);
  auto j = nlohmann::json::parse(tessera::read_file(t.path));
  ASSERT_TRUE(j.contains("traceEvents"));
  int forwards = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "compute" && e["name"].get<std::string>()[0] == 'F')
      ++forwards;
  EXPECT_EQ(forwards, 4 * 8);  // every stage, every micro-batch
  std::filesystem::remove_all(dir);
}

TEST(PerfModel, PredictStepForTheTrainer) {
  auto m = gpt(12, 12, 768, 50257);
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  PlanPoint plan;
  plan.grid = GridShape{2, 1, 1, 1, 1};
  plan.micro_batch = 8;
  plan.micro_batches = 4;
  plan.zero = 1;
  auto e = predict_step(m.cfg, plan, c, 1024);
  EXPECT_TRUE(e.reason.empty()) << e.reason;
  EXPECT_TRUE(e.fits);
  EXPECT_GT(e.step_s, 0);
  EXPECT_GT(e.peak_bytes, 124e6 * 16 / 2);
  PlanPoint bad_plan;
  bad_plan.grid = GridShape{1, 1, 1, 5, 1};
  bad_plan.micro_batch = 8;
  auto bad = predict_step(m.cfg, bad_plan, c, 1024);
  EXPECT_FALSE(bad.reason.empty());
}

// bf16 as the CPU trainer keeps it (fp32 storage): the same memory as fp32 plus the weights' bf16
// copy (2 bytes per parameter of the rank, ZeRO or not), the rounded operands of the widest linear
// (input and output gradient, 2 x 2 bytes x n x 4h) and the logits' gradient rounded for the head
// (2 bytes x n x V), less 2 bytes per element of each layer's GEMM-only activations (ln1, ln2 and
// the MLP's activation, n x (2h + 4h), kept in bf16) plus one fp32 set of them for the layer being
// computed; with ZeRO-1 over 2 ranks the optimizer shard halves in both precisions.
TEST(PerfModel, Bf16WithFp32StorageAddsTheBf16CopiesOnly) {
  auto m = gpt(6, 12, 768, 50257);
  m.cfg.block_size = 128;  // the positions the layout holds: the sequence the model is given
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  const double n = 4 * 128, h = 768, V = m.cfg.padded_vocab();
  for (int dp : {1, 2}) {
    PlanPoint plan;
    plan.grid = GridShape{dp, 1, 1, 1, 1};
    plan.micro_batch = 4;
    plan.micro_batches = 1;
    plan.zero = dp > 1 ? 1 : 0;
    ModelOptions o;
    o.fp32_storage = true;
    o.dtype = DType::FP32;
    const auto fp32 = predict_step(m.cfg, plan, c, 128, o);
    o.dtype = DType::BF16;
    const auto bf16 = predict_step(m.cfg, plan, c, 128, o);
    const double P = static_cast<double>(tessera::model::ParamLayout(m.cfg).total());
    const double gemm_inputs = n * (2 * h + 4 * h), layers = 6;
    EXPECT_NEAR(bf16.peak_bytes - fp32.peak_bytes,
                2 * P + 2 * 2 * n * 4 * h + 2 * n * V + (4 - 2 * layers) * gemm_inputs, 1e3)
        << "dp " << dp;
    EXPECT_LT(bf16.step_s, fp32.step_s);  // the H100's bf16 rate is far above its fp32 rate
  }
}

// The pipeline's and the tensor axes' messages in bf16 as the CPU trainer sends them (fp32
// storage, each tensor rank its own block): half the bytes of every activation and gradient
// message on that axis, nothing else changed.
TEST(PerfModel, Bf16WiresHalveThePipelineAndTensorBytes) {
  auto m = gpt(8, 12, 768, 50257);
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  Workload w{m.cfg, 1024, 16};
  PlanPoint p;
  p.grid = GridShape{1, 2, 2, 1, 1};
  p.micro_batch = 2;
  ModelOptions o;
  o.fp32_storage = true;
  o.pp_scatter_gather = false;
  const auto fp32 = predict(w, p, c, o);
  o.bf16_pipeline = true;
  const auto bf16 = predict(w, p, c, o);
  const int pp = static_cast<int>(Axis::PP);
  EXPECT_GT(fp32.comm[pp].bytes, 0);
  EXPECT_DOUBLE_EQ(bf16.comm[pp].bytes, fp32.comm[pp].bytes / 2);
  EXPECT_LT(bf16.p2p_s, fp32.p2p_s);
  EXPECT_DOUBLE_EQ(bf16.memory.total(), fp32.memory.total());
  const int tx = static_cast<int>(Axis::TX);
  EXPECT_DOUBLE_EQ(bf16.comm[tx].bytes, fp32.comm[tx].bytes);  // the pipeline's only
  o.bf16_tensor = true;
  const auto both = predict(w, p, c, o);
  EXPECT_GT(fp32.comm[tx].bytes, 0);
  EXPECT_NEAR(both.comm[tx].bytes, fp32.comm[tx].bytes / 2, 1e-6 * fp32.comm[tx].bytes);
  EXPECT_DOUBLE_EQ(both.comm[pp].bytes, bf16.comm[pp].bytes);
}

TEST(PerfModel, ModelStatesMatchTheTrainersLayoutAndZeroStages) {
  // fp32 (tessera's CPU path): 4 bytes each of parameters, gradients, and 8 of AdamW moments, per
  // element of the real parameter layout; ZeRO shards them over dp like DataParallel does.
  auto m = gpt(6, 12, 768, 50257);
  m.cfg.block_size = 128;
  const double P = static_cast<double>(tessera::model::ParamLayout(m.cfg).total());
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  ModelOptions o;
  o.dtype = DType::FP32;
  for (int dp : {1, 2, 4})
    for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
      Workload w{m.cfg, 128, 4L * dp};
      PlanPoint p;
      p.grid = GridShape{dp, 1, 1, 1, 1};
      p.micro_batch = 4;
      p.zero = zero;
      p.recompute = Recompute::None;
      auto r = predict(w, p, c, o);
      EXPECT_NEAR(r.memory.params, 4 * P / (zero == 3 ? dp : 1), 1) << dp << " " << zero;
      EXPECT_NEAR(r.memory.grads, 4 * P / (zero >= 2 ? dp : 1), 1) << dp << " " << zero;
      EXPECT_NEAR(r.memory.optimizer, 8 * P / (zero >= 1 ? dp : 1), 1) << dp << " " << zero;
    }
}

// The probe's GEMM curve: recovered from samples that follow it, and not pulled off by one sample
// far below it (a short timing hit by a thread wake-up on a shared machine).
TEST(PerfProbe, GemmCurveFitIgnoresOutliers) {
  const double peak = 150, e = 0.9, h = 40;
  std::vector<tessera::perf::GemmSample> s;
  for (long M : {64L, 256L, 1024L, 4096L})
    for (long N : {256L, 768L, 3072L}) {
      const double eff = e * M / (M + h) * N / (N + h) * 768 / (768 + h);
      s.push_back({M, N, 768, peak * eff / 0.9});  // the best sample sets the peak
    }
  // (the peak is the best sample, so the curve cannot pass through every point exactly)
  ClusterSpec c;
  const double rms = tessera::perf::fit_gemm_curve(s, c);
  EXPECT_LT(rms, 0.05);
  EXPECT_NEAR(c.gemm_half_dim, h, 12);
  auto bad = s;
  bad[0].gflops = bad[0].gflops / 20;  // one short timing gone wrong
  ClusterSpec c2;
  EXPECT_LT(tessera::perf::fit_gemm_curve(bad, c2), 0.05);
  EXPECT_NEAR(c2.gemm_half_dim, c.gemm_half_dim, 4);
  EXPECT_NEAR(c2.gemm_max_efficiency, c.gemm_max_efficiency, 0.02);
  // two (a process's first GEMMs, slow to start): both dropped, the same curve
  bad[1].gflops = bad[1].gflops / 3;
  ClusterSpec c3;
  EXPECT_LT(tessera::perf::fit_gemm_curve(bad, c3), 0.05);
  EXPECT_NEAR(c3.gemm_half_dim, c.gemm_half_dim, 4);
  EXPECT_NEAR(c3.gemm_max_efficiency, c.gemm_max_efficiency, 0.02);
  // at most a quarter of the samples go: a curve that fits nothing is not rescued by dropping
  auto noisy = s;
  for (std::size_t i = 0; i < noisy.size(); i += 2) noisy[i].gflops /= 4;
  ClusterSpec c4;
  EXPECT_GT(tessera::perf::fit_gemm_curve(noisy, c4), 0.1);
}

// Sequence parallelism as the trainer runs it (tx alone): the attention core and the GELU, and
// their activations, split by sequences over tx; the collectives become reduce-scatters and
// all-gathers (the forward moves less, the backward more); FLOPs are unchanged.
TEST(PerfModel, SequenceParallelismSplitsTheTxReplicatedRegions) {
  auto m = gpt(8, 16, 2048);
  auto c = load_cluster(path("configs/clusters/dgx-h100.toml"));
  Workload w{m.cfg, 2048, 32};
  PlanPoint p;
  p.grid = GridShape{1, 1, 4, 1, 1};
  p.micro_batch = 4;
  p.recompute = Recompute::None;
  const auto off = predict(w, p, c);
  p.sequence_parallel = true;
  const auto on = predict(w, p, c);
  EXPECT_LT(on.compute_s, off.compute_s);
  EXPECT_LT(on.memory.activations, off.memory.activations / 2);
  EXPECT_DOUBLE_EQ(on.hw_flops, off.hw_flops);
  EXPECT_GT(on.comm[static_cast<int>(tessera::comm::Axis::TX)].bytes, 0);
  // not on ty
  p.grid = GridShape{1, 1, 1, 4, 1};
  EXPECT_EQ(infeasible_reason(w, p, c), "sequence parallelism needs tx > 1 alone");
}
