#include <gtest/gtest.h>

#include <filesystem>

#include "tessera/core/buffer.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/file.hpp"
#include "tessera/core/rng.hpp"

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
  auto dir = std::filesystem::temp_directory_path() / "tessera_core_test";
  std::filesystem::create_directories(dir);
  auto p = dir / "f.txt";
  write_file_atomic(p, "one");
  write_file_atomic(p, "two");
  EXPECT_EQ(read_file(p), "two");
  EXPECT_THROW(read_file(dir / "missing"), Error);
  std::filesystem::remove_all(dir);
}
