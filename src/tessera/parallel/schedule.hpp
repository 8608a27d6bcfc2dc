// Pipeline schedules as per-rank instruction lists: the one definition that the pipeline executor
// runs and that the performance model and the schedule simulator (tessera::perf) cost.
//
// A schedule covers one training step of one pipeline: `pp` stages (pipeline ranks 0..pp-1),
// `m` micro-batches, and `v` model chunks per stage (v > 1 only for the interleaved schedule).
// The model's layers are cut into pp*v consecutive chunks; chunk c of stage s is global model
// chunk c*pp + s (Megatron's interleaved assignment), so with v = 1 stage s holds chunk s.
//
// Each stage executes its list strictly in order. Instructions:
//   Forward(mb, chunk)    forward of micro-batch mb through the stage's local chunk `chunk`
//                         (in 0..v-1); its input is the received activation (or the data on the
//                         first global chunk); on the last global chunk it includes the loss.
//   Backward(mb, chunk)   backward of the same; needs the received output gradient (or the loss
//                         on the last global chunk). Recomputation, when on, is part of it.
//   SendAct(mb, chunk, peer)   send the output activation of Forward(mb, chunk) to stage `peer`
//   RecvAct(mb, chunk, peer)   receive the input activation of Forward(mb, chunk) from `peer`
//   SendGrad(mb, chunk, peer)  send the input gradient of Backward(mb, chunk) to `peer`
//   RecvGrad(mb, chunk, peer)  receive the output gradient of Backward(mb, chunk) from `peer`
//   OptimizerStep         after the last backward: gradient reduction (data parallel) and update
// `chunk` on a send/recv is always the LOCAL chunk of the executing stage that produces or
// consumes the tensor (the peer's chunk follows from the global chunk numbering).
//
// Semantics the lists are built for (and that the tests check): sends are non-blocking (posted,
// completed later; an executor may wait on them before reusing the buffer), receives block. A
// RecvAct is placed right before the Forward that consumes it and a SendAct right after the
// Forward that produces it (likewise for gradients), so an executor may fuse neighbours.
// Every message has exactly one matching receive on the peer, and the lists never deadlock.
//
// Schedules:
//   GPipe:        all m forwards, then all m backwards. In flight (activations stashed): m.
//   1F1B:         stage s runs min(pp-s-1, m) warm-up forwards, then alternates one forward and
//                 one backward, then drains. In flight on stage s: min(pp-s, m).
//   Interleaved:  Megatron's interleaved 1F1B with v chunks per stage (needs m % pp == 0 and
//                 v >= 2). Bubble (pp-1)/(v*m) of the ideal time instead of (pp-1)/m, at v times
//                 the point-to-point messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel {

enum class ScheduleKind { GPipe, OneF1B, Interleaved };
const char* schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved"
// Parses "gpipe", "1f1b", "interleaved"; throws tessera::Error otherwise.
ScheduleKind parse_schedule(const std::string& name);

enum class OpKind : std::uint8_t {
  Forward,
  Backward,
  SendAct,
  RecvAct,
  SendGrad,
  RecvGrad,
  OptimizerStep
};
const char* op_name(OpKind k);

struct Instr {
  OpKind op = OpKind::Forward;
  int mb = -1;    // micro-batch, 0..m-1 (-1 for OptimizerStep)
  int chunk = 0;  // local model chunk 0..v-1 of the executing stage
  int peer = -1;  // the other stage of a send/recv (-1 otherwise)
  bool operator==(const Instr&) const = default;
};
std::string describe(const Instr& i);  // "F(3,0)", "SA(3,0)->2", "RG(3,1)<-0", "OPT"

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneF1B;
  int pp = 1;  // stages
  int m = 1;   // micro-batches per step (per pipeline)
  int v = 1;   // chunks per stage (Interleaved only; 1 otherwise)
};

// Throws tessera::Error naming the problem: pp, m, v < 1; v != 1 for GPipe/1F1B; v < 2 or
// m % pp != 0 for Interleaved.
void validate(const ScheduleSpec& spec);

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<Instr>> ranks;  // (pp) the instruction list of each stage

  // Global model chunk of local chunk `chunk` on `stage`.
  int global_chunk(int stage, int chunk) const { return chunk * spec.pp + stage; }
};

// The instruction lists of every stage.
Schedule make_schedule(const ScheduleSpec& spec);
// Only stage `stage`'s list (what one rank of an executor needs).
std::vector<Instr> make_stage_schedule(const ScheduleSpec& spec, int stage);

// Properties of a schedule, computed from the lists.
// The largest number of (micro-batch, chunk) forwards whose backward has not run yet, on
// `stage` (activations that must be kept), counted in chunk units.
int max_in_flight(const std::vector<Instr>& list);
// The same by formula, without building the lists (the planner's memory model): m for GPipe,
// min(pp - stage, m) for 1F1B, min(2 (pp - stage - 1) + (v - 1) pp + 1, m v) for Interleaved
// (Megatron's warm-up count plus one). Tests check it equals max_in_flight of the lists.
int in_flight_formula(const ScheduleSpec& spec, int stage);
// Ideal bubble fraction: idle time / ideal compute time on every stage, with equal forward and
// backward costs per chunk and free communication: (pp-1)/m for GPipe and 1F1B,
// (pp-1)/(v*m) for Interleaved.
double ideal_bubble_fraction(const ScheduleSpec& spec);

}  // namespace tessera::parallel
