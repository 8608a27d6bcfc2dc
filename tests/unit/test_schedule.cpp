// Pipeline schedules (parallel/schedule.hpp): the per-rank instruction lists are complete,
// ordered, deadlock-free under non-blocking sends and blocking receives, and have the in-flight
// counts and bubble fractions of the literature.
#include <gtest/gtest.h>

#include <algorithm>
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

namespace {

std::string joined(const ScheduleCheck& c) {
  std::string s;
  for (const auto& p : c.problems) s += p + "\n";
  return s;
}

// Index of the first instruction of `list` equal to `in`.
std::size_t find(const std::vector<Instr>& list, const Instr& in) {
  auto it = std::find(list.begin(), list.end(), in);
  EXPECT_NE(it, list.end()) << describe(in);
  return static_cast<std::size_t>(it - list.begin());
}

// Expects check_schedule to fail with a problem containing every string of `needles`.
void expect_problem(const Schedule& s, const std::vector<std::string>& needles) {
  auto c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  ASSERT_FALSE(c.problems.empty());
  EXPECT_TRUE(std::any_of(c.problems.begin(), c.problems.end(),
                          [&](const std::string& p) {
                            return std::all_of(needles.begin(), needles.end(),
                                               [&](const std::string& n) {
                                                 return p.find(n) != std::string::npos;
                                               });
                          }))
      << "wanted a problem with '" << needles.front() << "'...; got:\n"
      << joined(c);
}

}  // namespace

TEST(Schedule, CheckAcceptsEveryGeneratedSchedule) {
  int checked = 0;
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      std::vector<ScheduleSpec> specs = {{ScheduleKind::GPipe, pp, m, 1},
                                         {ScheduleKind::OneF1B, pp, m, 1}};
      if (m % pp == 0)
        specs.push_back({ScheduleKind::Interleaved, pp, m, 2});
      else
        EXPECT_THROW(validate({ScheduleKind::Interleaved, pp, m, 2}), tessera::Error)
            << "pp=" << pp << " m=" << m;
      for (const auto& spec : specs) {
        auto c = check_schedule(make_schedule(spec));
        EXPECT_TRUE(c.ok) << name(spec) << ":\n" << joined(c);
        EXPECT_TRUE(c.problems.empty()) << name(spec);
        ++checked;
      }
    }
  EXPECT_EQ(checked, 8 * 16 * 2 + 16 + 8 + 5 + 4 + 3 + 2 + 2 + 2);  // interleaved: 16/pp of m
}

TEST(Schedule, CheckAcceptsSelfSendsOnOneStage) {
  // pp = 1 interleaved: stage 0 holds global chunks 0 and 1 and sends to itself.
  auto s = make_schedule({ScheduleKind::Interleaved, 1, 3, 2});
  EXPECT_NE(std::find(s.ranks[0].begin(), s.ranks[0].end(), Instr{OpKind::SendAct, 0, 0, 0}),
            s.ranks[0].end());
  auto c = check_schedule(s);
  EXPECT_TRUE(c.ok) << joined(c);
}

TEST(Schedule, CheckFindsCorruptions) {
  const ScheduleSpec spec{ScheduleKind::OneF1B, 4, 8, 1};
  const Schedule good = make_schedule(spec);
  ASSERT_TRUE(check_schedule(good).ok);

  {  // a dropped RecvAct: the Forward has no input and the send no receiver
    auto s = good;
    auto& l = s.ranks[2];
    l.erase(l.begin() + find(l, {OpKind::RecvAct, 3, 0, 1}));
    expect_problem(s, {"stage 2", "F(3,0)", "no RecvAct"});
    expect_problem(s, {"stage 1", "SA(3,0)->2", "no matching receive", "RA(3,0)<-1"});
  }
  {  // a Forward moved after its Backward (last stage: RA F B SG -> RA B F SG)
    auto s = good;
    auto& l = s.ranks[3];
    const auto f = find(l, {OpKind::Forward, 5, 0, -1});
    ASSERT_EQ(l[f + 1], (Instr{OpKind::Backward, 5, 0, -1}));
    std::swap(l[f], l[f + 1]);
    expect_problem(s, {"stage 3", "B(5,0)", "Backward before its Forward"});
  }
  {  // a real deadlock: stage 0 waits for a gradient before sending its first activation
    auto s = good;
    auto& l = s.ranks[0];
    const auto rg = find(l, {OpKind::RecvGrad, 0, 0, 1});
    const Instr moved = l[rg];
    l.erase(l.begin() + rg);
    l.insert(l.begin(), moved);
    auto c = check_schedule(s);
    EXPECT_FALSE(c.ok);
    // Every list still has all its instructions in a plausible order: only the replay sees it.
    for (const auto& p : c.problems) EXPECT_NE(p.find("blocked"), std::string::npos) << p;
    expect_problem(s, {"stage 0, instruction 0 (RG(0,0)<-1)", "deadlock"});
    expect_problem(s, {"stage 1", "RA(0,0)<-0", "deadlock"});
    EXPECT_TRUE(replay(s, 1, 2).deadlock);  // the test's replay agrees
  }
  {  // a wrong peer
    auto s = good;
    auto& l = s.ranks[1];
    l[find(l, {OpKind::SendGrad, 2, 0, 0})].peer = 2;
    expect_problem(s, {"stage 1", "SG(2,0)->2", "peer should be stage 0"});
  }
  {  // a duplicated send
    auto s = good;
    auto& l = s.ranks[0];
    const auto i = find(l, {OpKind::SendAct, 4, 0, 1});
    l.insert(l.begin() + i + 1, l[i]);
    expect_problem(s, {"stage 0", std::to_string(i + 1), "SA(4,0)->1", "a second SendAct"});
  }
  {  // a missing and a misplaced OptimizerStep
    auto s = good;
    s.ranks[1].pop_back();
    expect_problem(s, {"stage 1", "no OptimizerStep"});
    auto t = good;
    std::swap(t.ranks[2].front(), t.ranks[2].back());
    expect_problem(t, {"stage 2, instruction 0 (OPT)", "not the last"});
  }
  {  // a send whose Forward comes later, and a dropped Backward
    auto s = good;
    auto& l = s.ranks[0];
    const auto f = find(l, {OpKind::Forward, 0, 0, -1});
    std::swap(l[f], l[f + 1]);
    expect_problem(s, {"stage 0", "SA(0,0)->1", "before its Forward"});
    auto t = good;
    auto& k = t.ranks[1];
    k.erase(k.begin() + find(k, {OpKind::Backward, 7, 0, -1}));
    expect_problem(t, {"stage 1", "no Backward of micro-batch 7 chunk 0"});
  }
  {  // interleaved on one stage: a self-send dropped leaves its receive blocked for ever
    auto s = make_schedule({ScheduleKind::Interleaved, 1, 2, 2});
    auto& l = s.ranks[0];
    l.erase(l.begin() + find(l, {OpKind::SendAct, 1, 0, 0}));
    expect_problem(s, {"stage 0", "RA(1,1)<-0", "no matching send"});
    expect_problem(s, {"stage 0", "RA(1,1)<-0", "blocked"});
  }
}

TEST(Schedule, TimelineBubbleAndDrawing) {
  for (const auto& spec : all_specs())
    for (double tb : {1.0, 2.0, 3.0}) {
      auto s = make_schedule(spec);
      auto t = replay_timeline(s, tb);
      ASSERT_TRUE(t.complete()) << name(spec);
      for (int st = 0; st < spec.pp; ++st) {
        EXPECT_EQ(t.busy[st], spec.m * spec.v * (1 + static_cast<int>(tb))) << name(spec);
        EXPECT_NEAR(t.bubble(st), ideal_bubble_fraction(spec), 1e-12) << name(spec) << " tb=" << tb;
      }
    }
  const std::string d = draw_timeline(make_schedule({ScheduleKind::OneF1B, 2, 3, 1}));
  EXPECT_EQ(
      d,
      "1f1b pp=2 m=3 v=1: one column per forward of a chunk, a backward takes 2 columns, "
      "messages are free\n"
      "legend: A-C forward of micro-batch 0-2, a-c its backward, . idle\n"
      "time    |0         10\n"
      "stage 0 |AB..aaCbb.cc\n"
      "stage 1 |.AaaBbbCcc..\n"
      "\n"
      "         busy  idle  bubble  in flight (formula)\n"
      "stage 0     9     3   0.333          2 (2)\n"
      "stage 1     9     3   0.333          1 (1)\n"
      "bubble (idle / busy): 0.333 measured on the worst stage, ideal 0.333 = (pp-1)/m = 1/3\n");
  const std::string w = draw_timeline(make_schedule({ScheduleKind::Interleaved, 2, 2, 2}));
  EXPECT_NE(w.find("chunk |"), std::string::npos) << w;
  EXPECT_NE(w.find("(pp-1)/(v*m) = 1/4"), std::string::npos) << w;
  // Wide timelines come in blocks of 160 columns.
  const std::string g = draw_timeline(make_schedule({ScheduleKind::GPipe, 2, 64, 1}));
  EXPECT_NE(g.find("drawn in blocks of 160"), std::string::npos);
  EXPECT_NE(g.find("time    |160"), std::string::npos);
}
