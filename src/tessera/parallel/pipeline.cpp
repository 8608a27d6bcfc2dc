#include "tessera/parallel/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "tessera/core/error.hpp"
#include "tessera/core/timer.hpp"
#include "tessera/kernels/cpu/bf16.hpp"

namespace tessera::parallel {

std::vector<ModelChunk> stage_chunks(const std::vector<int>& split, int pp, int v, int stage) {
  TESSERA_CHECK(static_cast<int>(split.size()) == pp * v && stage >= 0 && stage < pp,
                "split of {} chunks for pp={} v={} stage {}", split.size(), pp, v, stage);
  std::vector<int> begin(split.size() + 1, 0);
  for (std::size_t g = 0; g < split.size(); ++g) begin[g + 1] = begin[g] + split[g];
  std::vector<ModelChunk> out;
  for (int c = 0; c < v; ++c) {
    const int g = c * pp + stage;
    out.push_back(ModelChunk{begin[g], begin[g + 1], g == 0, g == pp * v - 1});
  }
  return out;
}

namespace {

// Completes a request, polling: spin briefly, then sleep between polls so that a waiting stage
// gives its core to the others (ranks oversubscribe the cores of a CPU run).
void poll_wait(comm::Request& r) {
  using clock = std::chrono::steady_clock;
  const auto spin_until = clock::now() + std::chrono::microseconds(50);
  while (!r.test()) {
    if (clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

PipelineExecutor::PipelineExecutor(TensorModel& model, comm::Communicator& pp,
                                   const ScheduleSpec& spec, bool bf16_wire)
    : model_(model), pp_(pp), spec_(spec), stage_(pp.rank()), bf16_wire_(bf16_wire) {
  TESSERA_CHECK(pp.size() == spec.pp, "pipeline communicator of {} ranks for pp={}", pp.size(),
                spec.pp);
  TESSERA_CHECK(static_cast<int>(model.chunks().size()) == spec.v,
                "the model holds {} chunks, the schedule runs {} per stage", model.chunks().size(),
                spec.v);
  if (spec.pp == 1 && spec.v > 1)
    throw Error("an interleaved schedule needs pp >= 2 stages",
                "use the 1f1b schedule (or no schedule) on one stage");
  // Every stage runs the same check (linear in the instructions): a list that could deadlock or
  // miss a message is refused before the first step.
  const auto check = check_schedule(make_schedule(spec));
  TESSERA_CHECK(check.ok, "pipeline schedule {} pp={} m={} v={} fails its check: {}",
                schedule_name(spec.kind), spec.pp, spec.m, spec.v,
                check.problems.empty() ? std::string() : check.problems.front());
  list_ = make_stage_schedule(spec, stage_);
}

namespace {

// The trace category of an instruction, as the simulator names them: Forward and Backward are
// "compute" (with the tensor-parallel collectives inside them), a receive's wait "idle".
const char* trace_category(OpKind op) {
  switch (op) {
    case OpKind::Forward:
    case OpKind::Backward:
      return "compute";
    case OpKind::RecvAct:
    case OpKind::RecvGrad:
      return "idle";
    case OpKind::SendAct:
    case OpKind::SendGrad:
      return "send";
    default:
      return "optimizer";
  }
}

}  // namespace

// One run()'s arguments, what it accumulates, and its sends still in flight.
struct PipelineExecutor::Step {
  model::ParamStore& store;
  const std::vector<const std::int32_t*>& inputs;
  const std::vector<const std::int32_t*>& targets;
  const model::ForwardOptions& opt;
  DataParallel* dp;           // the hooks' data parallelism, or null
  bool one_stage;             // pp = 1: each backward's reductions complete at once
  std::vector<float> losses;  // (m): each micro-batch's loss, from the chunk with the head
  std::map<std::pair<int, int>, Pending> act_sends;  // (chunk, mb)
  std::vector<Pending> grad_sends;
};

std::vector<float> PipelineExecutor::run(model::ParamStore& store,
                                         const std::vector<const std::int32_t*>& inputs,
                                         const std::vector<const std::int32_t*>& targets, int B,
                                         int T, const model::ForwardOptions& opt,
                                         const StepHooks* hooks) {
  const int m = spec_.m;
  DataParallel* dp = hooks ? hooks->dp : nullptr;
  TESSERA_CHECK(!hooks || static_cast<model::ParamStore*>(dp) == &store,
                "the step's hooks reduce the store the schedule runs on");
  const bool one_stage = spec_.pp == 1;
  if (dp && !one_stage) dp->begin_micro_batch(false);  // reduced at OptimizerStep
  TESSERA_CHECK(static_cast<int>(inputs.size()) == m && static_cast<int>(targets.size()) == m,
                "{} micro-batches given, the schedule has {}", inputs.size(), m);
  model_.begin_step(B, T);
  grad_in_.resize(model_.boundary_numel());
  stats_ = PipelineStats{};
  Timer step_timer;
  Step s{store, inputs, targets, opt, dp, one_stage, std::vector<float>(m, 0.0f), {}, {}};
  reset_pool();
  trace_.clear();
  for (const Instr& in : list_) {
    const double started = step_timer.seconds();
    execute(in, s);
    if (tracing_ && in.op != OpKind::OptimizerStep)
      trace_.push_back({0, stage_, describe(in), trace_category(in.op), started,
                        step_timer.seconds() - started});
  }
  Timer t;
  for (auto& [k, p] : s.act_sends) poll_wait(p.req);
  reap_grad_sends(s, true);
  stats_.send_wait_s += t.seconds();
  stats_.step_s = step_timer.seconds();  // the schedule, without the optimizer step
  if (hooks) {  // OptimizerStep, the last instruction: run here, once the sends have completed
    const double started = step_timer.seconds();
    Timer w;
    if (!one_stage) reduce_gradients(*dp);
    stats_.reduce_wait_s += w.seconds();
    if (hooks->optimizer_step) hooks->optimizer_step(s.losses);
    if (tracing_)
      trace_.push_back({0, stage_, "OPT", "optimizer", started, step_timer.seconds() - started});
  }
  return s.losses;
}

// Tags: the message key of the instruction (parallel::message_key: activation or gradient,
// micro-batch, consuming model chunk), within MPI's guaranteed tag range; messages with the same
// tag between two stages arrive in the order sent, which is also the order received.
int PipelineExecutor::tag(const Instr& in) const {
  return parallel::message_key(spec_, stage_, in) % 32767;
}

void PipelineExecutor::execute(const Instr& in, Step& s) {
  const std::size_t n = model_.boundary_numel();
  const std::size_t wire_bytes = n * (bf16_wire_ ? 2 : 4);
  switch (in.op) {
    case OpKind::RecvAct:
      stats_.recv_wait_s += receive(model_.chunk_input(in.chunk, in.mb), n, in.peer, tag(in));
      break;
    case OpKind::Forward:
      forward(in, s);
      break;
    case OpKind::SendAct:
      s.act_sends[{in.chunk, in.mb}] =
          post_send(model_.chunk_output(in.chunk, in.mb), n, in.peer, tag(in), true);
      stats_.sent_bytes += wire_bytes;
      break;
    case OpKind::RecvGrad:
      stats_.recv_wait_s += receive(grad_in_.data(), n, in.peer, tag(in));
      break;
    case OpKind::Backward:
      backward(in, s);
      break;
    case OpKind::SendGrad:
      s.grad_sends.push_back(post_send(model_.input_grad(), n, in.peer, tag(in), false));
      stats_.sent_bytes += wire_bytes;
      break;
    case OpKind::OptimizerStep:
      break;  // the last instruction: run() runs it once the sends have completed
  }
}

void PipelineExecutor::forward(const Instr& in, Step& s) {
  if (s.dp && s.one_stage) s.dp->begin_micro_batch(in.mb == spec_.m - 1);
  Timer t;
  s.store.begin_forward();
  const float loss =
      model_.forward_chunk(s.store, in.chunk, in.mb, s.inputs[in.mb], s.targets[in.mb], s.opt);
  if (model_.chunks()[in.chunk].head) s.losses[in.mb] = loss;
  stats_.forward_s += t.seconds();
  stats_.compute_s += t.seconds();
  ++stats_.forwards;
}

void PipelineExecutor::backward(const Instr& in, Step& s) {
  // The slot's output may still be on its way to the next stage (it has arrived by now: the
  // gradient received for it proves it, but the request must complete).
  if (auto it = s.act_sends.find({in.chunk, in.mb}); it != s.act_sends.end()) {
    Timer t;
    poll_wait(it->second.req);
    stats_.send_wait_s += t.seconds();
    release(it->second);
    s.act_sends.erase(it);
  }
  Timer t;
  s.store.begin_backward();
  const bool head = model_.chunks()[in.chunk].head;
  model_.backward_chunk(s.store, in.chunk, in.mb, head ? nullptr : grad_in_.data(), s.opt.gemm);
  stats_.backward_s += t.seconds();
  stats_.compute_s += t.seconds();
  ++stats_.backwards;
  if (s.dp && s.one_stage) {  // the reductions this backward issued
    Timer w;
    s.dp->end_micro_batch();
    stats_.reduce_wait_s += w.seconds();
  }
  reap_grad_sends(s, false);
}

void PipelineExecutor::reap_grad_sends(Step& s, bool all) {
  for (auto it = s.grad_sends.begin(); it != s.grad_sends.end();) {
    if (all) poll_wait(it->req);
    if (!it->req.pending() || it->req.test()) {
      release(*it);
      it = s.grad_sends.erase(it);
    } else {
      ++it;
    }
  }
}

float PipelineExecutor::evaluate(model::ParamStore& store, const std::int32_t* inputs,
                                 const std::int32_t* targets, int B, int T,
                                 const model::ForwardOptions& opt) {
  TESSERA_CHECK(!opt.training, "evaluate() runs forwards only");
  model_.begin_step(B, T);
  const std::size_t n = model_.boundary_numel();
  const int pp = spec_.pp, chunks = pp * spec_.v;
  float loss = 0.0f;
  reset_pool();
  // Model chunk k lives on stage k % pp as its local chunk k / pp; each hands its output on.
  for (int k = 0; k < chunks; ++k) {
    if (k % pp != stage_) continue;
    const int c = k / pp;
    if (k > 0) receive(model_.chunk_input(c, 0), n, (k - 1) % pp, k % 32767);
    store.begin_forward();
    const float l = model_.forward_chunk(store, c, 0, inputs, targets, opt);
    if (k + 1 < chunks) {
      Pending s = post_send(model_.chunk_output(c, 0), n, (k + 1) % pp, (k + 1) % 32767, true);
      poll_wait(s.req);
      release(s);
    } else {
      loss = l;
    }
    model_.end_forward(c, 0);
  }
  pp_.broadcast_bytes(&loss, sizeof loss, (chunks - 1) % pp);
  return loss;
}

PipelineExecutor::Pending PipelineExecutor::post_send(const float* src, std::size_t n, int peer,
                                                      int tag, bool src_stays) {
  if (!bf16_wire_ && src_stays) return Pending{pp_.isend(src, n, peer, tag), -1};
  if (free_bufs_.empty()) {
    if (bf16_wire_)
      send16_.emplace_back();
    else
      send_bufs_.emplace_back();
    free_bufs_.push_back(static_cast<int>(bf16_wire_ ? send16_.size() : send_bufs_.size()) - 1);
  }
  const int b = free_bufs_.back();
  free_bufs_.pop_back();
  if (bf16_wire_) {
    auto& buf = send16_[b];
    buf.resize(n);
    kernels::cpu::to_bf16(buf.data(), src, static_cast<std::int64_t>(n));
    return Pending{pp_.isend(buf.data(), n, peer, tag), b};
  }
  send_bufs_[b].assign(src, src + n);
  return Pending{pp_.isend(send_bufs_[b].data(), n, peer, tag), b};
}

void PipelineExecutor::release(const Pending& p) {
  if (p.buf >= 0) free_bufs_.push_back(p.buf);
}

void PipelineExecutor::reset_pool() {
  free_bufs_.clear();
  const std::size_t pool = bf16_wire_ ? send16_.size() : send_bufs_.size();
  for (std::size_t i = 0; i < pool; ++i) free_bufs_.push_back(static_cast<int>(i));
}

double PipelineExecutor::receive(float* dst, std::size_t n, int peer, int tag) {
  Timer t;
  if (bf16_wire_) {
    recv16_.resize(n);
    comm::Request r = pp_.irecv(recv16_.data(), n, peer, tag);
    poll_wait(r);
    kernels::cpu::from_bf16(dst, recv16_.data(), static_cast<std::int64_t>(n));
  } else {
    comm::Request r = pp_.irecv(dst, n, peer, tag);
    poll_wait(r);
  }
  return t.seconds();
}

void PipelineExecutor::reduce_gradients(DataParallel& dp) {
  sum_tied_embedding_grads(dp);
  dp.begin_micro_batch(true);
  for (int b = model::num_blocks(model_.local_layout()) - 1; b >= 0; --b) dp.grads_done(b);
  dp.end_micro_batch();
}

void PipelineExecutor::sum_tied_embedding_grads(model::ParamStore& store) {
  if (spec_.pp == 1) return;
  const bool first = stage_ == 0, last = stage_ == spec_.pp - 1;
  if (!first && !last) return;
  const auto& layout = model_.local_layout();
  if (layout.head != layout.wte) return;  // an untied head: one copy of the token embedding
  const model::ParamTensor* wte = layout.find("wte.weight");
  if (!wte) wte = layout.find("model.embed_tokens.weight");
  TESSERA_CHECK(wte && wte->numel > 0, "stage {} holds no copy of wte", stage_);
  float* g = store.grads(0) + (wte->offset - model::block_begin(layout, 0));
  const std::size_t n = wte->numel;
  tied_tmp_.resize(n);
  const int peer = first ? spec_.pp - 1 : 0;
  comm::Request s = pp_.isend(g, n, peer, 32767);
  comm::Request r = pp_.irecv(tied_tmp_.data(), n, peer, 32767);
  poll_wait(r);
  poll_wait(s);
  // a + b == b + a exactly: both copies get bitwise the same sum.
  for (std::size_t i = 0; i < n; ++i) g[i] += tied_tmp_[i];
}

}  // namespace tessera::parallel
