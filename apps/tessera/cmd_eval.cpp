#include "commands.hpp"
#include "tessera/core/error.hpp"

namespace tessera::app {

void add_eval_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("eval", "(being built)");
  cmd->callback([] { throw Error("'eval' is not available in this build yet"); });
}

}  // namespace tessera::app
