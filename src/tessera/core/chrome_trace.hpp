// Chrome / Perfetto trace files (the JSON "Trace Event Format": complete events "ph":"X" with
// microsecond "ts" and "dur", and thread-name metadata), written by the training step's executor
// (measured) and by the schedule simulator (predicted) with the same names: one thread per
// pipeline stage, one event per instruction ("F(3,0)", "RA(3,0)<-0", ...; parallel::describe).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tessera {

struct TraceEvent {
  int pid = 0;                    // the process: the rank (measured) or 0 (simulated)
  int tid = 0;                    // the thread: the pipeline stage
  std::string name;               // the instruction
  std::string cat;                // "compute", "comm", "idle", "send", "optimizer"
  double start_s = 0, dur_s = 0;  // from the start of the step
};

// Writes `events` with a thread name "stage N" for each (pid, tid) that appears, and `config`
// in otherData. Throws tessera::Error when the file cannot be written.
void write_chrome_trace(const std::filesystem::path& path, const std::vector<TraceEvent>& events,
                        const std::string& config);

// The complete events of a trace file (metadata skipped). Throws tessera::Error, naming the file,
// when it is not such a trace.
std::vector<TraceEvent> read_chrome_trace(const std::filesystem::path& path);

}  // namespace tessera
