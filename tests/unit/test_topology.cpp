#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tessera/comm/topology.hpp"
#include "tessera/core/error.hpp"
#include "tessera/model/config.hpp"

using namespace tessera;
using namespace tessera::comm;

namespace {

using Order = std::array<Axis, k_num_axes>;

constexpr std::array<Axis, k_num_axes> k_axes = {Axis::DP, Axis::PP, Axis::TX, Axis::TY, Axis::TZ};

int ix(Axis a) {
  return static_cast<int>(a);
}

GridShape grid(int dp, int pp, int tx, int ty, int tz) {
  GridShape s;
  s.dp = dp;
  s.pp = pp;
  s.tx = tx;
  s.ty = ty;
  s.tz = tz;
  return s;
}

// All 32 subsets of the five axes.
std::vector<AxisSet> all_subsets() {
  std::vector<AxisSet> out;
  for (unsigned bits = 0; bits < (1u << k_num_axes); ++bits) {
    std::vector<Axis> v;
    for (Axis a : k_axes)
      if (bits & (1u << ix(a))) v.push_back(a);
    // AxisSet is built from an initializer list only; repeating an axis does not change the set.
    while (!v.empty() && v.size() < k_axes.size()) v.push_back(v.front());
    const AxisSet s = v.empty() ? AxisSet{} : AxisSet{v[0], v[1], v[2], v[3], v[4]};
    EXPECT_EQ(s.bits(), bits);
    out.push_back(s);
  }
  return out;
}

// Expects `f` to throw tessera::Error whose message contains `what` and, when given, whose hint
// contains `hint`; every error must carry a hint.
template <typename F>
void expect_error(F&& f, const std::string& what, const std::string& hint = {}) {
  try {
    f();
    ADD_FAILURE() << "expected tessera::Error containing '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << what;
    EXPECT_NE(e.hint().find(hint), std::string::npos)
        << "hint: " << e.hint() << "\nexpected to contain: " << hint;
    EXPECT_FALSE(e.hint().empty()) << "no hint for: " << e.what();
  }
}

// Brute-force rank of coordinates: rank = c[o0] + n0 * (c[o1] + n1 * (c[o2] + ...)).
int brute_rank(const GridShape& s, const Order& order, const Coords& c) {
  int rank = 0, stride = 1;
  for (Axis a : order) {
    rank += c[ix(a)] * stride;
    stride *= s.size(a);
  }
  return rank;
}

// Brute-force group: every rank whose coordinates equal `rank`'s off `axes`, in increasing rank.
// (Members differ only on group axes, whose relative order is the topology's, so increasing rank
// is increasing mixed-radix index within the group.)
std::vector<int> brute_group(const Topology& t, int rank, AxisSet axes) {
  const Coords mine = t.coords_of(rank);
  std::vector<int> out;
  for (int q = 0; q < t.world_size(); ++q) {
    const Coords c = t.coords_of(q);
    bool same = true;
    for (Axis a : k_axes)
      if (!axes.contains(a) && c[ix(a)] != mine[ix(a)]) same = false;
    if (same) out.push_back(q);
  }
  return out;
}

// Brute-force index within the group: mixed radix over the group's axes in the topology order.
int brute_group_index(const Topology& t, const Coords& c, AxisSet axes) {
  int r = 0, stride = 1;
  for (Axis a : t.order()) {
    if (!axes.contains(a)) continue;
    r += c[ix(a)] * stride;
    stride *= t.shape().size(a);
  }
  return r;
}

// Everything about groups, for every subset of axes and every rank of the grid.
void check_groups(const GridShape& s, const Order& order) {
  SCOPED_TRACE(s.describe());
  std::vector<Topology> tops;
  for (int r = 0; r < s.world_size(); ++r) tops.emplace_back(s, r, order);
  for (AxisSet axes : all_subsets()) {
    SCOPED_TRACE("axes " + axes.name());
    int expected_size = 1;
    for (Axis a : k_axes)
      if (axes.contains(a)) expected_size *= s.size(a);

    std::map<int, std::vector<int>> by_color;    // color -> group
    std::vector<int> owner(s.world_size(), -1);  // rank -> color of the group that lists it
    for (const Topology& t : tops) {
      const int r = t.rank();
      const std::vector<int> g = t.group_ranks(axes);
      ASSERT_EQ(g, brute_group(t, r, axes)) << "rank " << r;
      EXPECT_EQ(g, tops[0].group_ranks_of(r, axes)) << "rank " << r;
      ASSERT_EQ(t.group_size(axes), expected_size);
      ASSERT_EQ(static_cast<int>(g.size()), expected_size);
      if (axes == AxisSet{}) {
        EXPECT_EQ(g, std::vector<int>{r});
      }

      // The group-local rank is the position in the list and the mixed-radix index.
      const int gr = t.group_rank(axes);
      ASSERT_GE(gr, 0);
      ASSERT_LT(gr, expected_size);
      EXPECT_EQ(g[gr], r);
      EXPECT_EQ(gr, brute_group_index(t, t.coords(), axes));
      for (int i = 0; i < expected_size; ++i)
        EXPECT_EQ(brute_group_index(t, t.coords_of(g[i]), axes), i) << "member " << g[i];
      // Group rank 0 has coordinate 0 on every group axis.
      const Coords first = t.coords_of(g[0]);
      for (Axis a : k_axes) {
        if (axes.contains(a)) {
          EXPECT_EQ(first[ix(a)], 0) << axis_name(a);
        }
      }

      // Colors: equal within a group, distinct between groups, valid as MPI_Comm_split colors.
      const int color = t.group_color(axes);
      EXPECT_GE(color, 0);
      auto [it, inserted] = by_color.emplace(color, g);
      if (!inserted) {
        EXPECT_EQ(it->second, g) << "two groups share color " << color;
      }
    }
    // The groups partition the world: every rank in exactly one group, world/size groups.
    for (const auto& [color, g] : by_color) {
      for (int q : g) {
        EXPECT_EQ(owner[q], -1) << "rank " << q << " in two groups";
        owner[q] = color;
      }
    }
    for (int q = 0; q < s.world_size(); ++q) EXPECT_NE(owner[q], -1) << "rank " << q;
    EXPECT_EQ(static_cast<int>(by_color.size()), s.world_size() / expected_size);
    // Each member's own color is the color of the group that lists it.
    for (const Topology& t : tops) EXPECT_EQ(owner[t.rank()], t.group_color(axes));
  }
}

void check_round_trip(const GridShape& s, const Order& order) {
  SCOPED_TRACE(s.describe());
  Topology t(s, 0, order);
  std::set<Coords> seen;
  for (int r = 0; r < s.world_size(); ++r) {
    const Coords c = t.coords_of(r);
    for (Axis a : k_axes) {
      ASSERT_GE(c[ix(a)], 0);
      ASSERT_LT(c[ix(a)], s.size(a));
    }
    EXPECT_EQ(t.rank_of(c), r);
    EXPECT_EQ(brute_rank(s, order, c), r);
    EXPECT_TRUE(seen.insert(c).second) << "coordinates repeat at rank " << r;
    Topology tr(s, r, order);
    EXPECT_EQ(tr.coords(), c);
    for (Axis a : k_axes) EXPECT_EQ(tr.coord(a), c[ix(a)]);
  }
  EXPECT_EQ(static_cast<int>(seen.size()), s.world_size());
}

}  // namespace

TEST(Topology, Names) {
  EXPECT_STREQ(axis_name(Axis::DP), "dp");
  EXPECT_STREQ(axis_name(Axis::PP), "pp");
  EXPECT_STREQ(axis_name(Axis::TX), "tx");
  EXPECT_STREQ(axis_name(Axis::TY), "ty");
  EXPECT_STREQ(axis_name(Axis::TZ), "tz");
  EXPECT_EQ(AxisSet{}.name(), "");
  EXPECT_EQ(AxisSet{Axis::DP}.name(), "dp");
  EXPECT_EQ((AxisSet{Axis::TY, Axis::TX}.name()), "tx+ty");
  EXPECT_EQ((AxisSet{Axis::TZ, Axis::DP, Axis::PP, Axis::TY, Axis::TX}.name()), "dp+pp+tx+ty+tz");
  const GridShape s = grid(2, 3, 4, 5, 6);
  EXPECT_EQ(s.describe(), "dp=2 pp=3 tx=4 ty=5 tz=6");
  EXPECT_EQ(s.size(Axis::DP), 2);
  EXPECT_EQ(s.size(Axis::PP), 3);
  EXPECT_EQ(s.size(Axis::TX), 4);
  EXPECT_EQ(s.size(Axis::TY), 5);
  EXPECT_EQ(s.size(Axis::TZ), 6);
  EXPECT_EQ(s.world_size(), 720);
}

TEST(Topology, DefaultOrderPutsTensorAxesInnermost) {
  // dp=3 pp=1 tx=2 ty=2 tz=2: strides tx 1, ty 2, tz 4, pp 8, dp 8.
  const GridShape s = grid(3, 1, 2, 2, 2);
  Topology t(s, 0);
  EXPECT_EQ(t.order(), Topology::k_default_order);
  EXPECT_EQ(t.world_size(), 24);
  EXPECT_EQ(t.coords_of(1), (Coords{0, 0, 1, 0, 0}));
  EXPECT_EQ(t.coords_of(2), (Coords{0, 0, 0, 1, 0}));
  EXPECT_EQ(t.coords_of(4), (Coords{0, 0, 0, 0, 1}));
  EXPECT_EQ(t.coords_of(8), (Coords{1, 0, 0, 0, 0}));
  EXPECT_EQ(t.coords_of(23), (Coords{2, 0, 1, 1, 1}));
  // Ranks 0..7 (one node of 8) form the tensor group of dp rank 0.
  EXPECT_EQ(t.group_ranks({Axis::TX, Axis::TY, Axis::TZ}),
            (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.group_ranks({Axis::DP}), (std::vector<int>{0, 8, 16}));
  Topology t13(s, 13);  // dp 1, tx 1, ty 0, tz 1
  EXPECT_EQ(t13.coords(), (Coords{1, 0, 1, 0, 1}));
  EXPECT_EQ(t13.group_ranks({Axis::DP}), (std::vector<int>{5, 13, 21}));
  EXPECT_EQ(t13.group_rank({Axis::DP}), 1);
  EXPECT_EQ(t13.group_ranks({Axis::TY}), (std::vector<int>{13, 15}));
  EXPECT_EQ(t13.group_rank({Axis::TY}), 0);
  EXPECT_EQ(t13.group_ranks({Axis::TX, Axis::TZ}), (std::vector<int>{8, 9, 12, 13}));
  EXPECT_EQ(t13.group_rank({Axis::TX, Axis::TZ}), 3);
  EXPECT_EQ(t13.group_color({Axis::TX, Axis::TZ}), 8);
}

TEST(Topology, RoundTrip) {
  const Order def = Topology::k_default_order;
  const Order rev = {Axis::DP, Axis::PP, Axis::TZ, Axis::TY, Axis::TX};
  const Order mixed = {Axis::PP, Axis::TX, Axis::DP, Axis::TZ, Axis::TY};
  for (const Order& order : {def, rev, mixed}) {
    check_round_trip(grid(1, 1, 1, 1, 1), order);
    check_round_trip(grid(4, 1, 1, 1, 1), order);
    check_round_trip(grid(1, 1, 3, 1, 1), order);
    check_round_trip(grid(2, 3, 1, 1, 1), order);
    check_round_trip(grid(3, 1, 2, 2, 2), order);  // 2x2x2x1x3
    check_round_trip(grid(2, 3, 2, 2, 2), order);  // every axis > 1
    check_round_trip(grid(3, 2, 5, 1, 2), order);  // uneven sizes
  }
}

TEST(Topology, GroupsOnTensorCube) {  // tx=ty=tz=2
  check_groups(grid(1, 1, 2, 2, 2), Topology::k_default_order);
}

TEST(Topology, GroupsOnMixedGrid) {  // tx=3 ty=2 tz=1 pp=2 dp=1
  check_groups(grid(1, 2, 3, 2, 1), Topology::k_default_order);
}

TEST(Topology, GroupsWithEveryAxis) {
  check_groups(grid(2, 3, 2, 2, 2), Topology::k_default_order);
}

TEST(Topology, GroupsWithCustomOrder) {
  const Order o1 = {Axis::DP, Axis::TX, Axis::PP, Axis::TZ, Axis::TY};
  const Order o2 = {Axis::TZ, Axis::PP, Axis::TY, Axis::DP, Axis::TX};
  check_groups(grid(1, 1, 2, 2, 2), o1);
  check_groups(grid(1, 2, 3, 2, 1), o1);
  check_groups(grid(3, 2, 2, 1, 2), o2);
}

TEST(Topology, CustomOrderLaysOutRanks) {
  // dp innermost: consecutive ranks are data-parallel replicas.
  const Order order = {Axis::DP, Axis::TX, Axis::PP, Axis::TZ, Axis::TY};
  const GridShape s = grid(2, 2, 3, 1, 1);
  Topology t(s, 0, order);
  EXPECT_EQ(t.order(), order);
  EXPECT_EQ(t.coords_of(1), (Coords{1, 0, 0, 0, 0}));
  EXPECT_EQ(t.coords_of(2), (Coords{0, 0, 1, 0, 0}));
  EXPECT_EQ(t.coords_of(6), (Coords{0, 1, 0, 0, 0}));
  EXPECT_EQ(t.group_ranks({Axis::DP}), (std::vector<int>{0, 1}));
  EXPECT_EQ(t.group_ranks({Axis::TX}), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(t.group_ranks({Axis::PP, Axis::DP}), (std::vector<int>{0, 1, 6, 7}));
  Topology t7(s, 7, order);  // dp 1, pp 1
  EXPECT_EQ(t7.group_rank({Axis::PP, Axis::DP}), 3);
  EXPECT_EQ(t7.group_rank({Axis::PP}), 1);
  EXPECT_EQ(t7.group_color({Axis::PP}), 1);
}

TEST(Topology, RejectsBadArguments) {
  expect_error([] { Topology(grid(0, 1, 1, 1, 1), 0); }, "parallel.dp=0 must be >= 1", "size >= 1");
  expect_error([] { Topology(grid(1, 1, 1, -2, 1), 0); }, "parallel.ty=-2 must be >= 1");
  expect_error([] { Topology(grid(2, 1, 2, 1, 1), 4); }, "rank 4 is outside the grid",
               "equal the number of MPI ranks");
  expect_error([] { Topology(grid(2, 1, 2, 1, 1), -1); }, "rank -1 is outside the grid");
  expect_error(
      [] {
        Topology(grid(1, 1, 1, 1, 1), 0, {Axis::TX, Axis::TX, Axis::TZ, Axis::PP, Axis::DP});
      },
      "axis order tx,tx,tz,pp,dp is not a permutation", "exactly once");
  expect_error(
      [] {
        Topology(grid(1, 1, 1, 1, 1), 0,
                 {Axis::TX, Axis::TY, Axis::TZ, Axis::PP, static_cast<Axis>(7)});
      },
      "axis order tx,ty,tz,pp,7 is not a permutation");
  expect_error([] { Topology(grid(65536, 65536, 1, 1, 1), 0); }, "has more than");
  // In-range arguments are accepted; the last rank exists.
  EXPECT_NO_THROW(Topology(grid(2, 1, 2, 1, 1), 3));
}
