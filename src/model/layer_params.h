// What the CPU model (model.cpp) and the GPU model (cuda/model.cpp) derive from a config in the
// same way: the layers' parameter handles by name, and the algebra of the FFN projections.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "algebra/law.h"
#include "model/config.h"

namespace quiver::model {

// Binds a layer's parameter handles by name: both models keep the same fields, so the names of
// model::param_table are spelled in one place. `get(name)` returns the handle of a parameter,
// or an undefined one when the config has no such tensor.
template <class Layer, class Get>
void bind_layer_params(Layer& L, char kind, int64_t index, Get&& get) {
  const std::string p = "layers." + std::to_string(index) + ".";
  L.kind = kind;
  L.norm1_w = get(p + "norm1.weight");
  L.norm1_b = get(p + "norm1.bias");
  L.norm2_w = get(p + "norm2.weight");
  L.norm2_b = get(p + "norm2.bias");
  // Input projections of the mixer: A: q, k, v; F and L: p1, p2, I.
  const char* attention_names[3] = {"q", "k", "v"};
  const char* relation_names[3] = {"1", "2", "i"};
  for (int i = 0; i < 3; ++i) {
    const std::string s = kind == 'A' ? attention_names[i] : relation_names[i];
    L.w_in[i] = get(p + "mixer.w" + s);
    L.b_in[i] = get(p + "mixer.b" + s);
  }
  L.w_out = get(p + "mixer.wo");
  L.b_out = get(p + "mixer.bo");
  L.theta = get(p + "mixer.theta");
  L.lambda = get(p + "mixer.lambda");
  L.w_alpha_down = get(p + "mixer.w_alpha_down");
  L.w_alpha_up = get(p + "mixer.w_alpha_up");
  L.a_log = get(p + "mixer.a_log");
  L.dt_bias = get(p + "mixer.dt_bias");
  L.ffn_gate = get(p + "ffn.gate");
  L.ffn_up = get(p + "ffn.up");
  L.ffn_down = get(p + "ffn.down");
  L.ffn_gate_b = get(p + "ffn.gate_bias");
  L.ffn_up_b = get(p + "ffn.up_bias");
  L.ffn_down_b = get(p + "ffn.down_bias");
}

// The FFN's algebraic law (none for "dense"): gate and up map D → F with `up` widths, down
// maps F → D with `down` widths (q equal groups when the config gives none); row types follow
// the schedule.
struct FfnLaw {
  algebra::Law law;
  algebra::GroupWidths up, down;
  algebra::Schedule schedule;
};

inline std::optional<FfnLaw> ffn_law(const ModelConfig& cfg) {
  if (cfg.ffn.law == "dense") return std::nullopt;
  algebra::Law law = algebra::Law::parse(cfg.ffn.law);
  const int q = law.q();
  std::vector<int64_t> dg = cfg.ffn.d_groups, fg = cfg.ffn.f_groups;
  if (dg.empty()) dg.assign(q, cfg.d_model / q);
  if (fg.empty()) fg.assign(q, cfg.ffn.width / q);
  return FfnLaw{std::move(law), algebra::GroupWidths{dg, fg}, algebra::GroupWidths{fg, dg},
                    algebra::Schedule::parse(cfg.ffn.schedule)};
}

}  // namespace quiver::model
