#include "commands.h"
namespace quiver::cli {
void register_bench_algproj(CLI::App& bench) { bench.add_subcommand("algproj", "(not yet implemented)"); }
}  // namespace quiver::cli
