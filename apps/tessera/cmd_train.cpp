#include "commands.hpp"
#include "tessera/core/error.hpp"

namespace tessera::app {

void add_train_command(CLI::App& root) {
  auto* cmd = root.add_subcommand("train", "(being built)");
  cmd->callback([] { throw Error("'train' is not available in this build yet"); });
}

}  // namespace tessera::app
