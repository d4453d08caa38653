#include "commands.h"
namespace quiver::cli {
void register_bench_relation(CLI::App& bench) { bench.add_subcommand("relation", "(not yet implemented)"); }
}  // namespace quiver::cli
