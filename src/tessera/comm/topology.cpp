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

// The vocabulary is padded to a multiple of this before it is sharded. It mirrors
// model::k_vocab_pad_multiple (comm depends on core only, so it cannot include model/);
// tests/unit/test_topology.cpp checks that the two agree.
constexpr int k_vocab_pad_multiple = 128;

int idx(Axis a) {
  return static_cast<int>(a);
}

std::int64_t world_size64(const GridShape& s) {
  std::int64_t n = 1;
  for (Axis a : k_all_axes) n *= s.size(a);
  return n;
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

// "1, 2, 3, 4, 6, 12": the divisors of n (n >= 1), for hints.
std::string divisors(int n) {
  std::string out;
  for (int d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(d);
  }
  return out;
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

// Rules, in the order checked (the first failure throws):
//  1. every axis size >= 1;
//  2. dp*pp*tx*ty*tz == world_size;
//  3. pp > 1: n_layer >= pp (every stage needs a layer; stages may be uneven, so no divisibility);
//  4. tx*ty > 1: n_head % (tx*ty) == 0 (tensor-parallel attention splits heads over tx and ty);
//  5. tx*ty*tz > 1: n_embd % (tx*ty*tz) == 0 (the hidden dimension is split over all tensor axes);
//  6. tx*ty*tz > 1: padded vocabulary (vocab_size rounded up to a multiple of 128, as
//     model::ModelConfig::padded_vocab) % (tx*ty*tz) == 0 (the embedding / LM head is split over
//     the vocabulary across all tensor axes; the padding rows are zero and never predicted);
//  7. batch_size >= 1 and grad_accum >= 1;
//  8. global_batch > 0: global_batch == batch_size * grad_accum * dp.
// An axis of size 1 adds no constraint: every divisibility rule is by a product of axis sizes and
// the layer rule applies only when pp > 1.
void validate_grid(const GridShape& shape, const GridRequirements& req) {
  check_axis_sizes(shape);
  const std::int64_t n = world_size64(shape);
  if (n != req.world_size)
    throw Error(
        fmt::format("grid {} has {} ranks but the job has {}", shape.describe(), n, req.world_size),
        "make the product of parallel.dp, pp, tx, ty, tz equal the number of MPI ranks");

  if (shape.pp > 1 && req.n_layer < shape.pp)
    throw Error(fmt::format("model.n_layer={} is smaller than pp={}: every stage needs a layer",
                            req.n_layer, shape.pp),
                fmt::format("use parallel.pp <= {} or a deeper model", req.n_layer));

  const int txy = shape.tx * shape.ty;
  if (txy > 1 && req.n_head % txy != 0)
    throw Error(fmt::format("model.n_head={} is not divisible by tx*ty={} (tensor-parallel "
                            "attention splits heads)",
                            req.n_head, txy),
                req.n_head >= 1 ? fmt::format("choose tx*ty among the divisors of {}: {}",
                                              req.n_head, divisors(req.n_head))
                                : std::string("make model.n_head a positive multiple of tx*ty"));

  const std::int64_t tensor = static_cast<std::int64_t>(txy) * shape.tz;
  if (tensor > 1 && req.n_embd % tensor != 0)
    throw Error(fmt::format("model.n_embd={} is not divisible by tx*ty*tz={} (the hidden "
                            "dimension is split over the tensor axes)",
                            req.n_embd, tensor),
                "choose tensor axes whose product divides model.n_embd");

  if (tensor > 1) {
    const std::int64_t padded =
        (static_cast<std::int64_t>(req.vocab_size) + k_vocab_pad_multiple - 1) /
        k_vocab_pad_multiple * k_vocab_pad_multiple;
    if (padded % tensor != 0)
      throw Error(fmt::format("padded vocabulary {} (model.vocab_size={} rounded up to a multiple "
                              "of {}) is not divisible by tx*ty*tz={} (the embedding is split "
                              "over the vocabulary)",
                              padded, req.vocab_size, k_vocab_pad_multiple, tensor),
                  "choose tensor axes whose product divides the padded vocabulary (any power of "
                  "two up to 128 always does)");
  }

  if (req.batch_size < 1)
    throw Error(fmt::format("train.batch_size={} must be >= 1", req.batch_size),
                "batch_size is the micro-batch of one data-parallel rank");
  if (req.grad_accum < 1)
    throw Error(fmt::format("train.grad_accum={} must be >= 1", req.grad_accum),
                "grad_accum is the number of micro-batches per optimizer step (1 = none)");
  if (req.global_batch > 0) {
    const std::int64_t product =
        static_cast<std::int64_t>(req.batch_size) * req.grad_accum * shape.dp;
    if (product != req.global_batch)
      throw Error(fmt::format("global batch {} != micro-batch {} x accumulation {} x dp {} = {}",
                              req.global_batch, req.batch_size, req.grad_accum, shape.dp, product),
                  "the global batch is batch_size x grad_accum x dp: change one of them, or leave "
                  "the global batch unset");
  }
}

}  // namespace tessera::comm
