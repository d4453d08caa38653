#include "commands.h"
namespace quiver::cli {
void register_bench_linear_relation(CLI::App& bench) { bench.add_subcommand("linear_relation", "(not yet implemented)"); }
}  // namespace quiver::cli
