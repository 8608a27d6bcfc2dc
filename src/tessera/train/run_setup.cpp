#include "tessera/train/run_setup.hpp"

#include "tessera/comm/runtime.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/kernels/cuda/device.hpp"
#include "tessera/parallel/pipeline.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

namespace {

// train.global_batch (if set) fixes the sequences per step over all dp ranks; the micro-batch
// of one rank follows from it and must come out whole.
int micro_batch_sequences(const TrainSection& tc, int dp) {
  const int accum = tc.grad_accum;
  if (tc.global_batch > 0 && tc.global_batch % (accum * dp) != 0)
    throw Error(
        fmt::format(
            "train.global_batch={} is not divisible by grad_accum x parallel.dp = {} x {} = {}",
            tc.global_batch, accum, dp, accum * dp),
        "choose a global batch that splits evenly into micro-batches over the data-parallel ranks");
  return tc.global_batch > 0 ? tc.global_batch / (accum * dp) : tc.batch_size;
}

void validate_grid(const RunConfig& cfg, const model::ModelConfig& mcfg, const RunPlan& plan,
                   int world_size) {
  comm::GridRequirements req;
  req.world_size = world_size;
  req.n_layer = mcfg.n_layer;
  req.n_head = mcfg.n_head;
  req.n_embd = mcfg.n_embd;
  req.vocab_size = mcfg.vocab_size;
  req.batch_size = plan.B;
  req.grad_accum = plan.accum;
  req.global_batch = cfg.train.global_batch;
  comm::validate_grid(plan.grid, req);
}

// Pipeline parallelism: the schedule runs train.grad_accum micro-batches per step. Returns the
// layers of each chunk.
std::vector<int> check_pipeline(const ParallelSection& pc, const parallel::ScheduleSpec& sched,
                                int accum, int n_layer) {
  if (pc.zero >= 2)
    throw Error(
        fmt::format("parallel.zero={} with parallel.pp={}: ZeRO-2 and -3 reduce or gather each "
                    "layer's block once per forward/backward sweep, and a pipeline schedule "
                    "interleaves the sweeps of its micro-batches",
                    pc.zero, pc.pp),
        "use parallel.zero = 1 (the AdamW moments, the largest state, sharded over dp) or 0");
  if (sched.kind == parallel::ScheduleKind::Interleaved && accum % pc.pp != 0)
    throw Error(fmt::format("the interleaved schedule needs the micro-batches per step "
                            "(train.grad_accum={}) divisible by parallel.pp={}",
                            accum, pc.pp),
                fmt::format("use train.grad_accum = {}, or schedule = \"1f1b\"",
                            (accum / pc.pp + 1) * pc.pp));
  parallel::validate(sched);
  return parallel::parse_layer_split(pc.pp_layers, n_layer, pc.pp * pc.virtual_stages);
}

}  // namespace

RunPlan plan_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size) {
  const auto& pc = cfg.parallel;
  RunPlan plan;
  plan.T = cfg.train.seq_len;
  plan.accum = cfg.train.grad_accum;
  plan.B = micro_batch_sequences(cfg.train, pc.dp);
  plan.grid = comm::GridShape{pc.dp, pc.pp, pc.tx, pc.ty, pc.tz};
  validate_grid(cfg, mcfg, plan, world_size);
  plan.pipeline = pc.pp > 1;
  plan.sched = parallel::ScheduleSpec{parallel::parse_schedule(pc.schedule), pc.pp, plan.accum,
                                      pc.virtual_stages};
  if (plan.pipeline) {
    plan.layer_split = check_pipeline(pc, plan.sched, plan.accum, mcfg.n_layer);
  } else if (!pc.pp_layers.empty() || pc.virtual_stages > 1 || pc.schedule != "1f1b") {
    log_info(
        "note: parallel.schedule, virtual_stages and pp_layers apply to pipeline "
        "parallelism (parallel.pp > 1); ignored");
  }
  plan.tensor_size = pc.tx * pc.ty * pc.tz;
  if (plan.B % pc.tz != 0)
    throw Error(fmt::format("the micro-batch of {} sequences is not divisible by parallel.tz={}",
                            plan.B, pc.tz),
                "tz splits each micro-batch by whole sequences: choose train.batch_size (or "
                "global_batch) so that it is");
  return plan;
}

PredictionCluster find_prediction_cluster(const RunConfig& cfg) {
  PredictionCluster cluster{cfg.hardware.cluster, std::nullopt};
  if (!cluster.path.empty()) {
    cluster.spec = perf::load_cluster(cluster.path);  // throws tessera::Error naming the file
  } else if (fs::exists("configs/clusters/this-machine.toml")) {
    cluster.path = "configs/clusters/this-machine.toml";
    try {
      cluster.spec = perf::load_cluster(cluster.path);
    } catch (const Error& e) {
      log_info("(no performance-model prediction: {})", e.what());
    }
  }
  return cluster;
}

void check_tensor_options(const RunConfig& cfg, const RunPlan& plan) {
  // Tensor parallelism: each rank trains its slices of the model, held in a flat buffer with a
  // local layout; data parallelism and ZeRO then work on that buffer over the dp group.
  const auto& pc = cfg.parallel;
  if (pc.sequence_parallel && (pc.tx < 2 || pc.ty != 1 || pc.tz != 1))
    throw Error(
        fmt::format("parallel.sequence_parallel needs 1D tensor parallelism over tx (tx > 1, "
                    "ty = tz = 1); the grid is {}",
                    plan.grid.describe()),
        "set parallel.sequence_parallel = false, or use parallel.tx alone");
  if (pc.sequence_parallel && plan.B % pc.tx != 0)
    throw Error(fmt::format("sequence parallelism splits the micro-batch of {} sequences over "
                            "parallel.tx={}: it is not divisible",
                            plan.B, pc.tx),
                "choose a micro-batch divisible by parallel.tx");
  if (pc.recompute && plan.tensor_size == 1 && !plan.pipeline)
    log_info(
        "note: parallel.recompute applies to tensor and pipeline parallelism (tx, ty, tz or pp > "
        "1); ignored");
}

void check_device_options(const RunConfig& cfg, const RunPlan& plan, int world_size) {
  if (cfg.hardware.device != "cuda") return;
  if (world_size != 1 || plan.grid.world_size() != 1)
    throw Error(fmt::format("hardware.device = \"cuda\" trains in one process on one GPU so far; "
                            "this run has {} ranks, grid {}",
                            world_size, plan.grid.describe()),
                "run one process with every parallel axis at 1, or train on the CPU "
                "(hardware.device = \"cpu\") for data, tensor and pipeline parallelism");
  if (kernels::cuda::device_count() == 0)
    throw Error("hardware.device = \"cuda\", but there is no usable GPU: " +
                    kernels::cuda::describe_devices(),
                "run on a machine with an NVIDIA GPU and driver, or set hardware.device = \"cpu\"");
}

RunDirLock claim_out_dir(const fs::path& out, const TrainOptions& opt, comm::Runtime& rt) {
  TESSERA_CHECK(!(opt.resume && opt.overwrite), "resume and overwrite both set");
  enum : int { Ok, Busy, HoldsRun, Failed };
  int state = Ok;
  RunDirLock lock;
  std::optional<Error> failure;
  if (rt.world_rank() == 0) {
    try {
      lock = RunDirLock(out);
      state = !lock.locked()                                    ? Busy
              : !opt.resume && !opt.overwrite && holds_run(out) ? HoldsRun
                                                                : Ok;
    } catch (const Error& e) {
      failure = e;
      state = Failed;
    }
  }
  rt.world().broadcast_bytes(&state, sizeof state, 0);
  if (failure) throw *failure;
  if (state == Failed) throw Error(fmt::format("cannot use train.out_dir {}", out.string()));
  if (state == Busy)
    throw Error(fmt::format("train.out_dir {} is in use by another tessera run", out.string()),
                "wait for that run to end, or choose another train.out_dir");
  if (state == HoldsRun) {
    const auto latest = io::latest_checkpoint(out / "checkpoints");
    throw Error(fmt::format("train.out_dir {} holds an earlier run{}", out.string(),
                            latest ? fmt::format(" (newest checkpoint {})", latest->string())
                                   : std::string()),
                "continue it with --resume, start afresh with --overwrite (deletes its "
                "checkpoints and metrics), or choose another train.out_dir");
  }
  return lock;
}

void check_training_fits(const model::ParamLayout& layout, int model_split, int zero, int dp) {
  const double whole = static_cast<double>(layout.total()), p = whole / model_split, n = dp;
  const double state = zero == 0   ? 16 * p
                       : zero == 1 ? 8 * p + 8 * p / n
                       : zero == 2 ? 4 * p + 12 * p / n
                                   : 16 * p / n;
  check_fits_in_memory(
      state + 4 * whole,
      fmt::format("training {} (ZeRO stage {}, dp {})", model::describe(layout.config()), zero, dp),
      "use a smaller model, or shard it over more ranks (parallel.dp with "
      "parallel.zero, or tensor parallelism)");
}

}  // namespace tessera::train
