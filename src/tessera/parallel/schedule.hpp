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
//   OptimizerStep         after the last backward: the tied-embedding sum and the data-parallel
//                         gradient reduction, then the update (PipelineExecutor's step hooks)
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

// The message a send or receive instruction of `stage` carries, as one number in
// [0, 2 * pp * v * m): (is a gradient, micro-batch, consuming global chunk). A send and the
// receive that matches it have the same key: the executor tags its messages with it and the
// checker and the simulator pair them by it. -1 for compute instructions and for messages that
// cannot exist (micro-batch or chunk out of range, an activation into the first global chunk or
// out of the last, a gradient out of the first or into the last).
int message_key(const ScheduleSpec& spec, int stage, const Instr& in);

// Checks a schedule from its lists alone (for hand-written or transformed lists, and as the
// generators' test oracle): every stage ends with exactly one OptimizerStep; every (micro-batch,
// local chunk) has one Forward and one Backward on its stage, Forward first; the Forward of global
// chunk g > 0 is preceded by its RecvAct from the stage holding g-1 and the Forward of g < last is
// followed by its SendAct to the stage holding g+1 (likewise RecvGrad before and SendGrad after
// each Backward); every send has exactly one matching receive on its peer and vice versa (same
// kind, micro-batch and consumer global chunk); and a replay with non-blocking sends and blocking
// receives runs every list to its end (no deadlock). Linear in the number of instructions.
struct ScheduleCheck {
  bool ok = true;
  // One line each, naming the stage and, where one is at fault, the instruction's index in the
  // stage's list and describe(instr): "stage 1, instruction 4 (RA(0,0)<-0): ...".
  std::vector<std::string> problems;
};
ScheduleCheck check_schedule(const Schedule& s);

// The lists replayed on a clock counted in columns: a forward of one chunk takes
// `forward_cols`, a backward `backward_cols`, messages are free and instant, sends never block
// and a receive waits for its send.
struct Timeline {
  int forward_cols = 1, backward_cols = 2;
  int makespan = 0;                     // columns until the last stage finishes
  std::vector<int> busy;                // (pp) forward and backward columns per stage
  std::vector<std::vector<int>> start;  // (pp, list size) start column of each instruction
                                        // (-1: never reached, the replay deadlocked)
  std::vector<int> blocked_at;          // (pp) index of the receive a stage is stuck on, or -1
  bool complete() const;
  int idle(int stage) const { return makespan - busy[stage]; }
  double bubble(int stage) const;  // idle / busy of `stage`
};
// backward_cost: a backward's cost in forwards, rounded to whole columns (at least 1); throws
// tessera::Error unless it is a positive number.
Timeline replay_timeline(const Schedule& s, double backward_cost = 2.0);

// The schedule as a text timeline, one column per forward: a header, a legend, a time ruler and
// one row per stage (A-Z: forward of micro-batch 0-25, a-z: its backward, '.': idle; with v > 1 a
// row of local chunk digits under each stage), wrapped in blocks of 160 columns; then per stage
// the busy and idle columns, the bubble fraction (idle / busy) against ideal_bubble_fraction and
// max_in_flight against in_flight_formula. docs/plan.md shows an example.
std::string draw_timeline(const Schedule& s, double backward_cost = 2.0);

}  // namespace tessera::parallel
