// tessera: one binary, one subcommand per file (see commands.hpp).
#include <cstdio>
#include <exception>
#include <filesystem>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/kernels/cuda/device.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tessera: train, plan, quantize and study GPT-style language models", "tessera"};
  app.set_version_flag("--version", [] {
    return std::string("tessera ") + TESSERA_VERSION + " (" +
           tessera::kernels::cuda::describe_devices() + ")";
  });
  app.require_subcommand(1);
  tessera::app::add_prepare_command(app);
  tessera::app::add_tokenize_command(app);
  tessera::app::add_train_command(app);
  tessera::app::add_sample_command(app);
  tessera::app::add_eval_command(app);
  tessera::app::add_convert_command(app);
  tessera::app::add_plan_command(app);
  tessera::app::add_simulate_command(app);
  tessera::app::add_probe_command(app);
  tessera::app::add_quantize_command(app);
  tessera::app::add_outliers_command(app);
  tessera::app::add_study_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (hint: run 'tessera --help' or 'tessera <command> --help')\n",
                 e.what());
    return 2;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "%s\n", tessera::format_error_line(e).c_str());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory (hint: use a smaller batch, sequence or model)\n");
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the environment does not allow (a symbolic-link loop, a file where a folder is
    // needed, no permission) is bad input, not a bug; the places that know better say more.
    std::fprintf(stderr, "error: %s (hint: check the path and its permissions)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal: %s (hint: this is a bug in tessera, please report it)\n",
                 e.what());
    return 3;
  }
  return 0;
}
