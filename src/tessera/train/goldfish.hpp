// Goldfish loss masking (Hans et al., "Be like a Goldfish, Don't Memorize!", NeurIPS 2024): a
// pseudo-random subset of the targets is left out of the loss (set to -1, which the
// cross-entropy kernels ignore: loss 0, zero gradient). Dropped tokens stay in the input.
//
// Definitions, for a (B, T) micro-batch whose targets[b, t] is the token that follows inputs[b, t]
// (rows are consecutive windows of the token stream):
//   hash    As the reference (goldfish-loss, lit_gpt/utils.py::apply_goldfish, "hash-table"): the
//           window of target t is the h targets ending at it, targets[b, t-h+1 .. t] (the target
//           token itself and the h-1 tokens before it). key = (product of the h ids) mod
//           1,000,003, computed exactly (each factor reduced mod the prime; the reference takes the
//           product in wrapping int64 first, so for long windows the indices differ). The target
//           is dropped when table[key] < 1/k, where table holds 1,000,003 uniform [0, 1) values
//           drawn from tessera::Rng(2971215073) (the reference's seed; its values come from
//           torch.rand and are not reproduced). Positions t < h-1 of every row are never
//           dropped. The decision depends on the h token ids only: identical contexts always
//           drop the same token, wherever they occur.
//   static  Every k-th target of a row: dropped when (t + 1) % k == 0 (t = k-1, 2k-1, ...).
//   random  Dropped with probability 1/k, from a stateless hash of (seed, step, global stream
//           index of the target token): identical on every rank, grid and after resume (no
//           RNG state), and drawn afresh at every step (as the reference's seeded_random).
#pragma once

#include <cstdint>
#include <string>

namespace tessera::train {

struct GoldfishConfig {
  int k = 0;                      // drop about 1 in k targets; 0 = off (else >= 2)
  int h = 13;                     // hash: context width (tokens in the hashed window)
  std::string strategy = "hash";  // "hash", "static" or "random"
  std::uint64_t seed = 0;         // random: the seed of the drop decisions
  bool operator==(const GoldfishConfig&) const = default;
};

inline constexpr std::uint64_t k_goldfish_table_size = 1'000'003;  // prime
inline constexpr std::uint64_t k_goldfish_table_seed = 2971215073ull;

// Sets the dropped targets of a (B, T) micro-batch to -1 and returns the number of targets kept
// (targets >= 0 afterwards; targets already < 0 stay so and are not counted). `first_pos` is the
// index in the token stream of the token targets[0, 0]; row b starts at first_pos + b*T (used by
// "random" only). `step` is the optimizer step (used by "random" only). k == 0 drops nothing.
// Throws tessera::Error for an unknown strategy or k == 1 / k < 0 / h < 1.
std::int64_t apply_goldfish(const GoldfishConfig& cfg,
                            std::int32_t* targets,  // (B, T)
                            int B, int T, std::uint64_t first_pos, std::int64_t step);

// The hash strategy's decision for one window of h token ids (window[h-1] is the target).
bool goldfish_hash_drops(const std::int32_t* window, int h, int k);

}  // namespace tessera::train
