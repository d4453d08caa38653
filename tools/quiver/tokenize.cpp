#include "commands.h"
namespace quiver::cli {
void register_tokenize(CLI::App& app) { app.add_subcommand("tokenize", "(not yet implemented)"); }
}  // namespace quiver::cli
