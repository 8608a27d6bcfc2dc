#include "tessera/parallel/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::parallel {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneF1B:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneF1B;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  throw Error(fmt::format("unknown pipeline schedule '{}'", name),
              "use one of gpipe, 1f1b, interleaved");
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Forward:
      return "F";
    case OpKind::Backward:
      return "B";
    case OpKind::SendAct:
      return "SA";
    case OpKind::RecvAct:
      return "RA";
    case OpKind::SendGrad:
      return "SG";
    case OpKind::RecvGrad:
      return "RG";
    case OpKind::OptimizerStep:
      return "OPT";
  }
  return "?";
}

std::string describe(const Instr& i) {
  switch (i.op) {
    case OpKind::OptimizerStep:
      return "OPT";
    case OpKind::Forward:
    case OpKind::Backward:
      return fmt::format("{}({},{})", op_name(i.op), i.mb, i.chunk);
    case OpKind::SendAct:
    case OpKind::SendGrad:
      return fmt::format("{}({},{})->{}", op_name(i.op), i.mb, i.chunk, i.peer);
    case OpKind::RecvAct:
    case OpKind::RecvGrad:
      return fmt::format("{}({},{})<-{}", op_name(i.op), i.mb, i.chunk, i.peer);
  }
  return "?";
}

void validate(const ScheduleSpec& s) {
  if (s.pp < 1 || s.m < 1 || s.v < 1)
    throw Error(
        fmt::format("pipeline schedule needs pp, micro-batches and chunks >= 1 (got pp={} "
                    "m={} v={})",
                    s.pp, s.m, s.v));
  if (s.kind != ScheduleKind::Interleaved && s.v != 1)
    throw Error(fmt::format("the {} schedule has one chunk per stage (got v={})",
                            schedule_name(s.kind), s.v),
                "use the interleaved schedule for v > 1");
  if (s.kind == ScheduleKind::Interleaved) {
    if (s.v < 2)
      throw Error("the interleaved schedule needs v >= 2 chunks per stage",
                  "use 1f1b for one chunk per stage");
    if (s.m % s.pp != 0)
      throw Error(fmt::format("the interleaved schedule needs micro-batches divisible by pp (m={}, "
                              "pp={})",
                              s.m, s.pp),
                  "change the micro-batch count or use 1f1b");
  }
}

namespace {

// Appends a forward of (mb, chunk) with its receive before and its send after.
void emit_forward(std::vector<Instr>& out, const ScheduleSpec& s, int stage, int mb, int chunk) {
  const int g = chunk * s.pp + stage, last = s.pp * s.v - 1;
  const int prev = (stage - 1 + s.pp) % s.pp, next = (stage + 1) % s.pp;
  if (g > 0) out.push_back({OpKind::RecvAct, mb, chunk, prev});
  out.push_back({OpKind::Forward, mb, chunk, -1});
  if (g < last) out.push_back({OpKind::SendAct, mb, chunk, next});
}

void emit_backward(std::vector<Instr>& out, const ScheduleSpec& s, int stage, int mb, int chunk) {
  const int g = chunk * s.pp + stage, last = s.pp * s.v - 1;
  const int prev = (stage - 1 + s.pp) % s.pp, next = (stage + 1) % s.pp;
  if (g < last) out.push_back({OpKind::RecvGrad, mb, chunk, next});
  out.push_back({OpKind::Backward, mb, chunk, -1});
  if (g > 0) out.push_back({OpKind::SendGrad, mb, chunk, prev});
}

}  // namespace

std::vector<Instr> make_stage_schedule(const ScheduleSpec& s, int stage) {
  validate(s);
  TESSERA_CHECK(stage >= 0 && stage < s.pp, "stage {} of {}", stage, s.pp);
  std::vector<Instr> out;
  out.reserve(static_cast<std::size_t>(s.m) * s.v * 6 + 1);
  switch (s.kind) {
    case ScheduleKind::GPipe:
      for (int mb = 0; mb < s.m; ++mb) emit_forward(out, s, stage, mb, 0);
      for (int mb = 0; mb < s.m; ++mb) emit_backward(out, s, stage, mb, 0);
      break;
    case ScheduleKind::OneF1B: {
      const int warmup = std::min(s.pp - stage - 1, s.m);
      int f = 0, b = 0;
      for (; f < warmup; ++f) emit_forward(out, s, stage, f, 0);
      for (; f < s.m; ++f, ++b) {
        emit_forward(out, s, stage, f, 0);
        emit_backward(out, s, stage, b, 0);
      }
      for (; b < s.m; ++b) emit_backward(out, s, stage, b, 0);
      break;
    }
    case ScheduleKind::Interleaved: {
      // Megatron-LM's forward_backward_pipelining_with_interleaving: virtual micro-batch k
      // (0 .. m*v-1) runs micro-batch (k / (pp*v))*pp + k % pp on chunk (k / pp) % v going
      // forward, and on chunk v-1 - (k / pp) % v going backward.
      const int total = s.m * s.v, group = s.pp * s.v;
      auto mb_of = [&](int k) { return (k / group) * s.pp + k % s.pp; };
      auto fchunk = [&](int k) { return (k % group) / s.pp; };
      auto bchunk = [&](int k) { return s.v - 1 - (k % group) / s.pp; };
      int warmup = (s.pp - stage - 1) * 2 + (s.v - 1) * s.pp;
      warmup = std::min(warmup, total);
      for (int k = 0; k < warmup; ++k) emit_forward(out, s, stage, mb_of(k), fchunk(k));
      const int steady = total - warmup;
      for (int k = 0; k < steady; ++k) {
        emit_forward(out, s, stage, mb_of(k + warmup), fchunk(k + warmup));
        emit_backward(out, s, stage, mb_of(k), bchunk(k));
      }
      for (int k = steady; k < total; ++k) emit_backward(out, s, stage, mb_of(k), bchunk(k));
      break;
    }
  }
  out.push_back({OpKind::OptimizerStep, -1, 0, -1});
  return out;
}

Schedule make_schedule(const ScheduleSpec& s) {
  validate(s);
  Schedule sch;
  sch.spec = s;
  sch.ranks.reserve(s.pp);
  for (int st = 0; st < s.pp; ++st) sch.ranks.push_back(make_stage_schedule(s, st));
  return sch;
}

int max_in_flight(const std::vector<Instr>& list) {
  int cur = 0, best = 0;
  for (const auto& i : list) {
    if (i.op == OpKind::Forward) best = std::max(best, ++cur);
    if (i.op == OpKind::Backward) --cur;
  }
  return best;
}

int in_flight_formula(const ScheduleSpec& s, int stage) {
  switch (s.kind) {
    case ScheduleKind::GPipe:
      return s.m;
    case ScheduleKind::OneF1B:
      return std::min(s.pp - stage, s.m);
    case ScheduleKind::Interleaved:
      return std::min((s.pp - stage - 1) * 2 + (s.v - 1) * s.pp + 1, s.m * s.v);
  }
  return s.m;
}

double ideal_bubble_fraction(const ScheduleSpec& s) {
  return static_cast<double>(s.pp - 1) / (static_cast<double>(s.v) * s.m);
}

namespace {

int message_key(const Schedule& s, int stage, const Instr& in) {
  return parallel::message_key(s.spec, stage, in);
}

bool is_send(OpKind k) {
  return k == OpKind::SendAct || k == OpKind::SendGrad;
}
bool is_recv(OpKind k) {
  return k == OpKind::RecvAct || k == OpKind::RecvGrad;
}

struct Replayed {
  std::vector<std::size_t> pc;          // (pp) next instruction of each stage
  std::vector<int> clock, busy;         // (pp)
  std::vector<std::vector<int>> start;  // (pp, list size)
};

// Runs the lists with non-blocking sends and blocking receives, a forward costing tf and a
// backward tb; messages are free. A stage runs until it blocks on a receive, and is woken by the
// send it waits for: each instruction is visited once.
Replayed replay_lists(const Schedule& s, int tf, int tb) {
  const int pp = static_cast<int>(s.ranks.size());
  const int nkeys = 2 * s.spec.pp * s.spec.v * s.spec.m;
  Replayed r;
  r.pc.assign(pp, 0);
  r.clock.assign(pp, 0);
  r.busy.assign(pp, 0);
  r.start.resize(pp);
  for (int st = 0; st < pp; ++st) r.start[st].assign(s.ranks[st].size(), -1);
  std::vector<int> pending(nkeys, 0), arrival(nkeys, 0), waiter(nkeys, -1);
  std::vector<int> ready(pp);
  std::iota(ready.begin(), ready.end(), 0);
  while (!ready.empty()) {
    const int st = ready.back();
    ready.pop_back();
    const auto& list = s.ranks[st];
    auto& pc = r.pc[st];
    int& clock = r.clock[st];
    for (; pc < list.size(); ++pc) {
      const Instr& in = list[pc];
      if (is_recv(in.op)) {
        const int k = message_key(s, st, in);
        if (k < 0) break;  // nothing can ever send it
        if (pending[k] == 0) {
          waiter[k] = st;
          break;
        }
        --pending[k];
        clock = std::max(clock, arrival[k]);
        r.start[st][pc] = clock;
      } else if (is_send(in.op)) {
        r.start[st][pc] = clock;
        const int k = message_key(s, st, in);
        if (k < 0) continue;
        ++pending[k];
        arrival[k] = std::max(arrival[k], clock);
        if (waiter[k] >= 0) {
          ready.push_back(waiter[k]);
          waiter[k] = -1;
        }
      } else {
        r.start[st][pc] = clock;
        const int cost = in.op == OpKind::Forward ? tf : in.op == OpKind::Backward ? tb : 0;
        clock += cost;
        r.busy[st] += cost;
      }
    }
  }
  return r;
}

const char* op_long_name(OpKind k) {
  switch (k) {
    case OpKind::Forward:
      return "Forward";
    case OpKind::Backward:
      return "Backward";
    case OpKind::SendAct:
      return "SendAct";
    case OpKind::RecvAct:
      return "RecvAct";
    case OpKind::SendGrad:
      return "SendGrad";
    case OpKind::RecvGrad:
      return "RecvGrad";
    case OpKind::OptimizerStep:
      return "OptimizerStep";
  }
  return "?";
}

}  // namespace

namespace {

// What the checks of one schedule share: the problems found, and the sends and receives of
// every message key (counted by the per-stage scan, used by the matching and deadlock checks).
struct Checker {
  const Schedule& s;
  ScheduleCheck& r;
  int pp, m, v, last;
  std::vector<int> sends, recvs;
  std::vector<std::pair<int, int>> send_at;  // (stage, index) of a message's first send

  Checker(const Schedule& sched, ScheduleCheck& result)
      : s(sched),
        r(result),
        pp(sched.spec.pp),
        m(sched.spec.m),
        v(sched.spec.v),
        last(sched.spec.pp * sched.spec.v - 1),
        sends(2 * pp * v * m, 0),
        recvs(2 * pp * v * m, 0),
        send_at(2 * pp * v * m, {-1, -1}) {}
  std::string at(int st, std::size_t i) const {
    return fmt::format("stage {}, instruction {} ({})", st, i, describe(s.ranks[st][i]));
  }
  void add(std::string p) { r.problems.push_back(std::move(p)); }
};

// Per stage: the first position and the count of each op of each (micro-batch, local chunk).
constexpr int k_ops = 6;  // Forward .. RecvGrad
struct Slot {
  int first[k_ops] = {-1, -1, -1, -1, -1, -1};
  int count[k_ops] = {};
};

// An instruction's op, micro-batch and chunk are in range (else reported).
bool in_range(Checker& c, int st, std::size_t i, const Instr& in) {
  if (static_cast<int>(in.op) >= k_ops) {
    c.add(c.at(st, i) + ": unknown op");
    return false;
  }
  if (in.mb < 0 || in.mb >= c.m) {
    c.add(c.at(st, i) + fmt::format(": micro-batch out of range 0..{}", c.m - 1));
    return false;
  }
  if (in.chunk < 0 || in.chunk >= c.v) {
    c.add(c.at(st, i) + fmt::format(": chunk out of range 0..{}", c.v - 1));
    return false;
  }
  return true;
}

// A send or receive: it has a message to carry and the right peer; counts the message. False
// when the chunk has no such message (then it is not counted as the chunk's op either).
bool scan_message(Checker& c, int st, std::size_t i, const Instr& in) {
  const int k = message_key(c.s, st, in);
  if (k < 0) {
    c.add(c.at(st, i) +
          (in.op == OpKind::SendAct    ? ": the last global chunk sends no activation"
           : in.op == OpKind::RecvAct  ? ": the first global chunk receives no activation"
           : in.op == OpKind::SendGrad ? ": the first global chunk sends no gradient"
                                       : ": the last global chunk receives no gradient "
                                         "(it starts from the loss)"));
    return false;
  }
  const int g = c.s.global_chunk(st, in.chunk);
  const bool towards_next = in.op == OpKind::SendAct || in.op == OpKind::RecvGrad;
  const int other = towards_next ? g + 1 : g - 1;
  if (in.peer != other % c.pp)
    c.add(c.at(st, i) +
          fmt::format(": peer should be stage {} (it holds global chunk {})", other % c.pp, other));
  if (is_send(in.op)) {
    if (c.sends[k]++ == 0) c.send_at[k] = {st, static_cast<int>(i)};
  } else {
    ++c.recvs[k];
  }
  return true;
}

// One stage's list, instruction by instruction: the optimizer step last and once, ranges,
// message peers, duplicates; fills the stage's slots and the message counts.
void scan_instructions(Checker& c, int st, std::vector<Slot>& slots) {
  const auto& list = c.s.ranks[st];
  int opts = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Instr& in = list[i];
    if (in.op == OpKind::OptimizerStep) {
      if (++opts > 1)
        c.add(c.at(st, i) + ": a second OptimizerStep");
      else if (i + 1 != list.size())
        c.add(c.at(st, i) + ": OptimizerStep is not the last instruction");
      continue;
    }
    if (!in_range(c, st, i, in)) continue;
    if ((is_send(in.op) || is_recv(in.op)) && !scan_message(c, st, i, in)) continue;
    Slot& sl = slots[static_cast<std::size_t>(in.mb) * c.v + in.chunk];
    const int o = static_cast<int>(in.op);
    if (sl.count[o]++ == 0)
      sl.first[o] = static_cast<int>(i);
    else
      c.add(c.at(st, i) + fmt::format(": a second {} of micro-batch {} chunk {} (first at "
                                      "instruction {})",
                                      op_long_name(in.op), in.mb, in.chunk, sl.first[o]));
  }
  if (opts == 0) c.add(fmt::format("stage {}: no OptimizerStep at the end of the list", st));
}

// One stage's order: every (micro-batch, chunk) has its forward and backward, the backward after
// the forward, receives before and sends after the op they feed.
void check_order(Checker& c, int st, const std::vector<Slot>& slots) {
  const int pp = c.pp, last = c.last;
  for (int mb = 0; mb < c.m; ++mb)
    for (int ch = 0; ch < c.v; ++ch) {
      const Slot& sl = slots[static_cast<std::size_t>(mb) * c.v + ch];
      const int g = c.s.global_chunk(st, ch);
      auto first = [&](OpKind k) { return sl.first[static_cast<int>(k)]; };
      const int f = first(OpKind::Forward), b = first(OpKind::Backward);
      if (f < 0) c.add(fmt::format("stage {}: no Forward of micro-batch {} chunk {}", st, mb, ch));
      if (b < 0) c.add(fmt::format("stage {}: no Backward of micro-batch {} chunk {}", st, mb, ch));
      if (f >= 0 && b >= 0 && b < f)
        c.add(c.at(st, b) + fmt::format(": Backward before its Forward (instruction {})", f));
      if (f >= 0) {
        const int ra = first(OpKind::RecvAct), sa = first(OpKind::SendAct);
        if (g > 0 && ra < 0)
          c.add(c.at(st, f) + fmt::format(": no RecvAct from stage {} before it", (g - 1) % pp));
        if (g > 0 && ra > f)
          c.add(c.at(st, ra) + fmt::format(": RecvAct after its Forward (instruction {})", f));
        if (g < last && sa < 0)
          c.add(c.at(st, f) + fmt::format(": no SendAct to stage {} after it", (g + 1) % pp));
        if (g < last && sa >= 0 && sa < f)
          c.add(c.at(st, sa) + fmt::format(": SendAct before its Forward (instruction {})", f));
      }
      if (b >= 0) {
        const int rg = first(OpKind::RecvGrad), sg = first(OpKind::SendGrad);
        if (g < last && rg < 0)
          c.add(c.at(st, b) + fmt::format(": no RecvGrad from stage {} before it", (g + 1) % pp));
        if (g < last && rg > b)
          c.add(c.at(st, rg) + fmt::format(": RecvGrad after its Backward (instruction {})", b));
        if (g > 0 && sg < 0)
          c.add(c.at(st, b) + fmt::format(": no SendGrad to stage {} after it", (g - 1) % pp));
        if (g > 0 && sg >= 0 && sg < b)
          c.add(c.at(st, sg) + fmt::format(": SendGrad before its Backward (instruction {})", b));
      }
    }
}

// Every send has a receive and every receive a send. (Several of either for one message come
// from one (stage, chunk) and were reported as duplicates by the scan.)
void check_matching(Checker& c) {
  const auto& s = c.s;
  for (int st = 0; st < c.pp; ++st) {
    const auto& list = s.ranks[st];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Instr& in = list[i];
      const int k = message_key(s, st, in);
      if (k < 0) continue;
      const int g = s.global_chunk(st, in.chunk);
      const bool grad = in.op == OpKind::SendGrad || in.op == OpKind::RecvGrad;
      if (is_send(in.op) && c.recvs[k] == 0) {
        const int to = grad ? g - 1 : g + 1;
        const Instr want{grad ? OpKind::RecvGrad : OpKind::RecvAct, in.mb, to / c.pp, st};
        c.add(c.at(st, i) +
              fmt::format(": no matching receive (stage {} has no {})", to % c.pp, describe(want)));
      }
      if (is_recv(in.op) && c.sends[k] == 0) {
        const int from = grad ? g + 1 : g - 1;
        const Instr want{grad ? OpKind::SendGrad : OpKind::SendAct, in.mb, from / c.pp, st};
        c.add(c.at(st, i) +
              fmt::format(": no matching send (stage {} has no {})", from % c.pp, describe(want)));
      }
    }
  }
}

// Deadlock freedom: replay and report where each unfinished stage is stuck.
void check_deadlock(Checker& c) {
  const auto& s = c.s;
  const Replayed rep = replay_lists(s, 1, 1);
  for (int st = 0; st < c.pp; ++st) {
    const std::size_t i = rep.pc[st];
    if (i == s.ranks[st].size()) continue;
    const int k = message_key(s, st, s.ranks[st][i]);
    if (k < 0 || c.sends[k] == 0) {
      c.add(c.at(st, i) + ": blocked for ever, nothing sends it");
      continue;
    }
    const auto [ps, j] = c.send_at[k];
    const std::string send = describe(s.ranks[ps][j]);
    if (rep.pc[ps] > static_cast<std::size_t>(j))
      c.add(c.at(st, i) +
            fmt::format(": blocked, its send {} (stage {}, instruction {}) was taken by "
                        "another receive",
                        send, ps, j));
    else
      c.add(c.at(st, i) +
            fmt::format(": blocked (deadlock), waits for {} at stage {} instruction {}, "
                        "which stage {} never reaches (it blocks at instruction {})",
                        send, ps, j, ps, rep.pc[ps]));
  }
}

}  // namespace

ScheduleCheck check_schedule(const Schedule& s) {
  ScheduleCheck r;
  const auto& sp = s.spec;
  auto done = [&r] {
    r.ok = r.problems.empty();
    return r;
  };
  if (sp.pp < 1 || sp.m < 1 || sp.v < 1) {
    r.problems.push_back(
        fmt::format("spec: pp, m and v must be >= 1 (got pp={} m={} v={})", sp.pp, sp.m, sp.v));
    return done();
  }
  if (static_cast<int>(s.ranks.size()) != sp.pp) {
    r.problems.push_back(fmt::format("spec: {} stage lists for pp={}", s.ranks.size(), sp.pp));
    return done();
  }
  Checker c(s, r);
  for (int st = 0; st < sp.pp; ++st) {
    std::vector<Slot> slots(static_cast<std::size_t>(sp.m) * sp.v);
    scan_instructions(c, st, slots);
    check_order(c, st, slots);
  }
  check_matching(c);
  check_deadlock(c);
  return done();
}

int message_key(const ScheduleSpec& sp, int stage, const Instr& in) {
  const int nchunks = sp.pp * sp.v;
  if (in.mb < 0 || in.mb >= sp.m || in.chunk < 0 || in.chunk >= sp.v) return -1;
  const int g = in.chunk * sp.pp + stage;  // Schedule::global_chunk
  int grad = 0, consumer = -1;
  switch (in.op) {
    case OpKind::SendAct:
      consumer = g + 1;
      break;
    case OpKind::RecvAct:
      consumer = g > 0 ? g : -1;
      break;
    case OpKind::SendGrad:
      grad = 1, consumer = g - 1;
      break;
    case OpKind::RecvGrad:
      grad = 1, consumer = g < nchunks - 1 ? g : -1;
      break;
    default:
      return -1;
  }
  if (consumer < 0 || consumer >= nchunks) return -1;
  return (grad * nchunks + consumer) * sp.m + in.mb;
}

bool Timeline::complete() const {
  return std::all_of(blocked_at.begin(), blocked_at.end(), [](int b) { return b < 0; });
}

double Timeline::bubble(int stage) const {
  return busy[stage] > 0 ? static_cast<double>(idle(stage)) / busy[stage] : 0.0;
}

Timeline replay_timeline(const Schedule& s, double backward_cost) {
  const auto& sp = s.spec;
  TESSERA_CHECK(sp.pp >= 1 && sp.m >= 1 && sp.v >= 1 && static_cast<int>(s.ranks.size()) == sp.pp,
                "schedule pp={} m={} v={} with {} lists", sp.pp, sp.m, sp.v, s.ranks.size());
  if (!std::isfinite(backward_cost) || backward_cost <= 0)
    throw Error(
        fmt::format("backward cost must be a positive number of forwards (got {})", backward_cost));
  Timeline t;
  t.forward_cols = 1;
  t.backward_cols = std::max(1, static_cast<int>(std::lround(std::min(backward_cost, 1e6))));
  auto r = replay_lists(s, t.forward_cols, t.backward_cols);
  t.busy = std::move(r.busy);
  t.start = std::move(r.start);
  t.makespan = r.clock.empty() ? 0 : *std::max_element(r.clock.begin(), r.clock.end());
  t.blocked_at.assign(sp.pp, -1);
  for (int st = 0; st < sp.pp; ++st)
    if (r.pc[st] < s.ranks[st].size()) t.blocked_at[st] = static_cast<int>(r.pc[st]);
  return t;
}

namespace {

constexpr int k_timeline_width = 160;  // columns per block of the drawn timeline

// Labels every 10th column that has room for its label: "0         10        20".
std::string time_ruler(int from, int to) {
  std::string r(static_cast<std::size_t>(to - from), ' ');
  for (int t = (from + 9) / 10 * 10; t < to; t += 10) {
    const std::string label = std::to_string(t);
    if (t - from + label.size() <= r.size()) r.replace(t - from, label.size(), label);
  }
  while (!r.empty() && r.back() == ' ') r.pop_back();
  return r;
}

}  // namespace

namespace {

// The title and the legend.
std::string timeline_header(const ScheduleSpec& sp, const Timeline& t) {
  const int m = sp.m;
  std::string out = fmt::format(
      "{} pp={} m={} v={}: one column per forward of a chunk, a backward takes {} column{}, "
      "messages are free\n",
      schedule_name(sp.kind), sp.pp, m, sp.v, t.backward_cols, t.backward_cols == 1 ? "" : "s");
  const int letters = std::min(m, 26);
  auto span = [&](char a) {
    return letters == 1 ? std::string(1, a) : fmt::format("{}-{}", a, char(a + letters - 1));
  };
  out += fmt::format("legend: {} forward of micro-batch {}, {} its backward, . idle", span('A'),
                     letters == 1 ? "0" : fmt::format("0-{}", letters - 1), span('a'));
  if (m > 26) out += " (micro-batch 26 is A again, 27 is B, ...)";
  out += "\n";
  if (sp.v > 1)
    out += "chunk rows: the local chunk run in each column (global chunk = chunk * pp + stage)\n";
  return out;
}

// Each stage's row of letters (micro-batches) and, with v > 1, its row of chunk digits.
struct TimelineRows {
  std::vector<std::string> ops, chunks;
};
TimelineRows timeline_rows(const Schedule& s, const Timeline& t) {
  const int pp = s.spec.pp;
  const bool chunked = s.spec.v > 1;
  TimelineRows r{std::vector<std::string>(pp, std::string(t.makespan, '.')),
                 std::vector<std::string>(pp)};
  if (chunked) r.chunks.assign(pp, std::string(t.makespan, ' '));
  for (int st = 0; st < pp; ++st)
    for (std::size_t i = 0; i < s.ranks[st].size(); ++i) {
      const Instr& in = s.ranks[st][i];
      const int at = t.start[st][i];
      if (at < 0 || (in.op != OpKind::Forward && in.op != OpKind::Backward)) continue;
      const bool fwd = in.op == OpKind::Forward;
      const int len = fwd ? t.forward_cols : t.backward_cols;
      const char letter = static_cast<char>((fwd ? 'A' : 'a') + ((in.mb % 26) + 26) % 26);
      const char digit = static_cast<char>('0' + ((in.chunk % 10) + 10) % 10);
      for (int c = at; c < at + len && c < t.makespan; ++c) {
        r.ops[st][c] = letter;
        if (chunked) r.chunks[st][c] = digit;
      }
    }
  return r;
}

// The rows drawn in blocks of k_timeline_width columns under a time ruler, then any deadlock.
std::string timeline_blocks(const Schedule& s, const Timeline& t, const TimelineRows& r,
                            int label) {
  const int pp = s.spec.pp;
  std::string out;
  if (t.makespan > k_timeline_width)
    out += fmt::format("{} columns, drawn in blocks of {}\n", t.makespan, k_timeline_width);
  for (int from = 0; from < t.makespan; from += k_timeline_width) {
    const int to = std::min(t.makespan, from + k_timeline_width);
    if (from > 0) out += "\n";
    out += fmt::format("{:<{}} |{}\n", "time", label, time_ruler(from, to));
    for (int st = 0; st < pp; ++st) {
      out += fmt::format("{:<{}} |{}\n", fmt::format("stage {}", st), label,
                         r.ops[st].substr(from, to - from));
      if (s.spec.v > 1) {
        std::string c = r.chunks[st].substr(from, to - from);
        while (!c.empty() && c.back() == ' ') c.pop_back();
        out += fmt::format("{:>{}} |{}\n", "chunk", label, c);
      }
    }
  }
  for (int st = 0; st < pp; ++st)
    if (t.blocked_at[st] >= 0)
      out += fmt::format("deadlock: stage {} never gets past instruction {} ({})\n", st,
                         t.blocked_at[st], describe(s.ranks[st][t.blocked_at[st]]));
  return out;
}

// Busy, idle, bubble and micro-batches in flight per stage, and the worst bubble against the ideal.
std::string timeline_numbers(const Schedule& s, const Timeline& t, int label) {
  const auto& sp = s.spec;
  std::string out = fmt::format("\n{:<{}}  busy  idle  bubble  in flight (formula)\n", "", label);
  double worst = 0;
  for (int st = 0; st < sp.pp; ++st) {
    worst = std::max(worst, t.bubble(st));
    out += fmt::format("{:<{}} {:>5} {:>5} {:>7.3f}  {:>9} ({})\n", fmt::format("stage {}", st),
                       label, t.busy[st], t.idle(st), t.bubble(st), max_in_flight(s.ranks[st]),
                       in_flight_formula(sp, st));
  }
  out += fmt::format("bubble (idle / busy): {:.3f} measured on the worst stage, ideal {:.3f} = ",
                     worst, ideal_bubble_fraction(sp));
  out += sp.v > 1 ? fmt::format("(pp-1)/(v*m) = {}/{}\n", sp.pp - 1, sp.v * sp.m)
                  : fmt::format("(pp-1)/m = {}/{}\n", sp.pp - 1, sp.m);
  return out;
}

}  // namespace

std::string draw_timeline(const Schedule& s, double backward_cost) {
  const Timeline t = replay_timeline(s, backward_cost);
  const int label = static_cast<int>(fmt::format("stage {}", s.spec.pp - 1).size());
  return timeline_header(s.spec, t) + timeline_blocks(s, t, timeline_rows(s, t), label) +
         timeline_numbers(s, t, label);
}

}  // namespace tessera::parallel
