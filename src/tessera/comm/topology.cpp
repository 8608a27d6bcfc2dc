#include "tessera/comm/topology.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/core/error.hpp"

namespace tessera::comm {

namespace {

constexpr std::array<Axis, k_num_axes> k_all_axes = {Axis::DP, Axis::PP, Axis::TX, Axis::TY,
                                                     Axis::TZ};

int idx(Axis a) {
  return static_cast<int>(a);
}

// Throws unless every axis size is >= 1 and the product fits an int.
void check_axis_sizes(const GridShape& s) {
  for (Axis a : k_all_axes) {
    if (s.size(a) < 1)
      throw Error(fmt::format("grid {}: parallel.{}={} must be >= 1", s.describe(), axis_name(a),
                              s.size(a)),
                  "every axis of the grid has size >= 1 (1 = that parallelism is off)");
  }
  // Stop at the first partial product past the int range, so that the int64 never overflows.
  std::int64_t n = 1;
  for (Axis a : k_all_axes) {
    n *= s.size(a);
    if (n > std::numeric_limits<int>::max())
      throw Error(fmt::format("grid {} has more than {} ranks", s.describe(),
                              std::numeric_limits<int>::max()),
                  "make the product of parallel.dp, pp, tx, ty, tz equal the number of MPI ranks");
  }
}

}  // namespace

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::DP:
      return "dp";
    case Axis::PP:
      return "pp";
    case Axis::TX:
      return "tx";
    case Axis::TY:
      return "ty";
    case Axis::TZ:
      return "tz";
  }
  TESSERA_CHECK(false, "invalid axis {}", static_cast<int>(a));
  return "?";
}

std::string AxisSet::name() const {
  std::string out;
  for (Axis a : k_all_axes) {
    if (!contains(a)) continue;
    if (!out.empty()) out += '+';
    out += axis_name(a);
  }
  return out;
}

int GridShape::size(Axis a) const {
  switch (a) {
    case Axis::DP:
      return dp;
    case Axis::PP:
      return pp;
    case Axis::TX:
      return tx;
    case Axis::TY:
      return ty;
    case Axis::TZ:
      return tz;
  }
  TESSERA_CHECK(false, "invalid axis {}", static_cast<int>(a));
  return 0;
}

std::string GridShape::describe() const {
  return fmt::format("dp={} pp={} tx={} ty={} tz={}", dp, pp, tx, ty, tz);
}

Topology::Topology(GridShape shape, int rank, std::array<Axis, k_num_axes> order)
    : shape_(shape), rank_(rank), order_(order), coords_{} {
  check_axis_sizes(shape_);
  unsigned seen = 0;
  bool permutation = true;
  for (Axis a : order_) {
    const int i = idx(a);
    if (i < 0 || i >= k_num_axes || (seen & (1u << i))) {
      permutation = false;
      break;
    }
    seen |= 1u << i;
  }
  if (!permutation) {
    std::string given;
    for (Axis a : order_) {
      if (!given.empty()) given += ',';
      const int i = idx(a);
      given += (i >= 0 && i < k_num_axes) ? axis_name(a) : std::to_string(i);
    }
    throw Error(fmt::format("axis order {} is not a permutation of dp, pp, tx, ty, tz", given),
                "list each of the 5 axes exactly once, innermost (fastest varying) first");
  }
  if (rank_ < 0 || rank_ >= world_size())
    throw Error(fmt::format("rank {} is outside the grid {} of {} ranks", rank_, shape_.describe(),
                            world_size()),
                "make the product of parallel.dp, pp, tx, ty, tz equal the number of MPI ranks");
  coords_ = coords_of(rank_);
}

Coords Topology::coords_of(int rank) const {
  TESSERA_CHECK(rank >= 0 && rank < world_size(), "rank {} outside [0, {})", rank, world_size());
  Coords c{};
  int rest = rank;
  for (Axis a : order_) {
    const int n = shape_.size(a);
    c[idx(a)] = rest % n;
    rest /= n;
  }
  return c;
}

int Topology::rank_of(const Coords& c) const {
  int rank = 0;
  for (int k = k_num_axes - 1; k >= 0; --k) {
    const Axis a = order_[k];
    const int n = shape_.size(a);
    TESSERA_CHECK(c[idx(a)] >= 0 && c[idx(a)] < n, "coordinate {}={} outside [0, {})", axis_name(a),
                  c[idx(a)], n);
    rank = rank * n + c[idx(a)];
  }
  return rank;
}

std::vector<int> Topology::group_ranks(AxisSet axes) const {
  return group_ranks_of(rank_, axes);
}

std::vector<int> Topology::group_ranks_of(int rank, AxisSet axes) const {
  TESSERA_CHECK(axes.bits() < (1u << k_num_axes), "invalid axis set bits {}", axes.bits());
  const Coords base = coords_of(rank);
  const int n = group_size(axes);
  std::vector<int> out;
  out.reserve(n);
  for (int g = 0; g < n; ++g) {
    // g in mixed radix over the group's axes, in the topology's order (innermost fastest).
    Coords c = base;
    int rest = g;
    for (Axis a : order_) {
      if (!axes.contains(a)) continue;
      c[idx(a)] = rest % shape_.size(a);
      rest /= shape_.size(a);
    }
    out.push_back(rank_of(c));
  }
  return out;
}

int Topology::group_size(AxisSet axes) const {
  TESSERA_CHECK(axes.bits() < (1u << k_num_axes), "invalid axis set bits {}", axes.bits());
  int n = 1;
  for (Axis a : k_all_axes)
    if (axes.contains(a)) n *= shape_.size(a);
  return n;
}

int Topology::group_rank(AxisSet axes) const {
  TESSERA_CHECK(axes.bits() < (1u << k_num_axes), "invalid axis set bits {}", axes.bits());
  int r = 0;
  for (int k = k_num_axes - 1; k >= 0; --k) {
    const Axis a = order_[k];
    if (axes.contains(a)) r = r * shape_.size(a) + coords_[idx(a)];
  }
  return r;
}

int Topology::group_color(AxisSet axes) const {
  TESSERA_CHECK(axes.bits() < (1u << k_num_axes), "invalid axis set bits {}", axes.bits());
  // The rank of the group's first member (this rank with the group's axes zeroed): the same for
  // every member, different between groups, and in [0, world_size) as MPI_Comm_split wants.
  Coords c = coords_;
  for (Axis a : k_all_axes)
    if (axes.contains(a)) c[idx(a)] = 0;
  return rank_of(c);
}

}  // namespace tessera::comm
