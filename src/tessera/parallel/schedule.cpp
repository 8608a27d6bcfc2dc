#include "tessera/parallel/schedule.hpp"

#include <algorithm>

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

}  // namespace tessera::parallel
