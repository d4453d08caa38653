// Associative-algebra laws as support tables (SPEC §1.1–1.4).
//
// A law on q feature groups gives, for a row of type α and an output group δ, the set
// B(α, δ) of input groups whose blocks contribute:  y_δ = Σ_{β ∈ B(α,δ)} x_β W_{βδ}.
// Widths (s_β input, r_δ output) may be unequal and rectangular; the row type of a
// token is a function of its absolute position only (Schedule).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quiver/tensor.h"

namespace quiver::algebra {

enum class LawKind { Dense, Graph, Tensor, Table };

class Law {
 public:
  // Constructors for the laws the engine provides.
  static Law dense(int q);                                          // B = all groups (M_q)
  static Law graph(int q, std::vector<std::pair<int, int>> edges);  // Q_G
  static Law complete(int q);                                       // Q_q
  static Law block_diagonal(int q);                                 // empty graph
  static Law tensor(const Law& a, const Law& b);                    // a ⊗ b, a coarse
  // Any support table (support[α*q + δ] = B(α, δ)); facts that need the algebra's
  // structure (exact rank, maximal ideals) are unknown for it.
  static Law from_table(int q, std::vector<std::vector<int>> support, std::string name = "table");

  // Parses a law string: "dense" | "dense:Q" | "Qq" | "blockdiag:Q" | "graph:Q:a>b,c>d" |
  // factors joined by 'x' ("Q2xQ2", "Q2xQ2xQ2"). Errors name the bad part.
  static Law parse(const std::string& spec);

  const std::string& name() const { return name_; }
  int q() const { return q_; }
  LawKind kind() const { return kind_; }
  const std::vector<std::pair<int, int>>& edges() const { return edges_; }  // graph laws
  const std::vector<Law>& factors() const { return factors_; }              // tensor laws

  // B(α, δ): the sorted input groups contributing to output group δ for row type α.
  const std::vector<int>& support(int alpha, int delta) const {
    return support_[static_cast<size_t>(alpha) * q_ + delta];
  }
  bool contributes(int alpha, int beta, int delta) const;

 private:
  Law() = default;
  void set_support(std::vector<std::vector<int>> support);

  std::string name_;
  int q_ = 1;
  LawKind kind_ = LawKind::Dense;
  std::vector<std::pair<int, int>> edges_;
  std::vector<Law> factors_;
  std::vector<std::vector<int>> support_;  // q*q lists, index α*q + δ
};

// Feature-group widths: s (input, sum K) and r (output, sum N), q entries each.
struct GroupWidths {
  std::vector<int64_t> in;
  std::vector<int64_t> out;
  int64_t K() const;
  int64_t N() const;
  // Equal groups; K and N must be divisible by q.
  static GroupWidths equal(int q, int64_t K, int64_t N);
  // Validates against a law (q entries, positive) and, when K/N > 0, the sums.
  void validate(int q, int64_t K = 0, int64_t N = 0) const;
  std::vector<int64_t> in_offsets() const;   // q+1 prefix sums
  std::vector<int64_t> out_offsets() const;  // q+1 prefix sums
};

// Parses "a,b,c" into widths; errors name the bad entry.
std::vector<int64_t> parse_widths(const std::string& text, const char* what);

// Row-type schedules τ(p), a function of the absolute position p only.
class Schedule {
 public:
  enum class Kind { Cyclic, Interval, Table };
  static Schedule cyclic();
  static Schedule interval(int64_t period);       // τ(p) = floor((p mod P)/(P/q))
  static Schedule table(std::vector<int> types);  // τ(p) = types[p mod len]
  // "cyclic" | "interval:P" | "table:t0,t1,...".
  static Schedule parse(const std::string& spec);

  Kind kind() const { return kind_; }
  int64_t period() const { return period_; }
  std::string name() const;
  void validate(int q) const;  // P divisible by q, table entries in [0, q)
  int type_of(int64_t position, int q) const;
  // Types of `count` consecutive positions starting at pos0.
  std::vector<int> types(int64_t pos0, int64_t count, int q) const;
  // Types of a [batch, T] token block whose positions restart at pos0 in each sequence.
  std::vector<int> batch_types(int64_t batch, int64_t T, int64_t pos0, int q) const;

 private:
  Kind kind_ = Kind::Cyclic;
  int64_t period_ = 0;
  std::vector<int> table_;
};

// Facts of a law's algebra (SPEC §1.2). The algebra's basis is the set of slots
// (α, δ) with α ∈ B(α, δ) (the diagonal and the edges of a graph law); its structure
// constants are e_{αβ} e_{βδ} = e_{αδ} when β ∈ B(α, δ), all other products 0.
struct Facts {
  int q = 0;
  int64_t dim = 0;
  std::optional<int64_t> rank;              // exact bilinear rank when known
  std::optional<int64_t> maximal_ideals;    // t(A): maximal two-sided ideals
  std::optional<int64_t> rank_lower_bound;  // Alder–Strassen: 2·dim − t(A)
  int64_t products = 0;                     // explicit block-product count of the evaluation
  double rho = 0;                           // arithmetic fraction for the given widths
  std::vector<double> type_cost;  // MACs per row of each type: Σ_δ Σ_{β∈B} s_β r_δ
  bool associative = false;
  bool unital = false;
  double associativity_error = 0;  // max over trials of ‖(ab)c − a(bc)‖ / (‖a‖‖b‖‖c‖)
  double unit_error = 0;           // max of ‖1a − a‖/‖a‖ and ‖a1 − a‖/‖a‖
};

Facts facts(const Law& law, const GroupWidths& widths, uint64_t seed = 1);

// Per-type MACs per row and the arithmetic fraction ρ for given widths.
std::vector<double> type_costs(const Law& law, const GroupWidths& widths);
double arithmetic_fraction(const Law& law, const GroupWidths& widths);

// The ⋆ product of weight banks: A is K×N with widths wa, B is N×P with widths wb
// (wa.out == wb.in): (A⋆B)_{αδ} = Σ_{β∈B(α,δ)} A_{αβ} B_{βδ}. For graph laws this is
// the composition law Φ_B(Φ_A(X)) = Φ_{A⋆B}(X) (SPEC §1.3). F32 or F64 on the CPU.
Tensor star(const Tensor& a, const Tensor& b, const Law& law, const GroupWidths& wa,
            const GroupWidths& wb);

}  // namespace quiver::algebra
