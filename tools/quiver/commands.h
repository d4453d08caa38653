// Each command of the quiver CLI lives in its own file and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace quiver::cli {

void register_algebra(CLI::App& app);
void register_op(CLI::App& app);
void register_bench(CLI::App& app);

// `quiver op` subcommands, one per op family (each in its own file).
void register_op_algproj(CLI::App& op);

}  // namespace quiver::cli
