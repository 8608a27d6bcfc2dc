// Pipeline parallelism (the pp axis): the model's layers cut into pp*v chunks, chunk c of stage s
// being the model's chunk c*pp + s (parallel/schedule.hpp), and the executor that runs one stage's
// instruction list on a TensorModel holding that stage's chunks (so pipeline stages compose with
// the tx x ty x tz tensor grid: every rank of a stage's tensor group runs the same list, and each
// sends its own (rows / tz, C / tx) block of the activations to the rank with the same tensor
// coordinates on the next stage).
//
// Micro-batches flow between stages with non-blocking sends (posted, completed later) and
// receives that block the stage (polled, with short sleeps, so an idle stage leaves its core to
// the others on an oversubscribed CPU). Activations of a micro-batch live in the model's slots
// (TensorModel::chunk_input / forward_chunk / backward_chunk) from its forward to its backward:
// the schedule decides how many are in flight, and TensorModel::activation_stats() measures it.
//
// The wire: activations and their gradients cross stages in fp32, or in bf16 (bf16_wire: each
// value rounded to nearest even once as it is sent and widened back exactly as it arrives: half
// the bytes, one rounding per stage boundary in each direction).
//
// The tied embedding: the first stage holds wte for the token embedding and the last stage a copy
// for the LM head. After the step's backwards, sum_tied_embedding_grads() adds the two gradients
// on both stages (Megatron's embedding group), so both copies take the same AdamW update and stay
// identical; checkpoints and the gradient norm count the first stage's copy (the owner).
//
// One step. The trainer runs every step of the parallel model through the executor: a run
// without a pipeline is the one-stage schedule (1F1B with pp = 1: F0 B0 F1 B1 ... OPT). Given the
// step's hooks, the executor runs OptimizerStep too: the tied-embedding sum and the data-parallel
// reduction, then the caller's optimizer step. On one stage each micro-batch's backward reduces
// as the data-parallel store asks (the last one's blocks as the backward completes them,
// overlapped; ZeRO-2/3 every micro-batch's); on a pipeline the reduction follows the schedule's
// last backward and the tied-embedding sum.
#pragma once

#include <functional>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/core/chrome_trace.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/parallel/data_parallel.hpp"
#include "tessera/parallel/plan.hpp"
#include "tessera/parallel/schedule.hpp"
#include "tessera/parallel/tensor_model.hpp"

namespace tessera::parallel {

// The local chunks of `stage` (chunk c = model chunk c*pp + stage) for TensorModelOptions::chunks.
std::vector<ModelChunk> stage_chunks(const std::vector<int>& split, int pp, int v, int stage);

struct PipelineStats {
  double step_s = 0;       // first instruction to the last (one step)
  double compute_s = 0;    // in Forward / Backward (including their tensor-parallel collectives)
  double recv_wait_s = 0;  // blocked in receives: the bubble, plus transfers
  double send_wait_s = 0;  // waiting for a send to complete before its buffer is reused
  double forward_s = 0, backward_s = 0;  // compute_s split (with the step's hooks, one stage)
  double reduce_wait_s = 0;              // OptimizerStep (with hooks): exposed gradient reduction
  int forwards = 0, backwards = 0;
  std::size_t sent_bytes = 0;
  // idle / compute: the measured bubble fraction of this stage (ideal_bubble_fraction is the
  // same ratio for equal chunk costs and free messages).
  double bubble_fraction() const { return compute_s > 0 ? (step_s - compute_s) / compute_s : 0; }
};

class PipelineExecutor {
 public:
  // pp: the pipeline communicator (its rank is the stage). The model holds this stage's chunks:
  // stage_chunks(split, spec.pp, spec.v, pp.rank()).
  PipelineExecutor(TensorModel& model, comm::Communicator& pp, const ScheduleSpec& spec,
                   bool bf16_wire = false);

  const ScheduleSpec& spec() const { return spec_; }
  int stage() const { return stage_; }
  const std::vector<Instr>& instructions() const { return list_; }

  // What OptimizerStep runs: the gradient reductions of dp (the store given to run) and then
  // optimizer_step(losses), the caller's update, given each micro-batch's mean loss as run()
  // returns them.
  struct StepHooks {
    DataParallel* dp = nullptr;
    std::function<void(const std::vector<float>& losses)> optimizer_step;
  };
  // One step's schedule. inputs[mb], targets[mb]: the micro-batches (B, T) of token ids (read on
  // the stages holding the embedding / the head). Gradients accumulate into the store (begin_step
  // zeroes them before). Without hooks, OptimizerStep is left to the caller (the schedule alone,
  // as a benchmark times it). Returns each micro-batch's mean loss on the stage holding the head
  // (zeros elsewhere).
  std::vector<float> run(model::ParamStore& store, const std::vector<const std::int32_t*>& inputs,
                         const std::vector<const std::int32_t*>& targets, int B, int T,
                         const model::ForwardOptions& opt, const StepHooks* hooks = nullptr);
  // The mean loss of one micro-batch (B, T) through every stage's chunks in model order (forward
  // only, opt.training false), on every stage: validation on the stages' own slices. inputs read
  // on the stage holding the embedding, targets on the head's. Collective over the pipeline.
  float evaluate(model::ParamStore& store, const std::int32_t* inputs, const std::int32_t* targets,
                 int B, int T, const model::ForwardOptions& opt);
  // Adds the first stage's and the last stage's wte gradients on both (no-op with pp = 1, or
  // with an untied LM head, which lives on the last stage alone).
  void sum_tied_embedding_grads(model::ParamStore& store);
  // The last run().
  const PipelineStats& stats() const { return stats_; }
  // While on, run() records each instruction of the step (Chrome-trace events of this stage:
  // tid = stage, times from the step's start; OptimizerStep's reductions and update as "OPT").
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<TraceEvent>& trace() const { return trace_; }

 private:
  TensorModel& model_;
  comm::Communicator& pp_;
  ScheduleSpec spec_;
  int stage_ = 0;
  std::vector<Instr> list_;
  PipelineStats stats_;
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  bool bf16_wire_ = false;
  // Sends in flight copy from here: fp32 gradients, or every bf16 send (rounded); free_bufs_
  // indexes the pool in use.
  std::vector<std::vector<float>> send_bufs_;
  std::vector<std::vector<std::uint16_t>> send16_;
  std::vector<int> free_bufs_;
  std::vector<std::uint16_t> recv16_;
  std::vector<float> grad_in_, tied_tmp_;

  struct Pending {
    comm::Request req;
    int buf = -1;  // the pool's buffer, or -1: sent from the caller's memory
  };
  // n values of src to peer: from src itself when it stays untouched until the send completes
  // and the wire is fp32, else from a buffer of the pool (rounded to bf16, or copied).
  Pending post_send(const float* src, std::size_t n, int peer, int tag, bool src_stays);
  void release(const Pending& p);  // the send has completed: its buffer back to the pool
  void reset_pool();               // every send has completed
  double receive(float* dst, std::size_t n, int peer, int tag);  // seconds blocked
  void reduce_gradients(DataParallel& dp);  // OptimizerStep's reductions on a pipeline

  // run()'s parts: one instruction of the list (OptimizerStep aside), Forward and Backward, and
  // the gradient sends that have completed (all: waited for) handed back to the pool.
  struct Step;
  int tag(const Instr& in) const;
  void execute(const Instr& in, Step& s);
  void forward(const Instr& in, Step& s);
  void backward(const Instr& in, Step& s);
  void reap_grad_sends(Step& s, bool all);
};

}  // namespace tessera::parallel
