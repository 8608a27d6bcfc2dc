// tessera: one binary, one subcommand per file (see commands.hpp).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/suggest.hpp"
#include "tessera/kernels/cuda/device.hpp"

namespace {

std::string did_you_mean(std::string_view word, const std::vector<std::string>& names,
                         const std::string& prefix) {
  const std::string near = tessera::closest(word, names);
  return near.empty() ? std::string() : "did you mean " + prefix + near + "? ";
}

// Names the command and long options of argv that the parser does not know, before it runs:
// CLI11 would otherwise first complain about a required option ("--model is required" for
// "--modle"), or ask for a subcommand when the command is misspelled.
void check_names(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = &app;
  std::string path = "tessera";
  bool value_next = false;  // the previous token was an option that takes a value
  for (int i = 1; i < argc; ++i) {
    const std::string_view tok = argv[i];
    if (tok == "--") return;
    if (!tok.empty() && tok[0] == '-') {
      const bool is_long = tok.size() > 2 && tok.substr(0, 2) == "--";
      const std::size_t eq = tok.find('=');
      const std::string name(tok.substr(0, eq));
      const CLI::Option* opt = sub->get_option_no_throw(name);
      value_next = eq == std::string_view::npos && opt && opt->get_type_size_max() > 0;
      if (!is_long || opt || name == "--help" || name == "--version") continue;
      std::vector<std::string> names;
      for (const CLI::Option* o : sub->get_options())
        for (const auto& n : o->get_lnames()) names.push_back(n);
      throw tessera::Error(fmt::format("unknown option {} for '{}'", name, path),
                           did_you_mean(name.substr(2), names, "--") + "see '" + path + " --help'");
    }
    if (std::exchange(value_next, false)) continue;  // an option's value, not a command
    std::vector<std::string> names;
    CLI::App* next = nullptr;
    for (CLI::App* c : sub->get_subcommands({})) {
      names.push_back(c->get_name());
      if (c->get_name() == tok) next = c;
    }
    if (next) {
      sub = next;
      path += " " + std::string(tok);
      continue;
    }
    bool positional = false;
    for (const CLI::Option* o : sub->get_options()) positional = positional || o->get_positional();
    if (!names.empty() && !positional)  // a word where only a command can stand
      throw tessera::Error(fmt::format("unknown command '{}' for '{}'", tok, path),
                           did_you_mean(tok, names, "") + "see '" + path + " --help'");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera: train, plan, quantize and study GPT-2- and Llama-style language models",
               "tessera"};
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
  tessera::app::add_plot_command(app);
  tessera::app::add_tune_command(app);
  tessera::app::add_study_command(app);
  if (argc == 1) {  // bare tessera: what it can do
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    check_names(app, argc, argv);
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
