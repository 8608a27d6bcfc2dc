// Loss-spike detection for the rollback of a training run: a step's loss is a spike when it is not
// finite, or when it is above `factor` times the mean of the losses of the last `window` steps
// accepted (no spike is declared before `window` losses have been seen: early training falls
// fast).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

namespace tessera::train {

class SpikeGuard {
 public:
  SpikeGuard(double factor, int window) : factor_(factor), window_(window) {}
  // Why the loss of `step` is a spike ("the loss is nan", "the loss 9.1 is above 3 x 2.9, the
  // mean of the last 20 steps"), or "" when it is not, in which case it joins the window.
  std::string check(std::int64_t step, double loss);
  // After a rollback to `step`: forgets the losses of later steps (they will be replayed).
  void rewind(std::int64_t step);

 private:
  double factor_;
  int window_;
  std::deque<std::pair<std::int64_t, double>> recent_;  // (step, loss), oldest first
};

}  // namespace tessera::train
