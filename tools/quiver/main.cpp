// quiver: train, run and benchmark decoder-only language models built from
// associative-algebra projections and Relation token mixing.
#include <cstdio>
#include <exception>

#include "bench_util.h"
#include "commands.h"
#include "launch.h"
#include "quiver/error.h"

int main(int argc, char** argv) {
  CLI::App app{"quiver: associative-algebra projections and Relation token mixing"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "quiver 0.1.0");
  quiver::cli::register_train(app);
  quiver::cli::register_generate(app);
  quiver::cli::register_prepare(app);
  quiver::cli::register_tokenize(app);
  quiver::cli::register_info(app);
  quiver::cli::register_compare(app);
  quiver::cli::register_algebra(app);
  quiver::cli::register_op(app);
  quiver::cli::register_bench(app);
  quiver::cli::set_command_line(quiver::cli::command_line(argc, argv));
  quiver::cli::record_argv(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const quiver::Error& e) {
    std::fprintf(stderr, "quiver: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quiver: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
