#include "commands.hpp"
#include "tessera/core/error.hpp"

namespace tessera::app {

void add_tokenize_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("tokenize", "(being built)");
  cmd->callback([] { throw Error("'tokenize' is not available in this build yet"); });
}

}  // namespace tessera::app
