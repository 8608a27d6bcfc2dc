#include "tessera/core/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace tessera {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

void log_line(const std::string& line) {
  if (stderr_is_terminal()) std::fputs("\r\033[K", stderr);
  std::fputs(line.c_str(), stderr);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

Progress::Progress(std::string label, std::int64_t total, double delay_s)
    : label_(std::move(label)),
      total_(total),
      delay_s_(delay_s),
      tty_(stderr_is_terminal()),
      start_(now_s()) {}

Progress::~Progress() {
  if (!finished_ && tty_ && shown_) std::fputs("\n", stderr);
}

void Progress::update(std::int64_t done, const std::string& detail) {
  double t = now_s();
  // Redraw at most 10 times a second on a terminal; every 10 s in a log.
  if (t - last_print_ < (tty_ ? 0.1 : 10.0) || t - start_ < delay_s_) return;
  last_print_ = t;
  shown_ = true;
  std::string bar;
  if (total_ > 0) {
    double frac = static_cast<double>(done) / static_cast<double>(total_);
    if (frac > 1) frac = 1;
    int width = 24, fill = static_cast<int>(frac * width);
    bar.reserve(64);
    bar += '[';
    bar.append(static_cast<std::size_t>(fill), '#');
    bar.append(static_cast<std::size_t>(width - fill), '.');
    bar += "] ";
    double el = t - start_;
    double eta = frac > 0 ? el / frac - el : 0;
    bar += fmt::format("{}/{} ({:.0f}%, {:.0f}s left) ", done, total_, 100 * frac, eta);
  } else {
    bar = fmt::format("{} ", done);
  }
  std::string line = fmt::format("{} {}{}", label_, bar, detail);
  if (tty_) {
    std::fputs("\r\033[K", stderr);
    std::fputs(line.c_str(), stderr);
  } else {
    std::fputs(line.c_str(), stderr);
    std::fputc('\n', stderr);
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& detail) {
  if (finished_) return;
  finished_ = true;
  if (delay_s_ > 0 && !shown_) return;
  std::string line = fmt::format("{} done in {:.1f}s {}", label_, now_s() - start_, detail);
  if (tty_) std::fputs("\r\033[K", stderr);
  std::fputs(line.c_str(), stderr);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace tessera
