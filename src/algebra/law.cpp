#include "algebra/law.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/blas.h"
#include "quiver/error.h"
#include "quiver/rng.h"

namespace quiver::algebra {

namespace {

int parse_int(const std::string& text, const std::string& context) {
  QV_CHECK(!text.empty(), "law '{}': expected a number", context);
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    fail("law '{}': '{}' is not a number", context, text);
  }
  QV_CHECK(used == text.size(), "law '{}': '{}' is not a number", context, text);
  QV_CHECK(v >= 0 && v <= 1 << 20, "law '{}': {} is out of range", context, v);
  return static_cast<int>(v);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

constexpr int kMaxGroups = 4096;

void check_q(int q, const std::string& context) {
  QV_CHECK(q >= 1 && q <= kMaxGroups, "law '{}': the number of groups must be in [1, {}], got {}",
           context, kMaxGroups, q);
}

Law parse_factor(const std::string& spec) {
  if (spec == "dense") return Law::dense(1);
  if (spec.rfind("dense:", 0) == 0) return Law::dense(parse_int(spec.substr(6), spec));
  if (spec.rfind("blockdiag:", 0) == 0)
    return Law::block_diagonal(parse_int(spec.substr(10), spec));
  if (spec.rfind("graph:", 0) == 0) {
    std::string rest = spec.substr(6);
    size_t colon = rest.find(':');
    int q = parse_int(rest.substr(0, colon), spec);
    std::vector<std::pair<int, int>> edges;
    if (colon != std::string::npos && colon + 1 < rest.size()) {
      for (const std::string& e : split(rest.substr(colon + 1), ',')) {
        size_t gt = e.find('>');
        QV_CHECK(gt != std::string::npos, "law '{}': edge '{}' must be written a>b", spec, e);
        edges.emplace_back(parse_int(e.substr(0, gt), spec), parse_int(e.substr(gt + 1), spec));
      }
    }
    return Law::graph(q, std::move(edges));
  }
  if (spec.size() >= 2 && spec[0] == 'Q') return Law::complete(parse_int(spec.substr(1), spec));
  fail(
      "unknown law '{}' (expected dense, dense:Q, Qq, blockdiag:Q, graph:Q:a>b,..., or factors "
      "joined by x such as Q2xQ2)",
      spec);
}

}  // namespace

void Law::set_support(std::vector<std::vector<int>> support) {
  for (auto& s : support) std::sort(s.begin(), s.end());
  support_ = std::move(support);
}

bool Law::contributes(int alpha, int beta, int delta) const {
  const auto& s = support(alpha, delta);
  return std::binary_search(s.begin(), s.end(), beta);
}

Law Law::dense(int q) {
  check_q(q, "dense");
  Law law;
  law.name_ = q == 1 ? "dense" : "dense:" + std::to_string(q);
  law.q_ = q;
  law.kind_ = LawKind::Dense;
  std::vector<int> all(q);
  for (int i = 0; i < q; ++i) all[i] = i;
  law.set_support(std::vector<std::vector<int>>(static_cast<size_t>(q) * q, all));
  return law;
}

Law Law::graph(int q, std::vector<std::pair<int, int>> edges) {
  check_q(q, "graph");
  std::set<std::pair<int, int>> seen;
  for (auto [a, b] : edges) {
    QV_CHECK(a >= 0 && a < q && b >= 0 && b < q,
             "graph law: edge {}>{} names a vertex outside [0, {})", a, b, q);
    QV_CHECK(a != b, "graph law: self-loop {}>{} is not allowed", a, b);
    QV_CHECK(seen.insert({a, b}).second, "graph law: edge {}>{} is listed twice", a, b);
  }
  std::sort(edges.begin(), edges.end());
  Law law;
  law.q_ = q;
  law.kind_ = LawKind::Graph;
  law.name_ = "graph:" + std::to_string(q) + ":";
  for (size_t i = 0; i < edges.size(); ++i)
    law.name_ +=
        (i ? "," : "") + std::to_string(edges[i].first) + ">" + std::to_string(edges[i].second);
  std::vector<std::vector<int>> support(static_cast<size_t>(q) * q);
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d) {
      if (a == d)
        support[a * q + d] = {a};
      else if (seen.count({a, d}))
        support[a * q + d] = {a, d};
      else
        support[a * q + d] = {d};
    }
  law.edges_ = std::move(edges);
  law.set_support(std::move(support));
  return law;
}

Law Law::complete(int q) {
  check_q(q, "Q" + std::to_string(q));
  std::vector<std::pair<int, int>> edges;
  for (int a = 0; a < q; ++a)
    for (int b = 0; b < q; ++b)
      if (a != b) edges.emplace_back(a, b);
  Law law = graph(q, std::move(edges));
  law.name_ = "Q" + std::to_string(q);
  return law;
}

Law Law::block_diagonal(int q) {
  Law law = graph(q, {});
  law.name_ = "blockdiag:" + std::to_string(q);
  return law;
}

Law Law::tensor(const Law& a, const Law& b) {
  int q = a.q_ * b.q_;
  check_q(q, a.name_ + "x" + b.name_);
  Law law;
  law.q_ = q;
  law.kind_ = LawKind::Tensor;
  law.name_ = a.name_ + "x" + b.name_;
  for (const Law* f : {&a, &b}) {
    if (f->kind_ == LawKind::Tensor)
      law.factors_.insert(law.factors_.end(), f->factors_.begin(), f->factors_.end());
    else
      law.factors_.push_back(*f);
  }
  std::vector<std::vector<int>> support(static_cast<size_t>(q) * q);
  for (int ga = 0; ga < a.q_; ++ga)
    for (int gb = 0; gb < b.q_; ++gb)
      for (int da = 0; da < a.q_; ++da)
        for (int db = 0; db < b.q_; ++db) {
          auto& s = support[(ga * b.q_ + gb) * q + (da * b.q_ + db)];
          for (int ba : a.support(ga, da))
            for (int bb : b.support(gb, db)) s.push_back(ba * b.q_ + bb);
        }
  law.set_support(std::move(support));
  return law;
}

Law Law::from_table(int q, std::vector<std::vector<int>> support, std::string name) {
  check_q(q, name);
  QV_CHECK(support.size() == static_cast<size_t>(q) * q,
           "law '{}': a support table for q = {} needs {} entries, got {}", name, q, q * q,
           support.size());
  for (auto& s : support)
    for (int b : s)
      QV_CHECK(b >= 0 && b < q, "law '{}': support entry {} outside [0, {})", name, b, q);
  Law law;
  law.q_ = q;
  law.kind_ = LawKind::Table;
  law.name_ = std::move(name);
  law.set_support(std::move(support));
  return law;
}

Law Law::parse(const std::string& spec) {
  QV_CHECK(!spec.empty(), "empty law string");
  std::vector<std::string> parts = split(spec, 'x');
  Law law = parse_factor(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) law = tensor(law, parse_factor(parts[i]));
  return law;
}

// ---- widths -------------------------------------------------------------------------

int64_t GroupWidths::K() const {
  int64_t s = 0;
  for (int64_t v : in) s += v;
  return s;
}
int64_t GroupWidths::N() const {
  int64_t s = 0;
  for (int64_t v : out) s += v;
  return s;
}

GroupWidths GroupWidths::equal(int q, int64_t K, int64_t N) {
  QV_CHECK(q >= 1, "group count must be positive, got {}", q);
  QV_CHECK(K % q == 0, "K = {} is not divisible into {} equal input groups; give --in-groups", K,
           q);
  QV_CHECK(N % q == 0, "N = {} is not divisible into {} equal output groups; give --out-groups", N,
           q);
  return GroupWidths{std::vector<int64_t>(q, K / q), std::vector<int64_t>(q, N / q)};
}

void GroupWidths::validate(int q, int64_t K_expected, int64_t N_expected) const {
  QV_CHECK(static_cast<int>(in.size()) == q,
           "input group widths: the law has {} groups, got {} widths", q, in.size());
  QV_CHECK(static_cast<int>(out.size()) == q,
           "output group widths: the law has {} groups, got {} widths", q, out.size());
  for (size_t i = 0; i < in.size(); ++i)
    QV_CHECK(in[i] > 0, "input group width {} is {}; widths must be positive", i, in[i]);
  for (size_t i = 0; i < out.size(); ++i)
    QV_CHECK(out[i] > 0, "output group width {} is {}; widths must be positive", i, out[i]);
  if (K_expected > 0)
    QV_CHECK(K() == K_expected, "input group widths sum to {}, but K = {}", K(), K_expected);
  if (N_expected > 0)
    QV_CHECK(N() == N_expected, "output group widths sum to {}, but N = {}", N(), N_expected);
}

static std::vector<int64_t> prefix(const std::vector<int64_t>& w) {
  std::vector<int64_t> o(w.size() + 1, 0);
  for (size_t i = 0; i < w.size(); ++i) o[i + 1] = o[i] + w[i];
  return o;
}
std::vector<int64_t> GroupWidths::in_offsets() const { return prefix(in); }
std::vector<int64_t> GroupWidths::out_offsets() const { return prefix(out); }

std::vector<int64_t> parse_widths(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const std::string& p : split(text, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(p, &used);
    } catch (const std::exception&) {
      fail("{}: '{}' is not a width", what, p);
    }
    QV_CHECK(used == p.size() && v > 0, "{}: '{}' is not a positive width", what, p);
    out.push_back(v);
  }
  return out;
}

// ---- schedules ----------------------------------------------------------------------

Schedule Schedule::cyclic() { return Schedule(); }

Schedule Schedule::interval(int64_t period) {
  QV_CHECK(period > 0, "interval schedule: period must be positive, got {}", period);
  Schedule s;
  s.kind_ = Kind::Interval;
  s.period_ = period;
  return s;
}

Schedule Schedule::table(std::vector<int> types) {
  QV_CHECK(!types.empty(), "table schedule: the table is empty");
  for (int t : types) QV_CHECK(t >= 0, "table schedule: negative row type {}", t);
  Schedule s;
  s.kind_ = Kind::Table;
  s.period_ = static_cast<int64_t>(types.size());
  s.table_ = std::move(types);
  return s;
}

Schedule Schedule::parse(const std::string& spec) {
  if (spec == "cyclic") return cyclic();
  if (spec.rfind("interval:", 0) == 0) {
    std::string p = spec.substr(9);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(p, &used);
    } catch (const std::exception&) {
      fail("schedule '{}': period '{}' is not a number", spec, p);
    }
    QV_CHECK(used == p.size(), "schedule '{}': period '{}' is not a number", spec, p);
    return interval(v);
  }
  if (spec.rfind("table:", 0) == 0) {
    std::vector<int> types;
    for (const std::string& t : split(spec.substr(6), ',')) types.push_back(parse_int(t, spec));
    return table(std::move(types));
  }
  fail("unknown schedule '{}' (expected cyclic, interval:P or table:t0,t1,...)", spec);
}

std::string Schedule::name() const {
  switch (kind_) {
    case Kind::Cyclic:
      return "cyclic";
    case Kind::Interval:
      return "interval:" + std::to_string(period_);
    case Kind::Table: {
      std::string s = "table:";
      for (size_t i = 0; i < table_.size(); ++i) s += (i ? "," : "") + std::to_string(table_[i]);
      return s;
    }
  }
  return "?";
}

void Schedule::validate(int q) const {
  if (kind_ == Kind::Interval)
    QV_CHECK(period_ % q == 0, "interval schedule: period {} is not divisible by q = {}", period_,
             q);
  if (kind_ == Kind::Table)
    for (int t : table_)
      QV_CHECK(t < q, "table schedule: row type {} is out of range for q = {}", t, q);
}

int Schedule::type_of(int64_t p, int q) const {
  switch (kind_) {
    case Kind::Cyclic:
      return static_cast<int>(p % q);
    case Kind::Interval:
      return static_cast<int>((p % period_) / (period_ / q));
    case Kind::Table:
      return table_[static_cast<size_t>(p % period_)];
  }
  return 0;
}

std::vector<int> Schedule::types(int64_t pos0, int64_t count, int q) const {
  validate(q);
  std::vector<int> t(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) t[i] = type_of(pos0 + i, q);
  return t;
}

std::vector<int> Schedule::batch_types(int64_t batch, int64_t T, int64_t pos0, int q) const {
  std::vector<int> one = types(pos0, T, q);
  std::vector<int> all;
  all.reserve(static_cast<size_t>(batch * T));
  for (int64_t b = 0; b < batch; ++b) all.insert(all.end(), one.begin(), one.end());
  return all;
}

// ---- facts --------------------------------------------------------------------------

std::vector<double> type_costs(const Law& law, const GroupWidths& widths) {
  int q = law.q();
  widths.validate(q);
  std::vector<double> cost(q, 0.0);
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d)
      for (int b : law.support(a, d)) cost[a] += static_cast<double>(widths.in[b]) * widths.out[d];
  return cost;
}

double arithmetic_fraction(const Law& law, const GroupWidths& widths) {
  std::vector<double> cost = type_costs(law, widths);
  double mean = 0;
  for (double c : cost) mean += c;
  mean /= law.q();
  return mean / (static_cast<double>(widths.K()) * widths.N());
}

namespace {

struct SlotAlgebra {
  int q;
  std::vector<int> slot_index;  // q*q, -1 when (α,δ) is not a slot
  std::vector<std::pair<int, int>> slots;
  // For each output slot: the (left slot, right slot) index pairs of its products.
  std::vector<std::vector<std::pair<int, int>>> terms;
  bool closed = true;  // every product of slots lands on a slot

  explicit SlotAlgebra(const Law& law) : q(law.q()) {
    slot_index.assign(static_cast<size_t>(q) * q, -1);
    for (int a = 0; a < q; ++a)
      for (int d = 0; d < q; ++d)
        if (law.contributes(a, a, d)) {
          slot_index[a * q + d] = static_cast<int>(slots.size());
          slots.emplace_back(a, d);
        }
    terms.resize(slots.size());
    for (int a = 0; a < q; ++a)
      for (int d = 0; d < q; ++d)
        for (int b : law.support(a, d)) {
          int left = slot_index[a * q + b], right = slot_index[b * q + d];
          if (left < 0 || right < 0) continue;
          int out = slot_index[a * q + d];
          if (out < 0) {
            closed = false;
            continue;
          }
          terms[out].emplace_back(left, right);
        }
  }
  int64_t products() const {
    int64_t n = 0;
    for (auto& t : terms) n += static_cast<int64_t>(t.size());
    return n;
  }
  std::vector<double> mul(const std::vector<double>& x, const std::vector<double>& y) const {
    std::vector<double> z(slots.size(), 0.0);
    for (size_t o = 0; o < terms.size(); ++o)
      for (auto [l, r] : terms[o]) z[o] += x[l] * y[r];
    return z;
  }
};

double vec_norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}
double diff_norm(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

std::optional<int64_t> maximal_ideals(const Law& law) {
  switch (law.kind()) {
    case LawKind::Dense:
      return 1;  // M_q is simple
    case LawKind::Graph:
      return law.q();  // Q_G / J ≅ F^q
    case LawKind::Tensor: {
      int64_t t = 1;  // split semisimple quotients multiply
      for (const Law& f : law.factors()) {
        auto tf = maximal_ideals(f);
        if (!tf) return std::nullopt;
        t *= *tf;
      }
      return t;
    }
    case LawKind::Table:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<int64_t> exact_rank(const Law& law) {
  switch (law.kind()) {
    case LawKind::Graph:
      return law.q() + 2 * static_cast<int64_t>(law.edges().size());
    case LawKind::Dense:
      if (law.q() == 1) return 1;
      if (law.q() == 2) return 7;  // R(M_2) = 7 (Strassen; Winograd's lower bound)
      return std::nullopt;
    case LawKind::Tensor: {
      // Known only when at most one factor is nontrivial.
      std::optional<int64_t> r = 1;
      int nontrivial = 0;
      for (const Law& f : law.factors())
        if (f.q() > 1) {
          ++nontrivial;
          r = exact_rank(f);
        }
      if (nontrivial <= 1) return r;
      return std::nullopt;
    }
    case LawKind::Table:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

Facts facts(const Law& law, const GroupWidths& widths, uint64_t seed) {
  Facts f;
  f.q = law.q();
  SlotAlgebra alg(law);
  f.dim = static_cast<int64_t>(alg.slots.size());
  f.products = alg.products();
  f.maximal_ideals = maximal_ideals(law);
  if (f.maximal_ideals) f.rank_lower_bound = 2 * f.dim - *f.maximal_ideals;
  f.rank = exact_rank(law);
  f.type_cost = type_costs(law, widths);
  f.rho = arithmetic_fraction(law, widths);

  Rng rng(seed);
  auto random_element = [&] {
    std::vector<double> v(alg.slots.size());
    for (double& x : v) x = rng.normal();
    return v;
  };
  std::vector<double> unit(alg.slots.size(), 0.0);
  bool has_unit_slots = true;
  for (int a = 0; a < law.q(); ++a) {
    int s = alg.slot_index[a * law.q() + a];
    if (s < 0)
      has_unit_slots = false;
    else
      unit[s] = 1.0;
  }
  double assoc = alg.closed ? 0.0 : INFINITY, unit_err = has_unit_slots ? 0.0 : INFINITY;
  for (int trial = 0; trial < 3; ++trial) {
    auto a = random_element(), b = random_element(), c = random_element();
    auto left = alg.mul(alg.mul(a, b), c);
    auto right = alg.mul(a, alg.mul(b, c));
    assoc = std::max(assoc, diff_norm(left, right) / (vec_norm(a) * vec_norm(b) * vec_norm(c)));
    if (has_unit_slots) {
      unit_err = std::max(unit_err, diff_norm(alg.mul(unit, a), a) / vec_norm(a));
      unit_err = std::max(unit_err, diff_norm(alg.mul(a, unit), a) / vec_norm(a));
    }
  }
  f.associativity_error = assoc;
  f.unit_error = unit_err;
  f.associative = assoc <= 1e-12;
  f.unital = unit_err <= 1e-12;
  return f;
}

// ---- the star product ---------------------------------------------------------------

namespace {
template <typename T>
void star_impl(const Tensor& a, const Tensor& b, Tensor& c, const Law& law, const GroupWidths& wa,
               const GroupWidths& wb) {
  int q = law.q();
  auto ka = wa.in_offsets(), na = wa.out_offsets(), nb = wb.out_offsets();
  int64_t N = wa.N(), P = wb.N();
  const T* A = a.data<T>();
  const T* B = b.data<T>();
  T* C = c.data<T>();
  for (int al = 0; al < q; ++al)
    for (int d = 0; d < q; ++d) {
      bool first = true;
      for (int be : law.support(al, d)) {
        blas::gemm(false, false, wa.in[al], wb.out[d], wa.out[be], T(1), A + ka[al] * N + na[be], N,
                   B + na[be] * P + nb[d], P, first ? T(0) : T(1), C + ka[al] * P + nb[d], P);
        first = false;
      }
      if (first)
        for (int64_t i = 0; i < wa.in[al]; ++i)
          std::fill(C + (ka[al] + i) * P + nb[d], C + (ka[al] + i) * P + nb[d] + wb.out[d], T(0));
    }
}
}  // namespace

Tensor star(const Tensor& a, const Tensor& b, const Law& law, const GroupWidths& wa,
            const GroupWidths& wb) {
  check_ndim(a, 2, "star: A");
  check_ndim(b, 2, "star: B");
  check_cpu_contiguous(a, "star: A");
  check_cpu_contiguous(b, "star: B");
  QV_CHECK(a.dtype() == b.dtype(), "star: A is {} but B is {}", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  wa.validate(law.q(), a.dim(0), a.dim(1));
  wb.validate(law.q(), b.dim(0), b.dim(1));
  QV_CHECK(wa.out == wb.in, "star: A's output groups must equal B's input groups");
  Tensor c = Tensor::empty({a.dim(0), b.dim(1)}, a.dtype());
  if (a.dtype() == DType::F32)
    star_impl<float>(a, b, c, law, wa, wb);
  else if (a.dtype() == DType::F64)
    star_impl<double>(a, b, c, law, wa, wb);
  else
    fail("star: dtype {} is not supported on the CPU (F32, F64)", dtype_name(a.dtype()));
  return c;
}

}  // namespace quiver::algebra
