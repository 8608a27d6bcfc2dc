#include "tessera/train/trainer.hpp"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/log.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/data/bpe.hpp"
#include "tessera/data/loader.hpp"
#include "tessera/eval/evaluate.hpp"
#include "tessera/eval/generate.hpp"
#include "tessera/io/checkpoint.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/optim/adamw.hpp"
#include "tessera/parallel/data_parallel.hpp"
#include "tessera/parallel/pipeline.hpp"
#include "tessera/parallel/tensor_model.hpp"
#include "tessera/perf/cluster.hpp"
#include "tessera/perf/model.hpp"
#include "tessera/train/goldfish.hpp"
#include "tessera/train/metrics_log.hpp"
#include "tessera/train/peak.hpp"
#include "tessera/train/run_dir.hpp"

namespace tessera::train {

namespace fs = std::filesystem;

model::ModelConfig model_config(const RunConfig& cfg) {
  model::ModelConfig m;
  m.n_layer = cfg.model.n_layer;
  m.n_head = cfg.model.n_head;
  m.n_embd = cfg.model.n_embd;
  m.block_size = cfg.model.block_size;
  m.vocab_size = cfg.model.vocab_size;
  model::validate(m);
  return m;
}

namespace {

std::string fmt_duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{:.0f}m{:02.0f}s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f}h{:02.0f}m", std::floor(s / 3600), std::fmod(s / 60, 60));
}

void print_sample(const RunConfig& cfg, const model::ParamLayout& layout, const float* params,
                  Rng& rng, std::int64_t step) {
  if (cfg.sample.tokens <= 0) return;
  fs::path tok_dir = cfg.data.tokenizer;
  if (!fs::exists(tok_dir / "encoder.json")) {
    log_info("(no sample: tokenizer files not found in {})", tok_dir.string());
    return;
  }
  auto tok = data::Tokenizer::load_gpt2(tok_dir);
  std::vector<std::int32_t> prompt;
  for (auto id : tok.encode(cfg.sample.prompt)) prompt.push_back(static_cast<std::int32_t>(id));
  if (prompt.empty()) prompt.push_back(static_cast<std::int32_t>(tok.eot_id()));
  eval::SampleOptions so;
  so.max_new_tokens = cfg.sample.tokens;
  so.temperature = static_cast<float>(cfg.sample.temperature);
  so.top_k = cfg.sample.top_k;
  auto out = eval::generate(layout, params, prompt, so, rng);
  std::vector<std::uint32_t> ids;
  for (auto t : out)
    if (t < static_cast<std::int32_t>(tok.vocab_size()))
      ids.push_back(static_cast<std::uint32_t>(t));
  log_info("---- sample at step {} ----\n{}{}\n----", step, cfg.sample.prompt, tok.decode(ids));
}

// Takes the lock of train.out_dir (the lead rank; every rank gets its answer), and refuses a fresh
// run into a directory holding a run unless told to overwrite it.
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

// Refuses, before allocating, a run whose weights, gradients and AdamW moments cannot fit in
// this machine: 16 bytes per parameter of this rank's slice (the model split over `model_split`
// tensor and pipeline ranks), less what ZeRO shards over dp, plus one whole-model copy (4 bytes
// per parameter) at initialization and resumption.
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

// Resuming with another data shard, seed, sequence length or number of sequences per step
// changes the data order: allowed (e.g. a larger batch later in training), but said.
void warn_if_resumed_differently(const RunConfig& cfg, const io::TrainState& st,
                                 std::int64_t sequences_per_step) {
  auto it = st.extra.find("config");
  if (it == st.extra.end()) return;
  RunConfig old;
  try {
    old = parse_run_config(it->second, "the checkpoint's config");
  } catch (const Error&) {
    return;  // written by another version: nothing to compare with
  }
  const auto& ot = old.train;
  const std::int64_t old_seqs = ot.global_batch > 0
                                    ? ot.global_batch
                                    : std::int64_t{ot.batch_size} * ot.grad_accum * old.parallel.dp;
  auto warn = [](const char* what, const auto& now, const auto& then) {
    if (now != then)
      log_info(
          "warning: resuming with {} = {}, but the checkpoint was trained with {}: the data "
          "order differs from an uninterrupted run",
          what, now, then);
  };
  warn("data.train", cfg.data.train, old.data.train);
  warn("train.seed", cfg.train.seed, ot.seed);
  warn("train.seq_len", cfg.train.seq_len, ot.seq_len);
  warn("sequences per step", sequences_per_step, old_seqs);
}

}  // namespace

TrainSummary run_training(const RunConfig& cfg, const TrainOptions& opt_in, comm::Runtime& rt,
                          bool* started) {
  const auto& tc = cfg.train;
  if (tc.threads > 0) omp_set_num_threads(tc.threads);
  const model::ModelConfig mcfg = model_config(cfg);
  check_out_dir(tc.out_dir);  // a file there is bad input, found before any output
  const model::ParamLayout layout(mcfg);
  const int T = tc.seq_len, accum = tc.grad_accum;
  // train.global_batch (if set) fixes the sequences per step over all dp ranks; the micro-batch
  // of one rank follows from it and must come out whole.
  if (tc.global_batch > 0 && tc.global_batch % (accum * cfg.parallel.dp) != 0)
    throw Error(
        fmt::format(
            "train.global_batch={} is not divisible by grad_accum x parallel.dp = {} x {} = {}",
            tc.global_batch, accum, cfg.parallel.dp, accum * cfg.parallel.dp),
        "choose a global batch that splits evenly into micro-batches over the data-parallel ranks");
  const int B = tc.global_batch > 0 ? tc.global_batch / (accum * cfg.parallel.dp) : tc.batch_size;
  const auto gemm = kernels::GemmLibrary::OneDnn;

  // The grid, validated before anything else happens.
  const auto& pc = cfg.parallel;
  comm::GridShape shape{pc.dp, pc.pp, pc.tx, pc.ty, pc.tz};
  comm::GridRequirements req;
  req.world_size = rt.world_size();
  req.n_layer = mcfg.n_layer;
  req.n_head = mcfg.n_head;
  req.n_embd = mcfg.n_embd;
  req.vocab_size = mcfg.vocab_size;
  req.batch_size = B;
  req.grad_accum = accum;
  req.global_batch = tc.global_batch;
  comm::validate_grid(shape, req);
  // Pipeline parallelism: the schedule runs train.grad_accum micro-batches per step.
  const bool pipeline = pc.pp > 1;
  const parallel::ScheduleSpec sched{parallel::parse_schedule(pc.schedule), pc.pp, accum,
                                     pc.virtual_stages};
  std::vector<int> layer_split;
  if (pipeline) {
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
    layer_split =
        parallel::parse_layer_split(pc.pp_layers, mcfg.n_layer, pc.pp * pc.virtual_stages);
  } else if (!pc.pp_layers.empty() || pc.virtual_stages > 1 || pc.schedule != "1f1b") {
    log_info(
        "note: parallel.schedule, virtual_stages and pp_layers apply to pipeline "
        "parallelism (parallel.pp > 1); ignored");
  }
  const int tensor_size = pc.tx * pc.ty * pc.tz;
  if (B % pc.tz != 0)
    throw Error(
        fmt::format("the micro-batch of {} sequences is not divisible by parallel.tz={}", B, pc.tz),
        "tz splits each micro-batch by whole sequences: choose train.batch_size (or "
        "global_batch) so that it is");
  // The cluster file of the performance model: an explicit one must load (checked before any
  // work); the default one (written by `tessera probe`) is used when present and readable.
  fs::path cluster_path = cfg.hardware.cluster;
  std::optional<perf::ClusterSpec> cluster_spec;
  if (!cluster_path.empty()) {
    cluster_spec = perf::load_cluster(cluster_path);  // throws tessera::Error naming the file
  } else if (fs::exists("configs/clusters/this-machine.toml")) {
    cluster_path = "configs/clusters/this-machine.toml";
    try {
      cluster_spec = perf::load_cluster(cluster_path);
    } catch (const Error& e) {
      log_info("(no performance-model prediction: {})", e.what());
    }
  }
  comm::Topology topo(shape, rt.world_rank());
  // Tensor parallelism: each rank trains its slices of the model, held in a flat buffer with a
  // local layout; data parallelism and ZeRO then work on that buffer over the dp group.
  if (pc.sequence_parallel && (pc.tx < 2 || pc.ty != 1 || pc.tz != 1))
    throw Error(
        fmt::format("parallel.sequence_parallel needs 1D tensor parallelism over tx (tx > 1, "
                    "ty = tz = 1); the grid is {}",
                    shape.describe()),
        "set parallel.sequence_parallel = false, or use parallel.tx alone");
  if (pc.sequence_parallel && B % pc.tx != 0)
    throw Error(fmt::format("sequence parallelism splits the micro-batch of {} sequences over "
                            "parallel.tx={}: it is not divisible",
                            B, pc.tx),
                "choose a micro-batch divisible by parallel.tx");
  if (pc.recompute && tensor_size == 1 && !pipeline)
    log_info(
        "note: parallel.recompute applies to tensor and pipeline parallelism (tx, ty, tz or pp > "
        "1); ignored");
  // The run directory: checked and locked before any output; the old run's files (with
  // --overwrite) are deleted only once everything else has been checked.
  const fs::path out = tc.out_dir;
  const RunDirLock out_lock = claim_out_dir(out, opt_in, rt);
  check_training_fits(layout, tensor_size * pc.pp, pc.zero, pc.dp);
  std::unique_ptr<parallel::TensorModel> tm;
  std::unique_ptr<parallel::PipelineExecutor> pipe;
  comm::Communicator* pipe_comm = nullptr;  // {pp}
  if (tensor_size > 1 || pipeline) {
    parallel::TensorModelOptions to;
    if (pipeline)
      to.chunks =
          parallel::stage_chunks(layer_split, pc.pp, pc.virtual_stages, topo.coord(comm::Axis::PP));
    to.recompute = pc.recompute;
    to.sequence_parallel = pc.sequence_parallel;
    to.overlap_dx = pc.overlap_dx;
    to.defer_dw = pc.overlap_dw;
    to.prefetch = pc.prefetch;
    to.tune_gemm = cfg.hardware.tune_gemm;
    to.gemm_tuning_file = cfg.hardware.gemm_tuning_file;
    tm = std::make_unique<parallel::TensorModel>(mcfg, topo, rt, to);
    if (pipeline) {
      pipe_comm = &rt.group(topo, {comm::Axis::PP});
      pipe = std::make_unique<parallel::PipelineExecutor>(*tm, *pipe_comm, sched);
    }
  }
  const model::ParamLayout& store_layout = tm ? tm->local_layout() : layout;
  comm::Communicator& dp_comm = rt.group(topo, {comm::Axis::DP});
  parallel::DataParallel dp(dp_comm, store_layout, pc.zero, pc.overlap);
  Buffer<float> global_tmp;  // tensor parallelism: the whole model assembled from the slices
  // The whole model's parameters (collective under tensor parallelism and at ZeRO-3).
  auto full_params = [&]() -> const float* {
    if (!tm) return dp.full_params();
    global_tmp.resize(layout.total());
    tm->gather_full(dp.full_params(), global_tmp.data());
    return global_tmp.data();
  };
  // The assembled whole model is not kept between uses (it is the size of the whole model on
  // every rank).
  auto drop_full = [&] { global_tmp = Buffer<float>(); };
  const bool lead = rt.world_rank() == 0;  // logs, metrics, checkpoints, samples
  TrainOptions opt = opt_in;
  if (!lead) opt.quiet = true;
  const int ndp = dp.dp_size();

  // Data first: a missing shard should fail before any allocation or output.
  data::TokenLoader train_loader(cfg.data.train, B, T, static_cast<std::size_t>(dp.dp_rank()),
                                 static_cast<std::size_t>(ndp));
  std::unique_ptr<data::TokenLoader> val_loader;
  if (tc.val_every > 0) val_loader = std::make_unique<data::TokenLoader>(cfg.data.val, B, T);
  // Every token id of both shards, before any step: a bad id in the validation shard must not
  // end the run at its first validation.
  train_loader.check_ids(static_cast<std::uint32_t>(mcfg.vocab_size));
  if (val_loader) val_loader->check_ids(static_cast<std::uint32_t>(mcfg.vocab_size));

  const fs::path ckpt_dir = out / "checkpoints";

  model::Activations acts;
  Rng rng(tc.seed);
  std::int64_t step = 0, tokens_seen = 0;
  bool resumed = false;
  if (opt.resume) {
    if (auto latest = io::latest_checkpoint(ckpt_dir)) {
      // Checkpoints hold the full state; each rank keeps its shard (any dp size or stage loads).
      // Each rank reads the parameters and the moments of its own range, from whichever shards
      // of the checkpoint hold them: any dp size and stage resumes any other.
      io::TrainState st;
      if (tm) {
        // Tensor parallelism: read the whole state and keep this rank's slices of it.
        Buffer<float> p_full(layout.total()), m_full(layout.total()), v_full(layout.total());
        st = io::load_checkpoint(*latest, layout, p_full.data(), 0, layout.total(), m_full.data(),
                                 v_full.data());
        const std::size_t nl = store_layout.total();
        Buffer<float> p_l(nl), m_l(nl), v_l(nl);
        tm->extract(p_full.data(), p_l.data());
        tm->extract(m_full.data(), m_l.data());
        tm->extract(v_full.data(), v_l.data());
        dp.load(p_l.data(), m_l.data(), v_l.data());
      } else {
        Buffer<float> p_full(layout.total()), m_s(dp.shard_size()), v_s(dp.shard_size());
        st = io::load_checkpoint(*latest, layout, p_full.data(), dp.shard_begin(), dp.shard_end(),
                                 m_s.data(), v_s.data());
        dp.load_shard(p_full.data(), m_s.data(), v_s.data());
      }
      if (lead) warn_if_resumed_differently(cfg, st, B * accum * ndp);
      step = st.step;
      tokens_seen = st.tokens_seen;
      rng.set_state(st.rng_state);
      train_loader.set_position(st.data_position);
      resumed = true;
      log_info("resumed from {} (step {})", latest->string(), step);
    } else {
      log_info("no checkpoint in {}: starting from scratch", ckpt_dir.string());
    }
  }
  if (!resumed) {
    Buffer<float> p_full(layout.total());
    model::init_params(layout, p_full.data(), tc.seed);
    if (tm) {
      Buffer<float> p_l(store_layout.total());
      tm->extract(p_full.data(), p_l.data());
      dp.load(p_l.data(), nullptr, nullptr);
    } else {
      dp.load(p_full.data(), nullptr, nullptr);
    }
  }
  // Everything that can be wrong with the input has been checked by now: print and save the
  // resolved config, then start.
  if (!opt.quiet) log_info("resolved config ({}):\n{}", cfg.source, to_toml(cfg));
  if (lead) {
    if (opt.overwrite) clear_run(out);
    write_file_atomic(out / "config.toml", to_toml(cfg));
  }
  if (started) *started = true;
  if (step >= tc.steps)
    log_info("nothing to do: the run is already at step {} of {}", step, tc.steps);

  // Metrics: resuming continues the file from the checkpoint's step, else it starts afresh.
  MetricsLog metrics;
  if (lead)
    metrics = resumed ? MetricsLog::resume(out / "metrics.jsonl", step)
                      : MetricsLog::start(out / "metrics.jsonl");
  {
    // What this rank holds, measured from the buffers themselves (ZeRO accounting, fp32).
    const auto mem = dp.memory();
    nlohmann::json row{{"event", "memory"},
                       {"rank", rt.world_rank()},
                       {"param_count", layout.total()},
                       {"dp", ndp},
                       {"tensor", {pc.tx, pc.ty, pc.tz}},
                       {"local_param_count", store_layout.total()},
                       {"zero", dp.stage()},
                       {"params_bytes", mem.params_bytes},
                       {"grads_bytes", mem.grads_bytes},
                       {"optimizer_bytes", mem.optimizer_bytes},
                       {"transient_bytes", mem.transient_bytes},
                       {"activations_bytes", acts.buf.bytes()}};
    if (lead) metrics.write(row);
    if (!opt.quiet)
      log_info("memory per rank: parameters {:.1f} MB, gradients {:.1f} MB, AdamW state {:.1f} MB",
               mem.params_bytes / 1e6, mem.grads_bytes / 1e6, mem.optimizer_bytes / 1e6);
  }

  // The performance model's prediction for this run (docs/performance-model.md), logged next to
  // what is measured: per-step time in every row, peak memory in the closing summary.
  double predicted_step_s = 0, predicted_peak_bytes = 0;
  if (cluster_spec) {
    const fs::path& cluster = cluster_path;
    {
      try {
        const auto& spec = *cluster_spec;
        perf::ModelOptions mo;
        mo.dtype = perf::DType::FP32;
        mo.tp_overlap = pc.overlap_dx && pc.prefetch;
        mo.dp_overlap = pc.overlap && !pipeline;  // a pipeline reduces after its list
        mo.pp_scatter_gather = false;  // each tensor rank sends its own block of activations
        const auto est = perf::predict_step(mcfg, shape, spec, T, B, accum, pc.zero,
                                            pc.recompute && (tensor_size > 1 || pipeline)
                                                ? perf::Recompute::Full
                                                : perf::Recompute::None,
                                            mo, sched.kind, sched.v);
        predicted_step_s = est.step_s;
        predicted_peak_bytes = est.peak_bytes;
        if (lead)
          metrics.write({{"event", "prediction"},
                         {"cluster", cluster.string()},
                         {"step_ms", est.step_s * 1e3},
                         {"peak_bytes", est.peak_bytes},
                         {"fits", est.fits},
                         {"reason", est.reason}});
        if (!opt.quiet)
          log_info("performance model ({}): {:.1f} ms per step, {:.1f} MB per rank{}",
                   cluster.string(), est.step_s * 1e3, est.peak_bytes / 1e6,
                   est.fits ? std::string() : " (" + est.reason + ")");
      } catch (const Error& e) {
        if (!opt.quiet) log_info("(no performance-model prediction: {})", e.what());
      }
    }
  }

  // Per rank: MFU is per device (a tensor group shares its micro-batch's FLOPs, the pipeline
  // stages its layers).
  const double flops_per_step = 3.0 * model::forward_flops_per_token(mcfg, T) *
                                static_cast<double>(B) * T * accum / (tensor_size * pc.pp);
  const std::int64_t tokens_per_step = static_cast<std::int64_t>(B) * T * accum * ndp;
  Peak peak;
  if (lead || cfg.hardware.peak_tflops > 0) peak = resolve_peak(cfg.hardware.peak_tflops, gemm);
  {  // every rank uses rank 0's measurement (measuring on all ranks at once would compete)
    double f = peak.flops;
    rt.world().broadcast_bytes(&f, sizeof f, 0);
    if (!lead) peak = {f, "measured fp32 GEMM on rank 0"};
  }
  const bool peak_measured = cfg.hardware.peak_tflops <= 0;
  if (!opt.quiet) {
    log_info("model: {}", model::describe(mcfg));
    log_info("grid: {} ({} ranks), ZeRO stage {}, gradient overlap {}{}", shape.describe(),
             rt.world_size(), dp.stage(), pc.overlap ? "on" : "off",
             tm ? fmt::format(", tensor-parallel slice {:.2f}M parameters per rank{}{}",
                              store_layout.total() / 1e6, pc.recompute ? ", recomputation" : "",
                              pc.sequence_parallel ? ", sequence parallelism" : "")
                : std::string());
    if (pipe)
      log_info(
          "pipeline: {} schedule, {} stages x {} chunk{}, layers per chunk [{}], {} micro-batches "
          "per step, ideal bubble {:.3f}",
          pc.schedule, pc.pp, pc.virtual_stages, pc.virtual_stages > 1 ? "s" : "",
          fmt::join(layer_split, ", "), accum, parallel::ideal_bubble_fraction(sched));
    log_info(
        "train: {} steps x {} micro-batches of {}x{} x dp {} = {} tokens/step, {:.1f} "
        "GFLOP/step/rank, {} threads",
        tc.steps, accum, B, T, ndp, tokens_per_step, flops_per_step / 1e9, omp_get_max_threads());
    log_info("data: {} ({} tokens), MFU against {}", cfg.data.train, train_loader.num_tokens(),
             peak.describe());
  }

  std::vector<std::int32_t> x(static_cast<std::size_t>(B) * T), y(static_cast<std::size_t>(B) * T);
  optim::AdamWConfig ac{static_cast<float>(tc.lr), static_cast<float>(tc.beta1),
                        static_cast<float>(tc.beta2), static_cast<float>(tc.eps),
                        static_cast<float>(tc.weight_decay)};
  model::ForwardOptions fopt;
  fopt.gemm = gemm;
  fopt.training = true;
  fopt.dloss = 1.0f / (static_cast<float>(B) * T * accum * ndp);
  // Goldfish (training targets only; validation scores every token): the step's micro-batches
  // are read and masked before the first forward, and dloss becomes 1 / (kept targets of the
  // step over all micro-batches and dp ranks).
  const bool goldfish = cfg.goldfish.k > 0;
  std::vector<std::vector<std::int32_t>> gx, gy;  // the step's micro-batches (goldfish, pipeline)
  std::vector<std::int64_t> kept;
  if (goldfish || pipe) {
    gx.assign(accum, std::vector<std::int32_t>(static_cast<std::size_t>(B) * T));
    gy = gx;
    kept.assign(accum, 0);
  }
  if (goldfish) {
    if (!opt.quiet)
      log_info("goldfish: k = {}, strategy {}{}", cfg.goldfish.k, cfg.goldfish.strategy,
               cfg.goldfish.strategy == "hash"     ? fmt::format(", h = {}", cfg.goldfish.h)
               : cfg.goldfish.strategy == "random" ? fmt::format(", seed {}", cfg.goldfish.seed)
                                                   : std::string());
  }

  TrainSummary summary;
  summary.first_step = step;
  std::vector<double> tok_rates;
  Timer run_timer;
  const std::int64_t start_step = step;

  auto validate_now = [&](std::int64_t at) {
    // Every rank scores the same batches (the parameters are replicated), so the figure is the
    // single-process one whatever the grid.
    auto r =
        eval::evaluate_shard(layout, full_params(), acts, cfg.data.val, B, T, tc.val_batches, gemm);
    drop_full();
    summary.val.emplace_back(at, static_cast<float>(r.loss));
    if (!lead) return;
    metrics.write({{"step", at}, {"val_loss", r.loss}, {"val_tokens", r.tokens}});
    log_info("step {:>6} | val loss {:.4f} (ppl {:.1f}, {} tokens)", at, r.loss, r.perplexity,
             r.tokens);
  };
  auto checkpoint_now = [&]() {
    // Sharded: every rank that owns a part of the AdamW state writes it; the lead rank writes
    // the (consolidated) model and the index, and commits after all shards are on disk.
    const float* full = full_params();  // collective at ZeRO-3 and under tensor parallelism
    auto shards = dp.state_shards();
    if (lead) io::begin_checkpoint(ckpt_dir, step);
    rt.world().barrier();
    if (tm) {
      // Tensor parallelism: the moments are assembled into whole-model tensors and written as
      // one shard, so that any grid (or one process) can resume from them.
      const std::size_t nl = store_layout.total();
      Buffer<float> m_l(nl), v_l(nl), m_g(layout.total()), v_g(layout.total());
      dp.gather_moments(m_l.data(), v_l.data());
      tm->gather_full(m_l.data(), m_g.data());
      tm->gather_full(v_l.data(), v_g.data());
      shards = {{0, layout.total()}};
      if (lead)
        io::write_state_shard(ckpt_dir, step, 0, 1,
                              io::StateShard{0, layout.total(), m_g.data(), v_g.data()});
    } else if (shards.size() > 1 || dp.dp_rank() == 0) {
      io::write_state_shard(
          ckpt_dir, step, dp.dp_rank(), static_cast<int>(shards.size()),
          io::StateShard{dp.shard_begin(), dp.shard_end(), dp.m_shard(), dp.v_shard()});
    }
    rt.world().barrier();
    if (lead) {
      io::TrainState st{
          step, rng.state(), train_loader.position(), tokens_seen, {{"config", to_toml(cfg)}}};
      summary.last_checkpoint =
          io::commit_checkpoint(ckpt_dir, layout, full, st, shards, tc.keep_checkpoints);
    }
    rt.world().barrier();  // nobody goes on (or exits) before the checkpoint is complete
    drop_full();
  };

  if (tc.val_every > 0 && step == 0) validate_now(0);
  const std::int64_t end_step =
      opt.stop_at > 0 ? std::min<std::int64_t>(opt.stop_at, tc.steps) : tc.steps;
  while (step < end_step) {
    Timer t;
    double loss = 0, comm_wait = 0, kept_total = 0;
    double fwd_s = 0, bwd_s = 0;  // where the step's time goes (non-pipeline path)
    if (goldfish) {
      // Read and mask the whole step first: the loss is normalized by the targets kept over all
      // micro-batches and dp ranks, which the gradient scale needs before the first backward.
      for (int a = 0; a < accum; ++a) {
        const std::uint64_t pos = train_loader.position();
        train_loader.next(gx[a].data(), gy[a].data());
        const std::uint64_t first_target =
            pos + static_cast<std::uint64_t>(dp.dp_rank()) * B * T + 1;  // stream index
        kept[a] = apply_goldfish(cfg.goldfish, gy[a].data(), B, T, first_target, step);
        kept_total += static_cast<double>(kept[a]);
      }
      dp_comm.all_reduce_sum(&kept_total, 1);
      fopt.dloss = kept_total > 0 ? static_cast<float>(1.0 / kept_total) : 0.0f;
    } else if (pipe) {
      for (int a = 0; a < accum; ++a) train_loader.next(gx[a].data(), gy[a].data());
    }
    dp.begin_step();
    if (pipe) {
      // The stage's instruction list over the step's micro-batches; gradients accumulate
      // (no reduction before the list ends), then the tied embedding's two copies and the dp
      // reduction of every block.
      std::vector<const std::int32_t*> in(accum), tg(accum);
      for (int a = 0; a < accum; ++a) in[a] = gx[a].data(), tg[a] = gy[a].data();
      dp.begin_micro_batch(false);
      const auto mb_losses = pipe->run(dp, in, tg, B, T, fopt);
      Timer comm_timer;
      pipe->sum_tied_embedding_grads(dp);
      dp.begin_micro_batch(true);
      for (int b = model::num_blocks(store_layout) - 1; b >= 0; --b) dp.grads_done(b);
      dp.end_micro_batch();
      comm_wait += comm_timer.seconds();
      for (int a = 0; a < accum; ++a)
        loss += goldfish ? static_cast<double>(mb_losses[a]) * static_cast<double>(kept[a])
                         : mb_losses[a];
      // The losses are known on the last stage.
      pipe_comm->broadcast_bytes(&loss, sizeof loss, pc.pp - 1);
    }
    for (int a = 0; a < (pipe ? 0 : accum); ++a) {
      const std::int32_t* xa = goldfish ? gx[a].data() : x.data();
      const std::int32_t* ya = goldfish ? gy[a].data() : y.data();
      if (!goldfish) train_loader.next(x.data(), y.data());
      dp.begin_micro_batch(a + 1 == accum);  // reductions start as backward finishes each block
      Timer phase;
      const float mb = tm ? tm->forward(dp, xa, ya, B, T, fopt)
                          : model::forward(layout, dp, acts, xa, ya, B, T, fopt);
      // forward returns the mean over this micro-batch's kept targets: weight it back to a sum
      loss += goldfish ? static_cast<double>(mb) * static_cast<double>(kept[a]) : mb;
      fwd_s += phase.seconds();
      phase.reset();
      if (tm)
        tm->backward(dp, xa, B, T, gemm);
      else
        model::backward(layout, dp, acts, xa, B, T, gemm);
      bwd_s += phase.seconds();
      Timer comm_timer;
      dp.end_micro_batch();  // waits for the reductions still in flight
      comm_wait += comm_timer.seconds();
    }
    if (goldfish) {
      dp_comm.all_reduce_sum(&loss, 1);
      loss = kept_total > 0 ? loss / kept_total : 0.0;
    } else {
      loss = dp.mean(loss / accum);
    }
    if (!std::isfinite(loss))
      throw Error(fmt::format("the loss became {} at step {}", loss, step + 1),
                  "lower train.lr or raise train.warmup_steps; check the data");
    Timer update_timer;
    double norm = 0;
    if (tm) {
      // Each element once: the slices this rank owns, over every rank.
      double sq = dp.grad_sumsq(tm->owner_mask().data());
      rt.world().all_reduce_sum(&sq, 1);
      norm = std::sqrt(sq);
    } else {
      norm = dp.grad_norm();
    }
    float lr =
        optim::lr_at(step, tc.steps, tc.warmup_steps, ac.lr, static_cast<float>(tc.min_lr_ratio));
    dp.step(ac, lr, step + 1, optim::clip_scale(norm, tc.grad_clip));  // clipping fused
    const double update_s = update_timer.seconds();
    ++step;
    tokens_seen += tokens_per_step;
    double sec = t.seconds();
    double tps = static_cast<double>(tokens_per_step) / sec;
    tok_rates.push_back(tps);
    summary.losses.push_back(static_cast<float>(loss));
    nlohmann::json row{{"step", step},         {"loss", loss},         {"lr", lr},
                       {"grad_norm", norm},    {"step_ms", sec * 1e3}, {"tokens_per_s", tps},
                       {"tokens", tokens_seen}};
    if (predicted_step_s > 0) row["predicted_step_ms"] = predicted_step_s * 1e3;
    if (peak_measured && peak.flops > 0 && flops_per_step / sec > peak.flops) {
      // The start-up measurement ran on a busy machine: a step cannot beat the peak, so the
      // peak is at least this step's rate. Say so once instead of printing MFU > 100%.
      if (peak.source.find("raised") == std::string::npos) {
        peak.source += ", raised to the best step rate seen";
        if (!opt.quiet)
          log_info(
              "note: step {} ran at {:.1f} GFLOP/s, above the measured GEMM peak; using it as the "
              "peak",
              step, flops_per_step / sec / 1e9);
      }
      peak.flops = flops_per_step / sec;
    }
    double mfu = peak.flops > 0 ? flops_per_step / sec / peak.flops : -1;
    row["mfu"] = mfu >= 0 ? nlohmann::json(mfu) : nlohmann::json(nullptr);
    row["mfu_peak"] = peak.describe();
    if (goldfish)
      row["goldfish_kept"] =
          static_cast<std::int64_t>(kept_total);  // targets in the loss, all dp ranks
    if (!pipe) {
      row["forward_ms"] = fwd_s * 1e3;
      row["backward_ms"] = bwd_s * 1e3;
    }
    row["update_ms"] = update_s * 1e3;  // gradient norm, clipping and the optimizer
    if (pipe) {
      row["bubble"] = pipe->stats().bubble_fraction();  // this (the lead's) stage
      row["p2p_wait_ms"] = pipe->stats().recv_wait_s * 1e3;
    }
    if (ndp > 1) {
      row["grad_overlap"] = dp.overlap_fraction();  // fraction reduced before backward ended
      row["comm_wait_ms"] = comm_wait * 1e3;        // exposed gradient-reduction time
    }
    if (lead) metrics.write(row);
    if (lead && opt.on_step) opt.on_step(step, tc.steps, loss);
    if (!opt.quiet &&
        (step % std::max(1, tc.log_every) == 0 || step == tc.steps || step == start_step + 1)) {
      double el = run_timer.seconds();
      double eta =
          el / static_cast<double>(step - start_step) * static_cast<double>(tc.steps - step);
      log_info(
          "step {:>6}/{} | loss {:.4f} | lr {:.2e} | norm {:6.3f} | {:7.1f} ms | {:7.0f} tok/s | "
          "MFU {} | ETA {}",
          step, tc.steps, loss, lr, norm, sec * 1e3, tps,
          mfu >= 0 ? fmt::format("{:5.1f}%", 100 * mfu) : std::string("unknown"),
          fmt_duration(eta));
    }
    // The steps' peak resident memory starts after the first step (its one-time allocations
    // and first touches); validation and checkpoints inside the loop count.
    if (step == start_step + 1) reset_peak_resident();
    if (tc.val_every > 0 && (step % tc.val_every == 0 || step == tc.steps)) validate_now(step);
    if (tc.ckpt_every > 0 && step % tc.ckpt_every == 0 && step != end_step) checkpoint_now();
    if (cfg.sample.every > 0 && step % cfg.sample.every == 0 && step != end_step) {
      const float* full = full_params();  // collective (ZeRO-3, tensor parallelism)
      if (lead) print_sample(cfg, layout, full, rng, step);
      drop_full();
    }
  }
  // Peak resident bytes of the busiest rank over the steps (before the final checkpoint).
  double steps_rss = static_cast<double>(peak_resident_bytes());
  rt.world().all_reduce_max(&steps_rss, 1);
  if (pipe && step > start_step) {
    // What each stage kept in flight and how long it idled, from one rank per stage.
    const int stage = topo.coord(comm::Axis::PP);
    std::vector<double> info(4 * static_cast<std::size_t>(pc.pp), 0.0);
    const int tensor_rank = rt.group(topo, {comm::Axis::TX, comm::Axis::TY, comm::Axis::TZ}).rank();
    if (dp.dp_rank() == 0 && tensor_rank == 0) {
      const auto& st = tm->activation_stats();
      info[4 * stage + 0] = st.peak_live;
      info[4 * stage + 1] = static_cast<double>(st.peak_bytes);
      info[4 * stage + 2] = static_cast<double>(st.slot_bytes_max);
      info[4 * stage + 3] = pipe->stats().bubble_fraction();
    }
    rt.world().all_reduce_sum(info.data(), info.size());
    if (lead) {
      nlohmann::json stages = nlohmann::json::array();
      for (int s2 = 0; s2 < pc.pp; ++s2)
        stages.push_back({{"stage", s2},
                          {"peak_in_flight", info[4 * s2 + 0]},
                          {"in_flight_formula", parallel::in_flight_formula(sched, s2)},
                          {"peak_activation_bytes", info[4 * s2 + 1]},
                          {"slot_bytes", info[4 * s2 + 2]},
                          {"bubble_last_step", info[4 * s2 + 3]}});
      metrics.write({{"event", "pipeline"},
                     {"schedule", pc.schedule},
                     {"pp", pc.pp},
                     {"v", pc.virtual_stages},
                     {"m", accum},
                     {"layers", layer_split},
                     {"ideal_bubble", parallel::ideal_bubble_fraction(sched)},
                     {"stages", stages}});
    }
  }
  if (step > start_step || !resumed) checkpoint_now();
  summary.last_step = step;
  if (tm && lead) tm->save_gemm_choices();
  if (lead && step > start_step) {
    // Measured against predicted, once per run.
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::vector<double> sorted = tok_rates;
    std::sort(sorted.begin(), sorted.end());
    const double median_step_s = static_cast<double>(tokens_per_step) / sorted[sorted.size() / 2];
    nlohmann::json row{{"event", "summary"},
                       {"median_step_ms", median_step_s * 1e3},
                       {"peak_rss_bytes", static_cast<double>(ru.ru_maxrss) * 1024.0},
                       {"peak_rss_steps_bytes", steps_rss}};
    if (predicted_step_s > 0) {
      row["predicted_step_ms"] = predicted_step_s * 1e3;
      row["predicted_peak_bytes"] = predicted_peak_bytes;
    }
    metrics.write(row);
  }
  if (!tok_rates.empty()) {
    std::nth_element(tok_rates.begin(), tok_rates.begin() + tok_rates.size() / 2, tok_rates.end());
    summary.tokens_per_s = tok_rates[tok_rates.size() / 2];
  }
  if (step > start_step && !opt.quiet)
    log_info("trained steps {}..{} in {} (median {:.0f} tok/s); checkpoint {}", start_step + 1,
             step, fmt_duration(run_timer.seconds()), summary.tokens_per_s,
             summary.last_checkpoint.string());
  {
    const float* full = full_params();  // collective
    if (lead) print_sample(cfg, layout, full, rng, step);
  }
  return summary;
}

}  // namespace tessera::train
