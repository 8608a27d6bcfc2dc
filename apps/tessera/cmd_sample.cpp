#include "commands.hpp"
#include "tessera/core/error.hpp"

namespace tessera::app {

void add_sample_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("sample", "(being built)");
  cmd->callback([] { throw Error("'sample' is not available in this build yet"); });
}

}  // namespace tessera::app
