#include "commands.h"
namespace quiver::cli {
void register_bench(CLI::App& app) { app.add_subcommand("bench", "Benchmarks"); }
}  // namespace quiver::cli
