// The files a training run writes for people to look at: metrics.jsonl rows, TensorBoard event
// files (CRC-32C, TFRecord framing, the events), the CPU peak of MFU, charts.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../scratch_dir.hpp"
#include "expect_error.hpp"
#include "tessera/core/cpu_peak.hpp"
#include "tessera/core/tfrecord.hpp"
#include "tessera/plot/plot.hpp"
#include "tessera/train/metrics_file.hpp"
#include "tessera/train/metrics_log.hpp"
#include "tessera/train/metrics_rows.hpp"
#include "tessera/train/tensorboard.hpp"
#include "tessera/train/tensorboard_event.pb.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  static const tessera::test::ScratchDir root("tessera_metrics_");
  auto d = root.path() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint64_t read_le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

// The events of a TFRecord file, every frame's two checksums checked.
std::vector<tensorboard::Event> read_events(const fs::path& file) {
  const std::string s = slurp(file);
  std::vector<tensorboard::Event> events;
  for (std::size_t at = 0; at < s.size();) {
    EXPECT_LE(at + 12, s.size());
    const std::uint64_t len = read_le(s, at, 8);
    EXPECT_EQ(read_le(s, at + 8, 4), mask_crc32c(crc32c(s.substr(at, 8))));
    const std::string data = s.substr(at + 12, len);
    EXPECT_EQ(read_le(s, at + 12 + len, 4), mask_crc32c(crc32c(data)));
    events.emplace_back();
    EXPECT_TRUE(events.back().ParseFromString(data));
    at += 16 + len;
  }
  return events;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

// The check values of RFC 3720 (iSCSI, B.4) and the "123456789" check of the CRC catalogue.
TEST(TfRecord, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, 0), descending(32, 0);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i), descending[i] = 31 - i;
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);  // continued
}

// Masked CRCs and a whole record as TensorBoard's own writer (tensorboard 2.20's
// RecordWriter and masked_crc32c) produces them.
TEST(TfRecord, FramingMatchesTensorBoardsWriter) {
  EXPECT_EQ(mask_crc32c(crc32c("123456789")), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc32c(crc32c("")), 0xA282EAD8u);
  const std::string record = tfrecord("hello");
  const unsigned char want[] = {0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xea, 0xb2, 0x04,
                                0x3e, 'h',  'e',  'l',  'l',  'o',  0xbb, 0x1f, 0x1c, 0x19};
  ASSERT_EQ(record.size(), sizeof want);
  EXPECT_EQ(std::memcmp(record.data(), want, sizeof want), 0);
}

TEST(TensorBoard, EveryNumberOfARowIsAScalar) {
  nlohmann::json step{{"event", "step"}, {"step", 3},        {"loss", 2.5},
                      {"mfu", nullptr},  {"time", 1.7e9},    {"mfu_peak", "x"},
                      {"lr", 1e-3},      {"tensor", {1, 2}}, {"fits", true}};
  std::vector<std::string> tags;
  for (const auto& s : train::row_scalars(step)) tags.push_back(s.tag);
  EXPECT_EQ(tags, (std::vector<std::string>{"train/loss", "train/lr"}));
  const auto val = train::row_scalars({{"event", "val"}, {"step", 4}, {"val_loss", 2.0}});
  ASSERT_EQ(val.size(), 1u);
  EXPECT_EQ(val[0].tag, "val/val_loss");
  EXPECT_EQ(val[0].value, 2.0);
}

// A fresh log and a resumed one: rows with an event and a time, one event file per start in
// name order, the resumed file starting at the step after the checkpoint; rows without a step at
// the last step written.
TEST(TensorBoard, MetricsLogWritesRowsAndEvents) {
  const fs::path dir = fresh_dir("log");
  {
    auto log = train::MetricsLog::start(dir / "metrics.jsonl");
    log.write({{"event", "memory"}, {"params_bytes", 100}});
    for (int s = 1; s <= 3; ++s) log.write({{"event", "step"}, {"step", s}, {"loss", 4.0 - s}});
  }
  {
    auto log = train::MetricsLog::resume(dir / "metrics.jsonl", 2);
    log.write({{"event", "memory"}, {"params_bytes", 100}});
    log.write({{"event", "step"}, {"step", 3}, {"loss", 0.5}});
    log.write({{"event", "summary"}, {"median_step_ms", 7.0}});
  }
  std::istringstream rows(slurp(dir / "metrics.jsonl"));
  int n = 0;
  for (std::string line; std::getline(rows, line); ++n) {
    const auto row = nlohmann::json::parse(line);
    EXPECT_TRUE(row["event"].is_string()) << line;
    EXPECT_GT(row["time"].get<double>(), 1.7e9) << line;
  }
  EXPECT_EQ(n, 6);  // memory, steps 1-2, memory, step 3, summary
  const auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  const auto first = read_events(files[0]), second = read_events(files[1]);
  ASSERT_EQ(first.size(), 6u);  // version, start, memory, 3 steps
  EXPECT_EQ(first[0].file_version(), "brain.Event:2");
  EXPECT_EQ(first[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(first[1].step(), 0);
  EXPECT_EQ(first[2].summary().value(0).tag(), "memory/params_bytes");
  EXPECT_EQ(first[5].step(), 3);
  EXPECT_EQ(first[5].summary().value(0).simple_value(), 1.0f);
  ASSERT_EQ(second.size(), 5u);
  EXPECT_EQ(second[1].step(), 3);  // START after the checkpoint of step 2
  EXPECT_EQ(second[2].step(), 2);  // memory, at the step resumed from
  EXPECT_EQ(second[3].summary().value(0).simple_value(), 0.5f);
  EXPECT_EQ(second[4].step(), 3);  // summary, at the last step
  EXPECT_EQ(second[4].summary().value(0).tag(), "summary/median_step_ms");
}

TEST(TensorBoard, EventFileNamesFollowEachOther) {
  const fs::path dir = fresh_dir("names");
  EXPECT_EQ(train::event_file_name(dir, 1700000000, "h"), "events.out.tfevents.1700000000.h");
  std::ofstream(dir / "events.out.tfevents.1700000005.other");
  std::ofstream(dir / "unrelated.txt");
  EXPECT_EQ(train::event_file_name(dir, 1700000000, "h"), "events.out.tfevents.1700000006.h");
  EXPECT_EQ(train::event_file_name(dir, 1800000000, "h"), "events.out.tfevents.1800000000.h");
}

// FLOPs per cycle of the machines MFU must not break on.
TEST(CpuPeak, FlopsPerCycleOfKnownCores) {
  CpuVectorUnits epyc_zen3{true, false, 0x19, 0x01, true, true, true, false, false, false};
  EXPECT_EQ(fp32_flops_per_cycle(epyc_zen3), 32);
  EXPECT_EQ(bf16_flops_per_cycle(epyc_zen3), 32);  // no native bf16: the fp32 units
  CpuVectorUnits zen1{true, false, 0x17, 0x01, true, true, true, false, false, false};
  EXPECT_EQ(fp32_flops_per_cycle(zen1), 16);
  CpuVectorUnits zen2 = zen1;
  zen2.model = 0x31;
  EXPECT_EQ(fp32_flops_per_cycle(zen2), 32);
  CpuVectorUnits zen4{true, false, 0x19, 0x11, true, true, true, true, true, false};
  EXPECT_EQ(fp32_flops_per_cycle(zen4), 32);
  EXPECT_EQ(bf16_flops_per_cycle(zen4), 64);
  CpuVectorUnits zen5{true, false, 0x1A, 0x02, true, true, true, true, true, false};
  EXPECT_EQ(fp32_flops_per_cycle(zen5), 64);
  CpuVectorUnits sapphire{false, true, 6, 0x8F, true, true, true, true, true, true};
  std::string unit;
  EXPECT_EQ(fp32_flops_per_cycle(sapphire, &unit), 64);
  EXPECT_NE(unit.find("AVX-512"), std::string::npos);
  EXPECT_EQ(bf16_flops_per_cycle(sapphire, &unit), 1024);
  EXPECT_NE(unit.find("AMX"), std::string::npos);
  CpuVectorUnits haswell{false, true, 6, 0x3F, true, true, true, false, false, false};
  EXPECT_EQ(fp32_flops_per_cycle(haswell), 32);
}

TEST(CpuPeak, CpuinfoCountsPhysicalCores) {
  // Two sockets of two cores with two hyperthreads each.
  std::string text;
  int processor = 0;
  for (int socket = 0; socket < 2; ++socket)
    for (int thread = 0; thread < 2; ++thread)
      for (int core = 0; core < 2; ++core)
        text += fmt::format(
            "processor\t: {}\nmodel name\t: Some CPU @ 2.00GHz\nphysical id\t: {}\n"
            "core id\t\t: {}\ncpu MHz\t\t: {}\n\n",
            processor++, socket, core, core == 1 ? "3100.5" : "1200.000");
  const CpuInfo info = parse_cpuinfo(text);
  EXPECT_EQ(info.physical_cores, 4);
  EXPECT_DOUBLE_EQ(info.max_mhz, 3100.5);
  // A VM's cpuinfo without topology: each processor a core.
  EXPECT_EQ(parse_cpuinfo("processor\t: 0\ncpu MHz\t\t: 2000\n\nprocessor\t: 1\n").physical_cores,
            2);
}

// This machine: whatever its vector unit, a positive peak of at most one core per thread.
TEST(CpuPeak, ThisMachineHasAPeak) {
  const CpuPeak one = cpu_peak(1, false);
  EXPECT_EQ(one.cores, 1);
  EXPECT_GT(one.flops(), 0);
  EXPECT_GE(one.flops_per_cycle, 8);
  EXPECT_EQ(cpu_peak(2, false).flops_per_cycle, one.flops_per_cycle);
  EXPECT_GE(cpu_peak(1, true).flops(), one.flops());
}

TEST(Plot, WritesPngAndSvg) {
  const fs::path dir = fresh_dir("plot");
  plot::Chart chart{"loss", "step", "loss", false, true, {}};
  plot::Series a{"run a", {1, 2, 3, 4}, {4.0, 3.0, 2.5, 2.2}, plot::Style::Line, ""};
  plot::Series b{"run b",
                 {1, 2, 3, 4},
                 {4.1, 0.0, 2.4, std::nan("")},  // gaps on a log axis
                 plot::Style::Points,
                 "#000000"};
  chart.series = {a, b};
  plot::draw(chart, dir / "loss.png");
  const std::string png = slurp(dir / "loss.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  plot::draw({chart, chart}, dir / "two.svg", {800, 900, 1});
  EXPECT_NE(slurp(dir / "two.svg").find("<svg"), std::string::npos);
  plot::Chart named{"by set", "", "KL", false, false, {a}, {"corpus", "random", "punct", "code"}};
  plot::draw(named, dir / "named.svg");  // categories under the x axis
  EXPECT_NE(slurp(dir / "named.svg").find("<svg"), std::string::npos);
  for (const auto& e : fs::directory_iterator(dir))  // no temporary left behind
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  test::expect_error([&] { plot::draw(chart, dir / "loss.jpg"); }, "unknown picture format");
  plot::Chart bad = chart;
  bad.series[0].color = "red";
  test::expect_error([&] { plot::draw(bad, dir / "bad.png"); }, "bad colour");
}

TEST(MetricsFile, CurvesOfAMetric) {
  const fs::path dir = fresh_dir("curves");
  std::ofstream(dir / "metrics.jsonl") << R"({"event":"memory","params_bytes":5,"time":1.0})"
                                          "\n"
                                       << R"({"event":"step","step":1,"loss":3.0,"time":2.0})"
                                          "\n"
                                       << R"({"event":"val","step":1,"val_loss":3.5,"time":2.5})"
                                          "\n"
                                       << R"({"event":"step","step":2,"loss":2.0,"time":3.0})"
                                          "\n"
                                       << R"({"event":"step","step":3,"lo)";  // cut by a kill
  const auto rows = train::read_metrics_rows(dir);
  ASSERT_EQ(rows.size(), 4u);
  const auto loss = train::metric_curve(rows, "loss");
  EXPECT_EQ(loss.steps, (std::vector<double>{1, 2}));
  EXPECT_EQ(loss.values, (std::vector<double>{3.0, 2.0}));
  EXPECT_EQ(train::metric_names(rows), (std::vector<std::string>{"loss", "val_loss"}));
  test::expect_error([&] { train::read_metrics_rows(dir / "nope"); }, "is not a run folder");
}

// Durations in the step lines: rounded before they are split, so a minute never reads 60 s.
TEST(MetricsRows, DurationsRollOverAtWholeMinutes) {
  using tessera::train::fmt_duration;
  EXPECT_EQ(fmt_duration(42.2), "42s");
  EXPECT_EQ(fmt_duration(59.6), "1m00s");
  EXPECT_EQ(fmt_duration(179.6), "3m00s");
  EXPECT_EQ(fmt_duration(187.0), "3m07s");
  EXPECT_EQ(fmt_duration(7500.0), "2h05m");
  EXPECT_EQ(fmt_duration(3599.7), "1h00m");
}
