// The collective watchdog, end to end: a job whose rank 0 is stuck in an all-reduce (the other
// rank joins only after 60 s: tests/probes/hang_probe.cpp) must end by itself soon after the
// collective timeout, non-zero, with rank 0's message naming the collective and its group and
// with the collective log showing it in flight; and no rank may outlive the job.
//
// The probe runs with a 2 s collective timeout; the watchdog checks every 0.5 s, so the job ends
// ~3 s after start-up. The 30 s deadline is generous for a loaded machine yet well under the 60 s
// after which the sleeping rank would join and let the collective complete.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fs = std::filesystem;

namespace {

std::string wd_slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True while process p runs the probe and is not a zombie (a reused pid does not count).
bool wd_probe_alive(pid_t p) {
  const std::string proc = "/proc/" + std::to_string(p);
  std::string stat = wd_slurp(proc + "/stat");
  auto rp = stat.rfind(')');
  if (stat.empty() || rp == std::string::npos || rp + 2 >= stat.size() || stat[rp + 2] == 'Z')
    return false;
  return wd_slurp(proc + "/cmdline").find("tessera_hang_probe") != std::string::npos;
}

// The processes of one launched job: the launcher (leader of its own process group) and the
// ranks, which write their pids into pid_dir. The destructor kills whatever is left, so that a
// failed assertion never leaves a rank behind.
struct WdJob {
  pid_t pid = -1;
  bool reaped = false;
  fs::path pid_dir;

  std::vector<pid_t> rank_pids() const {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(pid_dir, ec))
      if (e.path().extension() == ".pid") {
        std::istringstream in(wd_slurp(e.path()));
        if (pid_t p = 0; in >> p && p > 0) out.push_back(p);
      }
    return out;
  }
  void kill_all() {
    if (pid > 0 && !reaped) ::kill(-pid, SIGKILL);
    for (pid_t p : rank_pids())
      if (wd_probe_alive(p)) ::kill(p, SIGKILL);
  }
  ~WdJob() {
    kill_all();
    if (pid > 0 && !reaped) ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST(Watchdog, HungCollectiveEndsTheJobWithItsLog) {
  const auto dir = fs::temp_directory_path() / ("tessera_wd_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "pids");
  const std::string log = (dir / "mpirun.log").string();

  // Everything the child needs is built before fork().
  std::vector<std::string> args = {TESSERA_MPIEXEC,    "-n", "2",
                                   TESSERA_HANG_PROBE, "2",  (dir / "pids").string()};
  const std::vector<std::string> extra = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                          "OMPI_MCA_rmaps_base_oversubscribe=1"};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string var = *e;
    bool replaced = false;
    for (const auto& x : extra)
      replaced |= var.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    if (!replaced) env.push_back(var);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);

  WdJob job;
  job.pid_dir = dir / "pids";
  const auto t0 = std::chrono::steady_clock::now();
  job.pid = ::fork();
  ASSERT_GE(job.pid, 0) << "fork failed";
  if (job.pid == 0) {
    ::setpgid(0, 0);  // its own process group: one kill ends the launcher and its children
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(127);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(job.pid, job.pid);  // also from here, so that a kill never races the child's call

  int st = 0;
  bool overran = false;
  for (;;) {
    pid_t w = ::waitpid(job.pid, &st, WNOHANG);
    if (w == job.pid || (w < 0 && errno != EINTR)) {
      job.reaped = true;
      break;
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) {
      overran = true;
      job.kill_all();
      ::waitpid(job.pid, &st, 0);
      job.reaped = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = wd_slurp(log);
  ASSERT_FALSE(overran) << "the job did not end within 30 s of a hung collective\n" << text;
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the job must end non-zero\n" << text;
  EXPECT_FALSE(WIFEXITED(st) && WEXITSTATUS(st) == 127) << "could not start the launcher\n" << text;

  // Rank 0's watchdog message: the rank, the collective, its group, the timeout.
  for (const char* needle : {"collective #", "all_reduce", "world", "IN FLIGHT", "rank 0"})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "'\n" << text;
  EXPECT_NE(text.find("error: rank 0: collective #"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce over group 'world'"), std::string::npos) << text;
  EXPECT_NE(text.find("has not completed after 2 s"), std::string::npos) << text;
  // The log line in flight is that all-reduce over the world.
  auto at = text.find("IN FLIGHT");
  if (at != std::string::npos) {
    auto bol = text.rfind('\n', at);
    std::string line = text.substr(bol == std::string::npos ? 0 : bol + 1, at - bol);
    EXPECT_NE(line.find("all_reduce"), std::string::npos) << line;
    EXPECT_NE(line.find("world"), std::string::npos) << line;
  }
  // Rank 1 was never in a collective: it must not be blamed.
  EXPECT_EQ(text.find("rank 1: collective"), std::string::npos) << text;
  EXPECT_LT(secs, 30.0);

  // No rank outlives the job (one being torn down may take a moment; zombies count as gone).
  auto ranks = job.rank_pids();
  EXPECT_EQ(ranks.size(), 2u) << "both ranks should have started and written their pid\n" << text;
  for (pid_t p : ranks) {
    for (int i = 0; i < 100 && wd_probe_alive(p); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(wd_probe_alive(p)) << "rank process " << p << " still runs 10 s after the job";
  }
  fs::remove_all(dir);
}
