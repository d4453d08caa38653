#include "commands.h"
namespace quiver::cli {
void register_prepare(CLI::App& app) { app.add_subcommand("prepare", "(not yet implemented)"); }
}  // namespace quiver::cli
