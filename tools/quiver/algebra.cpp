#include "commands.h"
namespace quiver::cli {
void register_algebra(CLI::App& app) { app.add_subcommand("algebra", "Inspect an algebra law"); }
}  // namespace quiver::cli
