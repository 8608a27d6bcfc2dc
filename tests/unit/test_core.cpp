#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "../scratch_dir.hpp"
#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/process_memory.hpp"
#include "tessera/core/rng.hpp"
#include "tessera/core/team_barrier.hpp"

using namespace tessera;

TEST(Core, ErrorIsOneLineWithHint) {
  Error e("bad\nthing", "do this");
  EXPECT_EQ(format_error_line(e), "error: bad thing (hint: do this)");
}

TEST(Core, BufferIsAlignedAndZeroed) {
  Buffer<float> b(1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % k_buffer_alignment, 0u);
  for (std::size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], 0.0f);
}

// How many of the pages under [p, p + bytes) are backed by memory now (mincore).
static std::size_t resident_pages(const void* p, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::size_t n = (reinterpret_cast<std::uintptr_t>(p) + bytes - begin + page - 1) / page;
  std::vector<unsigned char> in(n);
  if (mincore(reinterpret_cast<void*>(begin), n * page, in.data()) != 0) return 0;
  std::size_t r = 0;
  for (unsigned char c : in) r += c & 1;
  return r;
}

TEST(Core, MappedBufferIsBackedWhereWrittenOrAllAtOnce) {
  const std::size_t n = std::size_t(4) << 20;  // 16 MiB of floats: a memory map
  Buffer<float> lazy(n), resident;
  resident.resize(n, Buffer<float>::Pages::Resident);
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t pages = (n * sizeof(float) + page - 1) / page;
  // unwritten pages of the lazy map are not backed (at most the pages a neighbour shares)
  EXPECT_LE(resident_pages(lazy.data(), lazy.bytes()), 2u);
  lazy[n / 2] = 1.0f;
  EXPECT_GE(resident_pages(lazy.data(), lazy.bytes()), 1u);
  // one write: its page (or, where the system backs anonymous maps with 2 MiB pages, those)
  EXPECT_LE(resident_pages(lazy.data(), lazy.bytes()), pages / 4);
  EXPECT_EQ(resident_pages(resident.data(), resident.bytes()), pages);
  for (std::size_t i = 0; i < n; i += 1021) ASSERT_EQ(resident[i], 0.0f);
}

TEST(Core, RngIsDeterministicAndResumable) {
  Rng a(42), b(42);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());
  Rng c(0);
  c.set_state(a.state());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.normal(), c.normal());
  // normals have roughly unit variance
  double s = 0, s2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double x = a.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.02);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(Core, AtomicWriteReplacesAndReadErrorsAreClear) {
  auto dir = tessera::test::fresh_scratch("core_test");
  auto p = dir / "f.txt";
  write_file_atomic(p, "one");
  write_file_atomic(p, "two");
  EXPECT_EQ(read_file(p), "two");
  EXPECT_THROW(read_file(dir / "missing"), Error);
  std::filesystem::remove_all(dir);
}

TEST(Core, PeakResidentMemoryFollowsTouchesAndResets) {
  if (resident_bytes() == 0) GTEST_SKIP() << "no /proc/self/status";
  constexpr std::size_t k_bytes = std::size_t{96} << 20;
  const std::size_t before = resident_bytes();
  EXPECT_GE(peak_resident_bytes(), before);
  {
    std::vector<char> big(k_bytes);
    std::memset(big.data(), 1, big.size());  // touched: resident
    EXPECT_GE(resident_bytes(), before + k_bytes / 2);
  }
  const std::size_t peak = peak_resident_bytes();
  EXPECT_GE(peak, before + k_bytes / 2);
  if (!reset_peak_resident()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  // freed memory may stay resident (allocator), but the new peak is the resident size now
  EXPECT_LE(peak_resident_bytes(), resident_bytes() + (std::size_t{8} << 20));
}

// Each thread writes its slot of a round, waits, and then reads every thread's slot of that
// round: all of them must be there (two rounds' slots alternate, so the next round's writes
// cannot reach a slot another thread is still reading). Teams of 2 and 3, and of 8 on a machine
// with fewer cores (threads that sleep); one thread arriving late (longer than the spin, so the
// others sleep and are woken); idle work that runs out or never does; spinning before sleeping
// or not (OMP_WAIT_POLICY=passive).
TEST(Core, TeamBarrierOrdersEveryRound) {
  for (auto spin : {TeamBarrier::k_spin, std::chrono::microseconds{0}})
    for (int team : {2, 3, 8})
      for (int idle_calls : {0, 10, -1}) {  // -1: idle() always has more to do
        TeamBarrier barrier(spin);
        barrier.reset();
        const int rounds = team == 8 ? 200 : 2000;
        std::vector<std::atomic<int>> slot(2 * team);
        std::atomic<int> bad{0};
#pragma omp parallel num_threads(team)
        {
          const int i = omp_get_thread_num(), n = omp_get_num_threads();
          int calls = 0;
          auto idle = [&] { return idle_calls < 0 || ++calls <= idle_calls; };
          for (int r = 1; r <= rounds; ++r) {
            if (r % 500 == 0 && i == n - 1) std::this_thread::sleep_for(2 * TeamBarrier::k_spin);
            slot[(r % 2) * n + i].store(r, std::memory_order_relaxed);
            barrier.wait(n, idle);
            for (int j = 0; j < n; ++j)
              if (slot[(r % 2) * n + j].load(std::memory_order_relaxed) != r) ++bad;
          }
        }
        EXPECT_EQ(bad.load(), 0) << team << " threads, idle " << idle_calls << ", spin "
                                 << spin.count() << " us";
      }
}

// The decoder's threads sleep at once where OpenMP's would (OMP_WAIT_POLICY=passive, any case).
TEST(Core, TeamBarrierSpinFollowsOpenMpWaitPolicy) {
  const char* was = std::getenv("OMP_WAIT_POLICY");
  const std::string saved = was ? was : "";
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  EXPECT_EQ(TeamBarrier::openmp_spin().count(), 0);
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  EXPECT_EQ(TeamBarrier::openmp_spin().count(), 0);
  ::setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
  EXPECT_EQ(TeamBarrier::openmp_spin(), TeamBarrier::k_spin);
  ::unsetenv("OMP_WAIT_POLICY");
  EXPECT_EQ(TeamBarrier::openmp_spin(), TeamBarrier::k_spin);
  if (was) ::setenv("OMP_WAIT_POLICY", saved.c_str(), 1);
}
