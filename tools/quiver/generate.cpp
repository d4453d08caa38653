#include "commands.h"
namespace quiver::cli {
void register_generate(CLI::App& app) { app.add_subcommand("generate", "(not yet implemented)"); }
}  // namespace quiver::cli
