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
  if (dp < 1) return tc.batch_size;  // plan_problems refuses the grid
  if (tc.global_batch > 0 && tc.global_batch % (accum * dp) != 0)
    throw Error(
        fmt::format(
            "train.global_batch={} is not divisible by grad_accum x parallel.dp = {} x {} = {}",
            tc.global_batch, accum, dp, accum * dp),
        "choose a global batch that splits evenly into micro-batches over the data-parallel ranks");
  return tc.global_batch > 0 ? tc.global_batch / (accum * dp) : tc.batch_size;
}

// The job's ranks must be the grid's.
void check_world_size(const comm::GridShape& g, int world_size) {
  if (g.dp < 1 || g.pp < 1 || g.tx < 1 || g.ty < 1 || g.tz < 1) return;  // plan_problems says
  const std::int64_t n = static_cast<std::int64_t>(g.dp) * g.pp * g.tx * g.ty * g.tz;
  if (n != world_size)
    throw Error(fmt::format("grid {} has {} ranks but the job has {}", g.describe(), n, world_size),
                "make the product of parallel.dp, pp, tx, ty, tz equal the number of MPI ranks");
}

// Options the plan ignores, noted.
void note_ignored(const ParallelSection& pc, const parallel::ParallelPlan& p) {
  if (p.grid.pp == 1 && (!pc.pp_layers.empty() || pc.virtual_stages > 1 || pc.schedule != "1f1b"))
    log_info(
        "note: parallel.schedule, virtual_stages and pp_layers apply to pipeline "
        "parallelism (parallel.pp > 1); ignored");
}

}  // namespace

parallel::ParallelPlan parallel_plan(const RunConfig& cfg, int micro_batch) {
  const auto& pc = cfg.parallel;
  parallel::ParallelPlan p;
  p.grid = comm::GridShape{pc.dp, pc.pp, pc.tx, pc.ty, pc.tz};
  p.zero = pc.zero;
  p.micro_batch = micro_batch;
  p.micro_batches = cfg.train.grad_accum;
  if (pc.pp > 1) {
    p.schedule = parallel::parse_schedule(pc.schedule);
    p.virtual_stages = pc.virtual_stages;
    p.layer_split = parallel::parse_layer_counts(pc.pp_layers);
  }
  p.recompute = pc.recompute ? parallel::Recompute::Full : parallel::Recompute::None;
  p.sequence_parallel = pc.sequence_parallel;
  p.overlap_dx = pc.overlap_dx;
  p.defer_dw = pc.overlap_dw;
  p.prefetch = pc.prefetch;
  p.overlap_dp = pc.overlap;
  return p;
}

RunPlan plan_run(const RunConfig& cfg, const model::ModelConfig& mcfg, int world_size) {
  const auto& pc = cfg.parallel;
  RunPlan plan;
  plan.T = cfg.train.seq_len;
  if (cfg.train.grad_accum < 1)
    throw Error(fmt::format("train.grad_accum={} must be >= 1", cfg.train.grad_accum),
                "grad_accum is the number of micro-batches per optimizer step (1 = none)");
  plan.par = parallel_plan(cfg, micro_batch_sequences(cfg.train, pc.dp));
  // What the model and the grid cannot do is said first: it holds however the run is launched.
  if (auto why = parallel::plan_infeasible_reason(mcfg, plan.par))
    throw Error(why->message, why->hint);
  check_world_size(plan.par.grid, world_size);
  if (plan.pipeline()) plan.par.layer_split = parallel::plan_layer_split(mcfg, plan.par);
  note_ignored(pc, plan.par);
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

void check_device_options(const RunConfig& cfg, const RunPlan& plan) {
  if (cfg.hardware.device != "cuda") return;
  const auto& g = plan.grid();
  if (g.world_size() != g.dp || plan.par.zero != 0)
    throw Error(fmt::format("hardware.device = \"cuda\" runs data parallelism with replicated "
                            "optimizer state so far; this run has grid {}, ZeRO-{}",
                            g.describe(), plan.par.zero),
                "set every parallel axis but dp to 1 and parallel.zero = 0, or train on the CPU "
                "(hardware.device = \"cpu\") for tensor and pipeline parallelism and ZeRO");
  if (plan.par.recompute != parallel::Recompute::None)
    throw Error("parallel.recompute is a CPU option so far; the GPU step keeps every activation",
                "remove parallel.recompute, or train on the CPU (hardware.device = \"cpu\")");
  if (cfg.parallel.grad_reduce != "fp32")
    throw Error("parallel.grad_reduce = \"" + cfg.parallel.grad_reduce +
                    "\" is a CPU option; on GPUs the gradients are summed in fp32",
                "remove parallel.grad_reduce");
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
