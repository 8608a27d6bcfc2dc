#include "commands.hpp"
#include "tessera/core/error.hpp"

namespace tessera::app {

void add_prepare_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("prepare", "(being built)");
  cmd->callback([] { throw Error("'prepare' is not available in this build yet"); });
}

}  // namespace tessera::app
