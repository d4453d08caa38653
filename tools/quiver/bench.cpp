// `quiver bench NAME`: benchmarks against their peers, results written to bench/results/.
#include "commands.h"

namespace quiver::cli {

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks against their peers; results go to bench/results/ with date, machine and command");
  bench->require_subcommand(1);
  register_bench_algproj(*bench);
  register_bench_relation(*bench);
  register_bench_linear_relation(*bench);
  register_bench_model(*bench);
}

}  // namespace quiver::cli
