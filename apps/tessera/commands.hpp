// Each subcommand lives in its own file and registers itself on the root CLI::App.
// The callback runs the command; it throws tessera::Error for user-facing failures.
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::app {

void add_prepare_command(CLI::App& root);
void add_tokenize_command(CLI::App& root);
void add_train_command(CLI::App& root);
void add_sample_command(CLI::App& root);
void add_eval_command(CLI::App& root);
void add_convert_command(CLI::App& root);
void add_plan_command(CLI::App& root);
void add_simulate_command(CLI::App& root);
void add_probe_command(CLI::App& root);
void add_quantize_command(CLI::App& root);
void add_outliers_command(CLI::App& root);
void add_plot_command(CLI::App& root);
void add_tune_command(CLI::App& root);
void add_study_command(CLI::App& root);
void add_study_memorization_command(CLI::App& study);  // under `study`
void add_study_scaling_command(CLI::App& study);       // under `study`

}  // namespace tessera::app
