// Helpers for end-to-end tests that run the `tessera` binary as a user would.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../scratch_dir.hpp"

namespace cli {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out, err;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) lines.push_back(l);
    return lines;
  }
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// This process's scratch root, removed at exit.
inline const fs::path& scratch_root() {
  static const tessera::test::ScratchDir root("tessera_cli_");
  return root.path();
}

inline fs::path scratch(const std::string& name) {
  auto d = scratch_root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs `tessera <args>` (args already shell-quoted where needed) from the source dir.
inline Result run(const std::string& args) {
  static int counter = 0;
  const auto& dir = scratch_root();
  auto out = dir / ("out" + std::to_string(counter) + ".txt");
  auto err = dir / ("err" + std::to_string(counter++) + ".txt");
  std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && OMP_WAIT_POLICY=PASSIVE '" TESSERA_BIN "' " +
                    args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// Starts `tessera <args>` in the background from the source dir, its output redirected as
// `redirect` says (shell syntax, e.g. ">/dev/null 2>&1"); returns the child's pid (its own shell
// execs tessera, so the pid is tessera's). The command line is built before fork(): this process
// has threads, and the child may only call exec.
inline pid_t spawn(const std::string& args, const std::string& redirect) {
  const std::string cmd =
      "cd '" TESSERA_SOURCE_DIR "' && exec '" TESSERA_BIN "' " + args + " " + redirect;
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

inline bool have_tokenizer() {
  return fs::exists(fs::path(TESSERA_DATA) / "gpt2" / "encoder.json");
}

// A small English corpus made on the spot, tokenized into train/val shards under `dir`.
inline void make_corpus(const fs::path& dir) {
  std::ofstream f(dir / "corpus.txt");
  const char* sentences[] = {"The quick brown fox jumps over the lazy dog. ",
                             "A stitch in time saves nine, said the tailor to his apprentice. ",
                             "It was the best of times, it was the worst of times. ",
                             "Numbers like 1234 and 56 appear now and then in the text. ",
                             "She sells sea shells by the sea shore on sunny days. "};
  for (int i = 0; i < 400; ++i) f << sentences[(i * 7) % 5] << (i % 9 == 0 ? "\n\n" : "");
  f.close();
  std::ofstream g(dir / "corpus2.txt");
  for (int i = 0; i < 60; ++i) g << sentences[(i * 3) % 5];
  g.close();
}

// The run failed as bad input should: exit code 2 and one line on stderr, starting with
// "error:" and containing `needle`.
inline void expect_clean_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << "stderr: " << r.err;
  auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << "stderr: " << r.err;
  EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos)
      << "expected '" << needle << "' in: " << lines[0];
}

}  // namespace cli
