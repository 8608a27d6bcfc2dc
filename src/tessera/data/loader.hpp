// Data-parallel token loader over one shard, with a resumable position.
//
// The global stream is read in windows. At position pos, data-parallel rank r reads the tokens
// [pos + r*B*T, pos + r*B*T + B*T + 1): inputs are the first B*T of them as (B, T) rows, targets
// the same shifted by one. Then pos advances by dp_size*B*T; when the next window of the last rank
// would run past the end of the shard, pos wraps to 0. Every rank computes the same pos, so the
// union of the ranks' rows at step k is exactly the rows of a single-process loader with batch
// dp_size*B at step k (rank r holds rows r*B .. r*B+B-1), and epochs are deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "tessera/data/shard.hpp"

namespace tessera::data {

class TokenLoader {
 public:
  // Throws tessera::Error when the shard cannot be read, or when it holds fewer than
  // dp_size*B*T + 1 tokens (one step of every rank).
  TokenLoader(const std::filesystem::path& shard, std::size_t B, std::size_t T,
              std::size_t dp_rank = 0, std::size_t dp_size = 1);

  // Refuses a shard holding a token id >= vocab_size among its first `tokens` tokens (0 = the
  // whole shard), naming the id and its position: the shard is read once, in chunks, so that a
  // bad id stops the run before any work instead of when a batch reaches it.
  void check_ids(std::uint32_t vocab_size, std::size_t tokens = 0) const;

  // Fills this rank's next micro-batch and advances the position.
  void next(std::int32_t* inputs,    // (B, T)
            std::int32_t* targets);  // (B, T)

  // Position of the next step in the global stream (the same on every rank). Save it in a
  // checkpoint and give it back to set_position to resume bit-exactly.
  std::uint64_t position() const { return pos_; }
  // Throws tessera::Error when a step at `pos` would run past the end of the shard.
  void set_position(std::uint64_t pos);
  void reset() { pos_ = 0; }

  std::size_t num_tokens() const { return shard_.size(); }
  std::size_t tokens_per_step() const { return dp_size_ * B_ * T_; }  // over all ranks
  std::size_t batch() const { return B_; }
  std::size_t seq_len() const { return T_; }

 private:
  ShardReader shard_;
  std::size_t B_, T_, dp_rank_, dp_size_;
  std::uint64_t pos_ = 0;
};

}  // namespace tessera::data
