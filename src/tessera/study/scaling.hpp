// The scaling study: weak scaling (the sequences per rank fixed, the global batch grows with the
// ranks) and strong scaling (the global batch fixed) of data-parallel, tensor-parallel (1D, tx)
// and pipeline-parallel grids, measured on this machine by training runs of a small model at each
// rank count, each beside the performance model's prediction for it (the trainer's own
// prediction row, on a cluster file the probe measured at that rank count), and the same curves
// for published clusters to thousands of devices from the planner's best plan at each size,
// predicted by the model and replayed by the simulator.
//
// A rank count is a property of an MPI job, so each measured point is a job of its own: the
// study launches `tessera probe` and `tessera train` under the launcher it is given, one job
// after another, and reads their files.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera::study {

struct ScalingOptions {
  std::filesystem::path out = "runs/scaling";  // the runs, cluster files, scaling.md, figures
  std::filesystem::path binary;                // the tessera binary the jobs run
  // The job launcher, "{ranks}" replaced by the rank count, e.g. "mpirun --oversubscribe -n
  // {ranks}".
  std::string launcher = "mpirun --oversubscribe -n {ranks}";
  std::vector<int> ranks = {1, 2, 4, 8};
  std::vector<std::string> grids = {"dp", "tensor", "pipeline"};
  int steps = 5;  // per run: the first warms up, the median of the others is measured
  // The cluster file of each rank count: `tessera probe --quick` (seconds), or the full probe (a
  // minute or more per rank count, steadier). A file already in `out` is used as it is.
  bool full_probe = false;
  int micro_batch = 1;   // sequences per micro-batch
  int strong_batch = 8;  // the global batch of strong scaling (weak: micro_batch x ranks)
  // The measured model: small enough for a loaded 2-core machine, deep and wide enough for 8
  // pipeline stages and 8 tensor ranks.
  int n_layer = 8, n_head = 8, n_embd = 64, seq = 64;
  std::string data_train = "data/brown/train.bin";
  // Published clusters (names in configs/clusters) and the model planned on them.
  std::vector<std::string> clusters = {"frontier", "selene", "dgx-h100"};
  std::string published_model = "gpt-175b";
  long published_batch_per_8 = 16;     // weak scaling: sequences per step per 8 devices
  long published_strong_batch = 1536;  // strong scaling: sequences per step (GPT-3's batch)
  std::vector<long> published_devices = {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
};

// One measured point: a training run at `ranks` ranks.
struct MeasuredPoint {
  std::string scaling, grid;  // "weak" / "strong"; "dp", "tensor", "pipeline"
  int ranks = 1;
  long global_batch = 0;
  double step_s = 0;       // median of the steps after the first
  double predicted_s = 0;  // the performance model's, 0: none
  double efficiency = 0;   // against the 1-rank run of the same scaling (and the grid's first)
  double predicted_efficiency = 0;
  double error() const { return predicted_s > 0 ? predicted_s / step_s - 1 : 0; }
};

// One point of a published cluster's curve.
struct PublishedPoint {
  std::string cluster, scaling;
  long devices = 0, global_batch = 0;
  std::string plan;  // the planner's best
  double model_s = 0, simulated_s = 0;
  double efficiency = 0;  // of the simulated step, against the cluster's smallest that fits
};

struct ScalingResult {
  std::vector<MeasuredPoint> measured;
  std::vector<PublishedPoint> published;
};

// Runs the measured jobs (throws tessera::Error naming the job's log when one fails; a run that
// finished in o.out before is read instead, so an interrupted study resumes) and the published
// clusters' plans and simulations; draws a progress line over the jobs.
ScalingResult run_scaling_study(const ScalingOptions& o);

// The study's Markdown (tables of measured and predicted efficiency with the model's error per
// point, and the published clusters'), and its figures written into o.out (weak.png/.svg,
// strong.png/.svg, published.png/.svg); returns the Markdown.
std::string write_scaling_report(const ScalingResult& r, const ScalingOptions& o);

}  // namespace tessera::study
