// The parallel grid: dp x pp x tx x ty x tz. One value, passed explicitly (no global parallel
// state). Ranks are laid out with the innermost axis varying fastest; by default the tensor axes
// are innermost (so that a tensor-parallel group lands inside a node), then pp, then dp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::comm {

enum class Axis : int { DP = 0, PP = 1, TX = 2, TY = 3, TZ = 4 };
inline constexpr int k_num_axes = 5;
const char* axis_name(Axis a);  // "dp", "pp", "tx", "ty", "tz"

// A set of axes, e.g. {DP} for data-parallel gradient reduction or {TX, TY} for a tensor group.
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= 1u << static_cast<int>(a);
  }
  constexpr bool contains(Axis a) const { return bits_ & (1u << static_cast<int>(a)); }
  constexpr unsigned bits() const { return bits_; }
  constexpr bool operator==(const AxisSet&) const = default;
  std::string name() const;  // "dp", "tx+ty", "" for the empty set

 private:
  unsigned bits_ = 0;
};

struct GridShape {
  int dp = 1, pp = 1, tx = 1, ty = 1, tz = 1;
  int size(Axis a) const;
  int world_size() const { return dp * pp * tx * ty * tz; }
  bool operator==(const GridShape&) const = default;
  std::string describe() const;  // "dp=2 pp=1 tx=2 ty=1 tz=1"
};

using Coords = std::array<int, k_num_axes>;  // indexed by static_cast<int>(Axis)

class Topology {
 public:
  // order: the axes from innermost (fastest varying) to outermost. Default: tx, ty, tz, pp, dp.
  static constexpr std::array<Axis, k_num_axes> k_default_order = {Axis::TX, Axis::TY, Axis::TZ,
                                                                   Axis::PP, Axis::DP};
  // Throws tessera::Error if a size is < 1, the order is not a permutation of the 5 axes, or
  // rank is outside [0, world_size).
  Topology(GridShape shape, int rank, std::array<Axis, k_num_axes> order = k_default_order);

  const GridShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  int world_size() const { return shape_.world_size(); }
  const std::array<Axis, k_num_axes>& order() const { return order_; }

  Coords coords() const { return coords_of(rank_); }
  int coord(Axis a) const { return coords_[static_cast<int>(a)]; }
  Coords coords_of(int rank) const;
  int rank_of(const Coords& c) const;

  // The ranks of the group of this rank over `axes`: every rank whose coordinates equal this
  // rank's on all axes NOT in `axes`, sorted by their index within the group (the group-local
  // rank is the position in this list). The empty set gives {rank}.
  std::vector<int> group_ranks(AxisSet axes) const;
  std::vector<int> group_ranks_of(int rank, AxisSet axes) const;
  int group_size(AxisSet axes) const;
  int group_rank(AxisSet axes) const;  // this rank's index within its group

  // A number identifying the group over `axes` that contains `rank` (equal for all members,
  // distinct between groups): usable as the color of MPI_Comm_split.
  int group_color(AxisSet axes) const;

 private:
  GridShape shape_;
  int rank_;
  std::array<Axis, k_num_axes> order_;
  Coords coords_;
};

}  // namespace tessera::comm
