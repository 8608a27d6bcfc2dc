// Chrome traces: what tessera writes it reads back, a file that is not a trace is one clear
// error, and predicted and measured events pair up by stage and instruction name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/chrome_trace.hpp"
#include "tessera/core/error.hpp"
#include "tessera/perf/trace_compare.hpp"

using namespace tessera;
namespace fs = std::filesystem;

TEST(ChromeTrace, WrittenEventsReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_trace_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<TraceEvent> events = {{1, 0, "F(0,0)", "compute", 0.001, 0.002},
                                          {1, 0, "RG(0,0)<-1", "idle", 0.003, 0.0005},
                                          {1, 0, "OPT", "optimizer", 0.004, 0.001}};
  write_chrome_trace(dir / "t.json", events, "test");
  const auto back = read_chrome_trace(dir / "t.json");
  ASSERT_EQ(back.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(back[i].pid, events[i].pid);
    EXPECT_EQ(back[i].tid, events[i].tid);
    EXPECT_EQ(back[i].name, events[i].name);
    EXPECT_EQ(back[i].cat, events[i].cat);
    EXPECT_NEAR(back[i].start_s, events[i].start_s, 1e-12);
    EXPECT_NEAR(back[i].dur_s, events[i].dur_s, 1e-12);
  }
  for (const char* bad : {"[]", "{\"traceEvents\": 3}", "not json",
                          "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"F\", \"ts\": \"0\"}]}"}) {
    std::ofstream(dir / "bad.json", std::ios::trunc) << bad;
    EXPECT_THROW(read_chrome_trace(dir / "bad.json"), Error) << bad;
  }
  fs::remove_all(dir);
}

TEST(ChromeTrace, ComparisonPairsInstructionsByStageAndName) {
  // Predicted: F(0,0) as compute + exposed communication, B(0,0); measured: F, a receive the
  // prediction has no event for, and B.
  const std::vector<TraceEvent> predicted = {{0, 1, "F(0,0)", "compute", 0.010, 0.004},
                                             {0, 1, "F(0,0)", "comm", 0.014, 0.001},
                                             {0, 1, "B(0,0)", "compute", 0.020, 0.010},
                                             {0, 0, "F(0,0)", "compute", 0.0, 0.005}};
  const std::vector<TraceEvent> measured = {{1, 1, "B(0,0)", "compute", 0.030, 0.020},
                                            {1, 1, "F(0,0)", "compute", 0.012, 0.006},
                                            {1, 1, "RG(0,0)<-2", "idle", 0.018, 0.012}};
  const auto rows = perf::compare_traces(predicted, measured);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].name, "F(0,0)");  // measured order
  EXPECT_NEAR(rows[0].predicted_start_s, 0.010, 1e-12);
  EXPECT_NEAR(rows[0].predicted_s, 0.005, 1e-12);  // compute + communication
  EXPECT_NEAR(rows[0].measured_s, 0.006, 1e-12);
  EXPECT_EQ(rows[1].name, "RG(0,0)<-2");
  EXPECT_LT(rows[1].predicted_s, 0);  // not predicted
  EXPECT_EQ(rows[2].name, "B(0,0)");
  EXPECT_NEAR(rows[2].predicted_s, 0.010, 1e-12);
}
