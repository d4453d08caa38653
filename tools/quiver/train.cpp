#include "commands.h"
namespace quiver::cli {
void register_train(CLI::App& app) { app.add_subcommand("train", "(not yet implemented)"); }
}  // namespace quiver::cli
