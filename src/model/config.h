// Model configuration: plain structs loaded from JSON and validated in one place.
//
// JSON keys are exactly the field names below (nested objects "ffn" and "relation"); a key
// left out keeps its default. Unknown keys and impossible combinations are errors that name
// the field ("ffn.law: ...", "pattern: ..."). Presets live in configs/<name>.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quiver::model {

// Options of the Relation mixers (SPEC §2.1–2.6). tau_s is shared by Full (F) and Linear (L)
// layers; lambda (the count calibration) exists only in F layers.
struct RelationConfig {
  double tau_s = 2.0;           // Self temperature τ_S
  double lambda_init = 0.5;     // initial λ of every F layer
  bool lambda_frozen = false;   // λ keeps lambda_init (no-count-calibration ablation: 0 + frozen)
  bool givens = true;           // Givens head mixing of I (needs an even number of heads, or 1)
  bool exchange_only = false;   // F layers transport only the history: Y_p = Σ_{j<p} F_pj Ĩ_j
  bool raw_x = false;           // I = h (the block's normalized input), no W_I
};

struct FfnConfig {
  std::string kind = "swiglu";          // "swiglu" (gate, up D×F; down F×D) | "gelu" (up D×F, down F×D)
  int64_t width = 0;                    // F
  std::string law = "dense";            // "dense" (ordinary matmul) or an algebra law string (Q2xQ2, Q4, graph:...)
  std::string schedule = "cyclic";      // row-type schedule of an algebraic law: cyclic | interval:P | table:...
  std::vector<int64_t> d_groups, f_groups;  // group widths along D and along F; empty = q equal groups
  bool bias = false;                    // biases on the FFN projections (dense law only)
};

struct ModelConfig {
  std::string name;
  int64_t vocab_size = 0, context = 0, d_model = 0, n_heads = 0, n_kv_heads = 0 /*0 = n_heads*/,
          n_layers = 0;
  std::string pattern;            // one char per layer: A attention, F Full Relation, L Linear Relation
  FfnConfig ffn;
  std::string norm = "rmsnorm";   // "rmsnorm" | "layernorm" (LayerNorm has a bias)
  double norm_eps = 1e-5;
  std::string positions = "rope"; // "rope" | "learned" (learned absolute embeddings, context rows)
  double rope_base = 10000.0;
  bool attn_bias = false;         // biases on the mixer's input and output projections
  bool tied_head = true;
  RelationConfig relation;
  double init_std = 0.02;
  uint64_t seed = 42;

  int64_t head_dim() const;       // d_model / n_heads
  int64_t kv_heads() const;       // n_kv_heads, or n_heads when n_kv_heads = 0; only attention (A)
                                  // layers group their keys and values, Relation layers use n_heads
};

// A .json path, or a preset name looked up as configs/<name>.json relative to the working
// directory, then relative to the executable (../../configs, ../configs, ./configs).
ModelConfig load_config(const std::string& path_or_preset);
// The preset names found by load_config's search, sorted (for messages and `quiver info`).
std::vector<std::string> preset_names();

// Parses and validates.
ModelConfig config_from_json(const nlohmann::json& j);
// Every field, in declaration order; config_from_json(config_to_json(c)) reproduces c.
nlohmann::ordered_json config_to_json(const ModelConfig& c);
// Throws quiver::Error naming the first bad field.
void validate(const ModelConfig& c);

}  // namespace quiver::model
