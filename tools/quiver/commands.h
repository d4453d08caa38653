// Each command of the quiver CLI lives in its own file and registers itself here.
#pragma once
#include <CLI/CLI.hpp>

namespace quiver::cli {

void register_algebra(CLI::App& app);
void register_op(CLI::App& app);
void register_bench(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_prepare(CLI::App& app);
void register_info(CLI::App& app);
void register_train(CLI::App& app);
void register_generate(CLI::App& app);
void register_compare(CLI::App& app);

// `quiver op` subcommands, one file per op family.
void register_op_algproj(CLI::App& op);
void register_op_attention(CLI::App& op);
void register_op_relation(CLI::App& op);
void register_op_linear_relation(CLI::App& op);

// `quiver bench` subcommands, one file per benchmark family.
void register_bench_algproj(CLI::App& bench);
void register_bench_relation(CLI::App& bench);
void register_bench_linear_relation(CLI::App& bench);
void register_bench_model(CLI::App& bench);

}  // namespace quiver::cli
