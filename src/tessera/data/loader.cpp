#include "tessera/data/loader.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::data {

TokenLoader::TokenLoader(const std::filesystem::path& shard, std::size_t B, std::size_t T,
                         std::size_t dp_rank, std::size_t dp_size)
    : shard_(shard), B_(B), T_(T), dp_rank_(dp_rank), dp_size_(dp_size) {
  if (B == 0 || T == 0)
    throw Error(
        fmt::format("data loader needs a batch and a sequence length > 0 (got B={}, T={})", B, T));
  if (dp_size == 0 || dp_rank >= dp_size)
    throw Error(fmt::format("data loader: bad data-parallel rank {} of {}", dp_rank, dp_size));
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  if (T > max / B || B * T > (max - 1) / dp_size)
    throw Error(
        fmt::format("data loader: batch {} x sequence {} x {} ranks is too large", B, T, dp_size));
  const std::size_t need = tokens_per_step() + 1;
  if (shard_.size() < need)
    throw Error(fmt::format("token shard {} holds {} tokens, too few for one step of {} rank(s) x "
                            "batch {} x sequence {} (needs {})",
                            shard_.path().string(), shard_.size(), dp_size, B, T, need),
                "use a smaller batch or sequence length, or a larger corpus");
}

void TokenLoader::set_position(std::uint64_t pos) {
  const std::uint64_t need = tokens_per_step() + 1;
  if (pos > shard_.size() || shard_.size() - pos < need)
    throw Error(fmt::format("data position {} is past the last step of token shard {} ({} tokens, "
                            "{} per step)",
                            pos, shard_.path().string(), shard_.size(), tokens_per_step()),
                "resume with the same data shard, batch and sequence length as the checkpoint");
  pos_ = pos;
}

void TokenLoader::check_ids(std::uint32_t vocab_size, std::size_t tokens) const {
  if (const auto bad = first_id_outside(shard_, vocab_size, tokens))
    throw Error(fmt::format("token shard {} holds the token id {} at position {}, outside the "
                            "model's vocabulary of {}",
                            shard_.path().string(), bad->id, bad->position, vocab_size),
                "the shard was made with another tokenizer or is damaged; re-create it with "
                "'tessera prepare', or set model.vocab_size to the tokenizer's");
}

void TokenLoader::next(std::int32_t* inputs, std::int32_t* targets) {
  const std::size_t bt = B_ * T_;
  const std::size_t start = static_cast<std::size_t>(pos_) + dp_rank_ * bt;
  // inputs = tokens [start, start + bt), targets = tokens [start + 1, start + bt + 1)
  shard_.read(start, bt, inputs);
  if (bt > 1) std::memcpy(targets, inputs + 1, (bt - 1) * sizeof(std::int32_t));
  shard_.read(start + bt, 1, targets + bt - 1);
  pos_ += tokens_per_step();
  if (pos_ + tokens_per_step() + 1 > shard_.size()) pos_ = 0;
}

}  // namespace tessera::data
