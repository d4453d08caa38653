#include "infer/sampler.h"

#include <algorithm>
#include <cmath>

#include "quiver/error.h"

namespace quiver::infer {

void SamplerOptions::validate() const {
  QV_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be ≥ 0, got {}",
           temperature);
  QV_CHECK(top_k >= 0, "top-k must be ≥ 0 (0 = off), got {}", top_k);
  QV_CHECK(top_p > 0 && top_p <= 1, "top-p must be in (0, 1], got {}", top_p);
}

int32_t argmax(const float* logits, int64_t V) {
  QV_CHECK(V > 0, "argmax over an empty vocabulary");
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    QV_CHECK(!std::isnan(logits[i]), "logit of token {} is NaN", i);
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(SamplerOptions options) : options_(options), rng_(options.seed) { options_.validate(); }

const std::vector<std::pair<double, int32_t>>& Sampler::kept(const float* logits, int64_t V) const {
  QV_CHECK(V > 0, "sampling from an empty vocabulary");
  // Candidates by logit, larger first; equal logits by ascending id, so the choice is deterministic.
  auto by_logit = [logits](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  std::vector<int32_t>& ids = ids_scratch_;
  ids.clear();
  if (options_.top_k > 0 && options_.top_k < V) {
    // One pass with a heap of the k best so far, its worst on top: O(V log k), mostly one
    // comparison per token.
    const size_t k = static_cast<size_t>(options_.top_k);
    for (int64_t i = 0; i < V; ++i) {
      QV_CHECK(!std::isnan(logits[i]), "logit of token {} is NaN", i);
      const int32_t id = static_cast<int32_t>(i);
      if (ids.size() < k) {
        ids.push_back(id);
        std::push_heap(ids.begin(), ids.end(), by_logit);
      } else if (by_logit(id, ids.front())) {
        std::pop_heap(ids.begin(), ids.end(), by_logit);
        ids.back() = id;
        std::push_heap(ids.begin(), ids.end(), by_logit);
      }
    }
  } else {
    ids.resize(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) {
      QV_CHECK(!std::isnan(logits[i]), "logit of token {} is NaN", i);
      ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    }
  }
  int32_t best = ids[0];
  for (int32_t id : ids)
    if (by_logit(id, best)) best = id;
  const double max_logit = logits[best];
  QV_CHECK(std::isfinite(max_logit), "every logit is -inf or +inf; nothing to sample");
  // softmax(logits / temperature) over the candidates.
  std::vector<std::pair<double, int32_t>>& items = items_scratch_;
  items.resize(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double w = std::exp((static_cast<double>(logits[ids[i]]) - max_logit) / options_.temperature);
    items[i] = {w, ids[i]};
    total += w;
  }
  for (auto& item : items) item.first /= total;
  if (options_.top_p < 1) {
    auto more_likely = [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    // The nucleus is usually small: order the 256 most likely, and all of them only when those
    // do not reach top_p.
    double mass = 0;
    size_t keep = 0;
    for (size_t m = std::min<size_t>(items.size(), 256);; m = items.size()) {
      std::partial_sort(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(m), items.end(), more_likely);
      mass = 0;
      keep = 0;
      while (keep < m && mass < options_.top_p) mass += items[keep++].first;
      if (mass >= options_.top_p || m == items.size()) break;
    }
    items.resize(std::max<size_t>(keep, 1));
    for (auto& item : items) item.first /= mass;
  }
  return items;
}

std::vector<double> Sampler::distribution(const float* logits, int64_t V) const {
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  if (options_.is_greedy()) {
    p[static_cast<size_t>(argmax(logits, V))] = 1.0;
    return p;
  }
  for (const auto& [prob, id] : kept(logits, V)) p[static_cast<size_t>(id)] = prob;
  return p;
}

int32_t Sampler::sample(const float* logits, int64_t V) {
  if (options_.is_greedy()) return argmax(logits, V);
  const auto& items = kept(logits, V);
  const double u = rng_.uniform();
  double cumulative = 0;
  for (const auto& [prob, id] : items) {
    cumulative += prob;
    if (u < cumulative) return id;
  }
  return items.back().second;
}

}  // namespace quiver::infer
