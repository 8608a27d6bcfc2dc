// Pipeline schedules (parallel/schedule.hpp): the per-rank instruction lists are complete,
// ordered, deadlock-free under non-blocking sends and blocking receives, and have the in-flight
// counts and bubble fractions of the literature.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "tessera/core/error.hpp"
#include "tessera/parallel/schedule.hpp"

using namespace tessera::parallel;

namespace {

struct Replay {
  bool deadlock = false;
  double makespan = 0;
  std::vector<double> busy;  // per stage
};

// Replays the lists: forward costs tf per chunk, backward tb, messages are free and instant,
// sends never block, a receive waits for its send. Also checks every message is matched once.
Replay replay(const Schedule& s, double tf, double tb) {
  const int pp = s.spec.pp, last = pp * s.spec.v - 1;
  std::vector<std::size_t> pc(pp, 0);
  std::vector<double> clock(pp, 0.0);
  Replay r;
  r.busy.assign(pp, 0.0);
  // (is_grad, mb, consumer global chunk) -> time the message is available
  std::map<std::tuple<int, int, int>, double> sent;
  std::set<std::tuple<int, int, int>> received;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int st = 0; st < pp; ++st) {
      const auto& list = s.ranks[st];
      while (pc[st] < list.size()) {
        const Instr& in = list[pc[st]];
        const int g = s.global_chunk(st, in.chunk);
        if (in.op == OpKind::RecvAct || in.op == OpKind::RecvGrad) {
          auto key = std::make_tuple(in.op == OpKind::RecvGrad ? 1 : 0, in.mb, g);
          auto it = sent.find(key);
          if (it == sent.end()) break;  // blocked
          EXPECT_TRUE(received.insert(key).second) << "received twice: " << describe(in);
          clock[st] = std::max(clock[st], it->second);
        } else if (in.op == OpKind::SendAct || in.op == OpKind::SendGrad) {
          const bool grad = in.op == OpKind::SendGrad;
          const int consumer = grad ? g - 1 : g + 1;
          EXPECT_TRUE(consumer >= 0 && consumer <= last) << describe(in);
          EXPECT_EQ(in.peer, consumer % pp) << describe(in);
          auto key = std::make_tuple(grad ? 1 : 0, in.mb, consumer);
          EXPECT_TRUE(sent.emplace(key, clock[st]).second) << "sent twice: " << describe(in);
        } else if (in.op == OpKind::Forward) {
          clock[st] += tf;
          r.busy[st] += tf;
        } else if (in.op == OpKind::Backward) {
          clock[st] += tb;
          r.busy[st] += tb;
        }
        ++pc[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < pp; ++st) {
    if (pc[st] != s.ranks[st].size()) r.deadlock = true;
    r.makespan = std::max(r.makespan, clock[st]);
  }
  EXPECT_EQ(sent.size(), received.size());
  return r;
}

std::vector<ScheduleSpec> all_specs() {
  std::vector<ScheduleSpec> specs;
  for (int pp : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      specs.push_back({ScheduleKind::GPipe, pp, m, 1});
      specs.push_back({ScheduleKind::OneF1B, pp, m, 1});
      for (int v : {2, 3, 4})
        if (m % pp == 0) specs.push_back({ScheduleKind::Interleaved, pp, m, v});
    }
  return specs;
}

std::string name(const ScheduleSpec& s) {
  return std::string(schedule_name(s.kind)) + " pp=" + std::to_string(s.pp) +
         " m=" + std::to_string(s.m) + " v=" + std::to_string(s.v);
}

}  // namespace

TEST(Schedule, EveryMicroBatchChunkRunsOnceForwardBeforeBackward) {
  for (const auto& spec : all_specs()) {
    auto s = make_schedule(spec);
    ASSERT_EQ(static_cast<int>(s.ranks.size()), spec.pp);
    for (int st = 0; st < spec.pp; ++st) {
      std::set<std::pair<int, int>> fwd, bwd;
      const auto& list = s.ranks[st];
      ASSERT_FALSE(list.empty());
      EXPECT_EQ(list.back().op, OpKind::OptimizerStep) << name(spec);
      for (const auto& in : list) {
        if (in.op == OpKind::Forward) {
          EXPECT_TRUE(fwd.insert({in.mb, in.chunk}).second) << name(spec) << " " << describe(in);
        } else if (in.op == OpKind::Backward) {
          EXPECT_TRUE(fwd.count({in.mb, in.chunk})) << name(spec) << " backward before forward";
          EXPECT_TRUE(bwd.insert({in.mb, in.chunk}).second) << name(spec);
        }
      }
      EXPECT_EQ(static_cast<int>(fwd.size()), spec.m * spec.v) << name(spec);
      EXPECT_EQ(static_cast<int>(bwd.size()), spec.m * spec.v) << name(spec);
      // Each stage's list equals what one rank would build alone.
      EXPECT_EQ(list, make_stage_schedule(spec, st));
    }
  }
}

TEST(Schedule, NoDeadlockAndEveryMessageMatched) {
  for (const auto& spec : all_specs()) {
    auto r = replay(make_schedule(spec), 1.0, 2.0);
    EXPECT_FALSE(r.deadlock) << name(spec);
  }
}

TEST(Schedule, InFlightMicroBatches) {
  for (const auto& spec : all_specs()) {
    auto s = make_schedule(spec);
    for (int st = 0; st < spec.pp; ++st) {
      const int n = max_in_flight(s.ranks[st]);
      EXPECT_EQ(n, in_flight_formula(spec, st)) << name(spec) << " stage " << st;
      if (spec.kind == ScheduleKind::GPipe) {
        EXPECT_EQ(n, spec.m);
      }
      if (spec.kind == ScheduleKind::OneF1B) {
        EXPECT_LE(n, spec.pp - st);
      }
    }
  }
}

TEST(Schedule, BubbleFractionMatchesTheory) {
  // Unit forward cost per full stage (1/v per chunk), backward twice that; free messages.
  for (const auto& spec : all_specs()) {
    const double tf = 1.0 / spec.v, tb = 2.0 / spec.v;
    auto r = replay(make_schedule(spec), tf, tb);
    const double ideal = 3.0 * spec.m;  // per stage
    const double bubble = (r.makespan - ideal) / ideal;
    EXPECT_NEAR(bubble, ideal_bubble_fraction(spec), 1e-9) << name(spec);
    for (double b : r.busy) EXPECT_NEAR(b, ideal, 1e-9);
  }
}

TEST(Schedule, InterleavedLessBubbleMoreMessages) {
  ScheduleSpec a{ScheduleKind::OneF1B, 4, 8, 1}, b{ScheduleKind::Interleaved, 4, 8, 2};
  auto count_sends = [](const Schedule& s) {
    int n = 0;
    for (const auto& l : s.ranks)
      for (const auto& i : l) n += i.op == OpKind::SendAct || i.op == OpKind::SendGrad;
    return n;
  };
  auto sa = make_schedule(a), sb = make_schedule(b);
  EXPECT_LT(ideal_bubble_fraction(b), ideal_bubble_fraction(a));
  // 1F1B: (pp-1) boundaries x m x 2 directions; interleaved: (pp*v-1) boundaries.
  EXPECT_EQ(count_sends(sa), 3 * 8 * 2);
  EXPECT_EQ(count_sends(sb), 7 * 8 * 2);
}

TEST(Schedule, OneF1BShapeOnTwoStages) {
  auto s = make_schedule({ScheduleKind::OneF1B, 2, 3, 1});
  std::string a, b;
  for (const auto& i : s.ranks[0]) a += describe(i) + " ";
  for (const auto& i : s.ranks[1]) b += describe(i) + " ";
  EXPECT_EQ(a,
            "F(0,0) SA(0,0)->1 F(1,0) SA(1,0)->1 RG(0,0)<-1 B(0,0) F(2,0) SA(2,0)->1 RG(1,0)<-1 "
            "B(1,0) RG(2,0)<-1 B(2,0) OPT ");
  EXPECT_EQ(b,
            "RA(0,0)<-0 F(0,0) B(0,0) SG(0,0)->0 RA(1,0)<-0 F(1,0) B(1,0) SG(1,0)->0 RA(2,0)<-0 "
            "F(2,0) B(2,0) SG(2,0)->0 OPT ");
}

TEST(Schedule, InvalidSpecsAreRejected) {
  EXPECT_THROW(make_schedule({ScheduleKind::OneF1B, 0, 4, 1}), tessera::Error);
  EXPECT_THROW(make_schedule({ScheduleKind::OneF1B, 2, 4, 2}), tessera::Error);
  EXPECT_THROW(make_schedule({ScheduleKind::Interleaved, 2, 4, 1}), tessera::Error);
  EXPECT_THROW(make_schedule({ScheduleKind::Interleaved, 4, 6, 2}), tessera::Error);
  EXPECT_THROW(parse_schedule("zigzag"), tessera::Error);
  EXPECT_EQ(parse_schedule("interleaved"), ScheduleKind::Interleaved);
}
