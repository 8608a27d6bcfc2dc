// Terminal output: info lines on stderr, and a one-line progress display that redraws itself
// when stderr is a terminal and prints plain periodic lines otherwise (CI logs, pipes).
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace tessera {

void log_line(const std::string& line);  // to stderr, ends the current progress line first

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line(fmt::format(f, std::forward<Args>(args)...));
}

bool stderr_is_terminal();

class Progress {
 public:
  // total = 0 means unknown. delay_s > 0: nothing is shown before that many seconds have passed,
  // and finish() says nothing for work that ended sooner (library code whose calls are often
  // quick: quantization, evaluation).
  Progress(std::string label, std::int64_t total, double delay_s = 0);
  ~Progress();
  void update(std::int64_t done, const std::string& detail = {});
  void finish(const std::string& detail = {});

 private:
  std::string label_;
  std::int64_t total_;
  double delay_s_;
  bool shown_ = false;
  bool tty_;
  double last_print_ = -1e9;
  double start_;
  bool finished_ = false;
};

}  // namespace tessera
