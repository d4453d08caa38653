// Tile plans of the fused algebraic-projection kernels (algproj_tiles.h).
#include "ops/algproj_tiles.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "algebra/law.h"
#include "quiver/error.h"

namespace quiver::ops {
namespace {

int32_t narrow(int64_t v, const char* what) {
  QV_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(),
           "algproj tiles: {} = {} does not fit the kernels' 32-bit indices", what, v);
  return static_cast<int32_t>(v);
}

void check_plan_args(const algebra::Law& law, const algebra::GroupWidths& widths,
                     const std::vector<int>& row_types, int tile_rows, int tile_cols) {
  widths.validate(law.q());
  QV_CHECK(tile_rows > 0 && tile_cols > 0, "algproj tiles: tile {}x{} must be positive", tile_rows,
           tile_cols);
  for (size_t m = 0; m < row_types.size(); ++m)
    QV_CHECK(row_types[m] >= 0 && row_types[m] < law.q(),
             "algproj tiles: row {} has type {} outside [0, {})", m, row_types[m], law.q());
  narrow(static_cast<int64_t>(row_types.size()), "M");
  narrow(widths.K(), "K");
  narrow(widths.N(), "N");
}

// Ranges [off[g], off[g+1]) of the listed groups (ascending), merged where contiguous.
std::vector<AlgSegment> merged_ranges(const std::vector<int>& groups, const std::vector<int64_t>& off) {
  std::vector<AlgSegment> out;
  for (int g : groups) {
    const int32_t k0 = static_cast<int32_t>(off[g]), len = static_cast<int32_t>(off[g + 1] - off[g]);
    if (len == 0) continue;
    if (!out.empty() && out.back().k0 + out.back().len == k0)
      out.back().len += len;
    else
      out.push_back({k0, len});
  }
  return out;
}

int64_t reduction_length(const AlgRowPlan& plan, const AlgRowTile& t) {
  int64_t n = 0;
  for (int32_t s = 0; s < t.seg_count; ++s) n += plan.segments[t.seg_begin + s].len;
  return n;
}

// Splits the plan's long tiles (see algproj_tiles.h). A reduction longer than twice the
// target (twice the median tile's, at least 512 columns) is cut into pieces of the target
// length; the target doubles until the partial sums need no more elements than the output
// (or 4M, 16 MB, for small outputs).
void split_long_tiles(AlgRowPlan& plan, int64_t out_elems, int tile_rows, int tile_cols) {
  if (plan.tiles.empty()) return;
  std::vector<int64_t> len(plan.tiles.size());
  for (size_t i = 0; i < plan.tiles.size(); ++i) len[i] = reduction_length(plan, plan.tiles[i]);
  std::vector<int64_t> sorted = len;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const int64_t median = sorted[sorted.size() / 2];
  const int64_t slot_elems = static_cast<int64_t>(tile_rows) * tile_cols;
  auto round_up = [](int64_t v) { return (v + kAlgSplitAlign - 1) / kAlgSplitAlign * kAlgSplitAlign; };
  int64_t target = round_up(std::max<int64_t>(2 * median, 512));
  auto parts_of = [](int64_t l, int64_t t) { return l > 2 * t ? (l + t - 1) / t : int64_t{1}; };
  for (;; target *= 2) {
    int64_t slots = 0;
    for (int64_t l : len) slots += parts_of(l, target) > 1 ? parts_of(l, target) : 0;
    if (slots * slot_elems <= std::max<int64_t>(out_elems, int64_t{1} << 22)) break;
  }
  std::vector<AlgRowTile> tiles;
  for (size_t i = 0; i < plan.tiles.size(); ++i) {
    const AlgRowTile t = plan.tiles[i];
    const int64_t parts = parts_of(len[i], target);
    if (parts == 1) {
      tiles.push_back(t);
      continue;
    }
    AlgSplit sp{t.row_begin, t.row_count, t.col0, t.ncols, plan.num_slots, 0};
    std::vector<AlgSegment> piece;
    int64_t piece_len = 0;
    auto close_piece = [&] {
      AlgRowTile p = t;
      p.seg_begin = static_cast<int32_t>(plan.segments.size());
      p.seg_count = static_cast<int32_t>(piece.size());
      p.slot = sp.slot0 + sp.parts++;
      plan.segments.insert(plan.segments.end(), piece.begin(), piece.end());
      tiles.push_back(p);
      piece.clear();
      piece_len = 0;
    };
    for (int32_t s = 0; s < t.seg_count; ++s) {
      const AlgSegment seg = plan.segments[t.seg_begin + s];
      for (int32_t off = 0; off < seg.len;) {
        const int32_t take = static_cast<int32_t>(std::min<int64_t>(seg.len - off, target - piece_len));
        piece.push_back({seg.k0 + off, take});
        off += take;
        piece_len += take;
        if (piece_len == target) close_piece();
      }
    }
    if (!piece.empty()) close_piece();
    plan.num_slots += sp.parts;
    plan.splits.push_back(sp);
  }
  plan.tiles = std::move(tiles);
}

// The tiles of one class of a packed plan (algproj_tiles.h): column tiles of consecutive whole
// output groups up to tile_cols wide (a wider group cut into tiles of tile_cols), each with the
// union of its groups' reduction groups, every one applied to the columns of the groups that
// reduce over it, laid end to end in chunks of `chunk`.
void add_packed_tiles(AlgRowPlan& plan, const std::vector<std::vector<int>>& groups_of_out,
                      const std::vector<int32_t>& rows, const std::vector<int64_t>& o_off,
                      const std::vector<int64_t>& r_off, int tile_rows, int tile_cols, int chunk) {
  const int q = static_cast<int>(groups_of_out.size());
  const int32_t row_begin = static_cast<int32_t>(plan.rows.size());
  plan.rows.insert(plan.rows.end(), rows.begin(), rows.end());
  const int32_t nrows = static_cast<int32_t>(rows.size());
  struct Part {  // output group g reduced into tile columns [c0, c1)
    int g;
    int32_t c0, c1;
  };
  auto emit = [&](int64_t col0, int32_t ncols, const std::vector<Part>& parts) {
    // Reduction group b -> the tile columns it applies to, as ascending disjoint ranges.
    std::map<int, std::vector<std::pair<int32_t, int32_t>>> cols_of;
    for (const Part& pt : parts)
      for (int b : groups_of_out[pt.g]) {
        auto& rs = cols_of[b];
        if (!rs.empty() && rs.back().second == pt.c0)
          rs.back().second = pt.c1;
        else
          rs.push_back({pt.c0, pt.c1});
      }
    struct Entry {
      int32_t k0, len, c0, c1;
    };
    std::vector<Entry> entries;
    for (const auto& [b, rs] : cols_of) {
      const int32_t k0 = static_cast<int32_t>(r_off[b]), len = static_cast<int32_t>(r_off[b + 1] - r_off[b]);
      if (len == 0) continue;
      for (const auto& [c0, c1] : rs) {
        Entry& last = entries.empty() ? entries.emplace_back(Entry{k0, 0, c0, c1}) : entries.back();
        if (last.k0 + last.len == k0 && last.c0 == c0 && last.c1 == c1)
          last.len += len;  // contiguous reduction groups over the same columns: one segment
        else
          entries.push_back({k0, len, c0, c1});
      }
    }
    // Laid end to end in chunks: pieces cut at a chunk's end, at most kAlgPackMaxPieces a chunk.
    const int32_t seg_begin = static_cast<int32_t>(plan.segments.size());
    int64_t macs_per_row = 0;
    int32_t pos = 0, pieces = 0;
    for (const Entry& e : entries) {
      macs_per_row += static_cast<int64_t>(e.len) * (e.c1 - e.c0);
      for (int32_t off = 0; off < e.len;) {
        if (pieces == kAlgPackMaxPieces) pos = 0, pieces = 0;
        const int32_t take = std::min(e.len - off, chunk - pos);
        plan.segments.push_back({e.k0 + off, take});
        plan.places.push_back({static_cast<int16_t>(e.c0), static_cast<int16_t>(e.c1), static_cast<int16_t>(pos), 0});
        off += take;
        pos += take;
        ++pieces;
        if (pos == chunk) pos = 0, pieces = 0;
      }
    }
    const int32_t seg_count = static_cast<int32_t>(plan.segments.size()) - seg_begin;
    for (int32_t r0 = 0; r0 < nrows; r0 += tile_rows) {
      AlgRowTile t;
      t.row_begin = row_begin + r0;
      t.row_count = std::min<int32_t>(tile_rows, nrows - r0);
      t.col0 = static_cast<int32_t>(col0);
      t.ncols = ncols;
      t.seg_begin = seg_begin;
      t.seg_count = seg_count;
      t.slot = -1;
      plan.tiles.push_back(t);
      plan.macs += t.row_count * macs_per_row;
    }
  };
  for (int g = 0; g < q;) {
    const int64_t width = o_off[g + 1] - o_off[g];
    if (width == 0) {
      ++g;
      continue;
    }
    if (width > tile_cols) {  // a wide group alone, cut into tiles of tile_cols
      for (int64_t c0 = 0; c0 < width; c0 += tile_cols) {
        const int32_t n = static_cast<int32_t>(std::min<int64_t>(tile_cols, width - c0));
        emit(o_off[g] + c0, n, {{g, 0, n}});
      }
      ++g;
      continue;
    }
    std::vector<Part> parts;  // consecutive whole groups while they fit
    int64_t end = o_off[g];
    for (; g < q && o_off[g + 1] - o_off[parts.empty() ? g : parts.front().g] <= tile_cols; ++g) {
      if (o_off[g + 1] == o_off[g]) continue;
      const int64_t start = parts.empty() ? o_off[g] : o_off[parts.front().g];
      parts.push_back({g, static_cast<int32_t>(o_off[g] - start), static_cast<int32_t>(o_off[g + 1] - start)});
      end = o_off[g + 1];
    }
    emit(o_off[parts.front().g], static_cast<int32_t>(end - o_off[parts.front().g]), parts);
  }
}

}  // namespace

AlgRowPlan plan_row_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                         const std::vector<int>& row_types, AlgPass pass, int tile_rows,
                         int tile_cols, bool split, int pack_chunk) {
  QV_CHECK(pass == AlgPass::Forward || pass == AlgPass::DX,
           "plan_row_pass: the pass must be Forward or DX");
  check_plan_args(law, widths, row_types, tile_rows, tile_cols);
  // (A packed plan's column ranges and chunk positions are 16-bit.)
  QV_CHECK(pack_chunk == 0 || (pass == AlgPass::Forward && pack_chunk > 0 && pack_chunk <= 4096 && tile_cols <= 4096),
           "plan_row_pass: packed plans are forward plans of at most 4096 columns a tile and chunks of at most 4096 "
           "(asked: {}, chunk {}, {} columns)", pass == AlgPass::Forward ? "forward" : "dX", pack_chunk, tile_cols);
  const int q = law.q();
  const bool fwd = pass == AlgPass::Forward;
  const std::vector<int64_t> in_off = widths.in_offsets(), out_off = widths.out_offsets();
  // Output groups of this pass (δ forward, β for dX) and the reduction groups' offsets.
  const std::vector<int64_t>& o_off = fwd ? out_off : in_off;
  const std::vector<int64_t>& r_off = fwd ? in_off : out_off;

  // Each type's reduction groups per output group, and the classes of identical types.
  std::vector<std::vector<std::vector<int>>> groups(q, std::vector<std::vector<int>>(q));
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d)
      for (int b : law.support(a, d)) {
        if (fwd)
          groups[a][d].push_back(b);  // y_δ reduces over β ∈ B(α, δ)
        else
          groups[a][b].push_back(d);  // dx_β reduces over δ with β ∈ B(α, δ)
      }
  for (auto& per_out : groups)
    for (auto& g : per_out) std::sort(g.begin(), g.end());
  std::vector<int> class_of(q, -1), representative;
  for (int a = 0; a < q; ++a) {
    for (size_t c = 0; c < representative.size() && class_of[a] < 0; ++c)
      if (groups[representative[c]] == groups[a]) class_of[a] = static_cast<int>(c);
    if (class_of[a] < 0) {
      class_of[a] = static_cast<int>(representative.size());
      representative.push_back(a);
    }
  }
  std::vector<std::vector<int32_t>> class_rows(representative.size());
  for (size_t m = 0; m < row_types.size(); ++m)
    class_rows[class_of[row_types[m]]].push_back(static_cast<int32_t>(m));

  AlgRowPlan plan;
  plan.slot_rows = tile_rows;
  plan.slot_cols = tile_cols;
  if (pack_chunk > 0) {
    for (size_t c = 0; c < representative.size(); ++c)
      if (!class_rows[c].empty())
        add_packed_tiles(plan, groups[representative[c]], class_rows[c], o_off, r_off, tile_rows, tile_cols,
                         pack_chunk);
    std::stable_sort(plan.tiles.begin(), plan.tiles.end(), [&](const AlgRowTile& x, const AlgRowTile& y) {
      return reduction_length(plan, x) > reduction_length(plan, y);
    });
    return plan;
  }
  for (size_t c = 0; c < representative.size(); ++c) {
    const std::vector<int32_t>& rows = class_rows[c];
    if (rows.empty()) continue;
    const int32_t row_begin = static_cast<int32_t>(plan.rows.size());
    plan.rows.insert(plan.rows.end(), rows.begin(), rows.end());
    const int32_t nrows = static_cast<int32_t>(rows.size());
    for (int g = 0; g < q; ++g) {
      const int64_t width = o_off[g + 1] - o_off[g];
      if (width == 0) continue;
      const std::vector<AlgSegment> segs = merged_ranges(groups[representative[c]][g], r_off);
      const int32_t seg_begin = static_cast<int32_t>(plan.segments.size());
      plan.segments.insert(plan.segments.end(), segs.begin(), segs.end());
      int64_t red = 0;
      for (const AlgSegment& s : segs) red += s.len;
      for (int64_t c0 = 0; c0 < width; c0 += tile_cols)
        for (int32_t r0 = 0; r0 < nrows; r0 += tile_rows) {
          AlgRowTile t;
          t.row_begin = row_begin + r0;
          t.row_count = std::min<int32_t>(tile_rows, nrows - r0);
          t.col0 = static_cast<int32_t>(o_off[g] + c0);
          t.ncols = static_cast<int32_t>(std::min<int64_t>(tile_cols, width - c0));
          t.seg_begin = seg_begin;
          t.seg_count = static_cast<int32_t>(segs.size());
          t.slot = -1;
          plan.tiles.push_back(t);
          plan.macs += static_cast<int64_t>(t.row_count) * t.ncols * red;
        }
    }
  }
  if (split)
    split_long_tiles(plan, static_cast<int64_t>(row_types.size()) * o_off[q], tile_rows, tile_cols);
  std::stable_sort(plan.tiles.begin(), plan.tiles.end(), [&](const AlgRowTile& x, const AlgRowTile& y) {
    return reduction_length(plan, x) > reduction_length(plan, y);
  });
  return plan;
}

AlgClusterPlan plan_cluster_split(AlgRowPlan plan, int chunk, int max_rows, int max_cols, int max_parts) {
  QV_CHECK(chunk > 0 && max_rows > 0 && max_cols > 0 && max_parts >= 2,
           "plan_cluster_split: chunk {}, max_rows {}, max_cols {} and max_parts {} (at least 2) must be positive",
           chunk, max_rows, max_cols, max_parts);
  QV_CHECK(plan.splits.empty() && plan.places.empty(), "plan_cluster_split: the plan must be neither split nor packed");
  AlgClusterPlan out;
  if (plan.tiles.empty()) {
    out.plan = std::move(plan);
    return out;
  }
  // Each tile's reduction in whole chunks (0: some segment is not whole chunks).
  std::vector<int64_t> len(plan.tiles.size()), chunks(plan.tiles.size(), 0);
  for (size_t i = 0; i < plan.tiles.size(); ++i) {
    const AlgRowTile& t = plan.tiles[i];
    len[i] = reduction_length(plan, t);
    bool whole = t.seg_count > 0;
    for (int32_t s = 0; s < t.seg_count; ++s) {
      const AlgSegment seg = plan.segments[t.seg_begin + s];
      whole = whole && seg.k0 % chunk == 0 && seg.len % chunk == 0;
    }
    if (whole) chunks[i] = len[i] / chunk;
  }
  std::vector<int64_t> sorted = len;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const int64_t median = std::max<int64_t>(1, (sorted[sorted.size() / 2] + chunk - 1) / chunk);
  auto is_long = [&](size_t i) {
    return chunks[i] >= 4 && chunks[i] >= 4 * median && plan.tiles[i].row_count <= max_rows &&
           plan.tiles[i].ncols <= max_cols;
  };
  int64_t longest = 0;
  for (size_t i = 0; i < plan.tiles.size(); ++i)
    if (is_long(i)) longest = std::max(longest, chunks[i]);
  if (longest > 0) {
    out.parts = static_cast<int>(std::clamp<int64_t>((longest + 2 * median - 1) / (2 * median), 2, max_parts));
    std::vector<AlgRowTile> rest, long_tiles;
    for (size_t i = 0; i < plan.tiles.size(); ++i) (is_long(i) ? long_tiles : rest).push_back(plan.tiles[i]);
    plan.tiles = std::move(rest);
    // Column tiles of the same rows and segments (one output group's) merged where they adjoin.
    auto group = [](const AlgRowTile& t) { return std::tuple(t.row_begin, t.row_count, t.seg_begin, t.seg_count); };
    std::sort(long_tiles.begin(), long_tiles.end(), [&](const AlgRowTile& a, const AlgRowTile& b) {
      return std::tuple(group(a), a.col0) < std::tuple(group(b), b.col0);
    });
    for (const AlgRowTile& t : long_tiles) {
      AlgRowTile* last = out.split.empty() ? nullptr : &out.split.back();
      if (last != nullptr && group(*last) == group(t) && last->col0 + last->ncols == t.col0 &&
          last->ncols + t.ncols <= max_cols)
        last->ncols += t.ncols;
      else
        out.split.push_back(t);
    }
    for (const AlgRowTile& t : out.split) out.cols = std::max(out.cols, t.ncols);
  }
  out.plan = std::move(plan);
  return out;
}

AlgDiagonalGemm plan_diagonal_gemm(const algebra::Law& law, const algebra::GroupWidths& widths) {
  widths.validate(law.q());
  const int q = law.q();
  AlgDiagonalGemm out;
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d)
      if (!law.contributes(a, d, d)) {
        out.why_not = fmt::format("type {} does not reduce output group {} over its own input block", a, d);
        return out;
      }
  for (int g = 0; g < q; ++g)
    if (widths.in[g] != widths.in[0] || widths.out[g] != widths.out[0] || widths.in[g] == 0 || widths.out[g] == 0) {
      out.why_not = "the groups are not all one width (input) and one width (output)";
      return out;
    }
  out.in = widths.in[0];
  out.out = widths.out[0];
  return out;
}

void drop_diagonal_tiles(AlgWeightPlan& plan, const algebra::GroupWidths& widths) {
  QV_CHECK(plan.splits.empty(), "drop_diagonal_tiles: the plan must be unsplit");
  const std::vector<int64_t> in_off = widths.in_offsets(), out_off = widths.out_offsets();
  auto group_of = [](const std::vector<int64_t>& off, int64_t at) {
    return static_cast<int>(std::upper_bound(off.begin(), off.end(), at) - off.begin()) - 1;
  };
  std::erase_if(plan.tiles, [&](const AlgWeightTile& t) { return group_of(in_off, t.k0) == group_of(out_off, t.col0); });
}

AlgTwoGroupPlan plan_two_group_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                                    const std::vector<int>& row_types, int tile_rows, int half_cols, int chunk) {
  check_plan_args(law, widths, row_types, tile_rows, half_cols);
  QV_CHECK(chunk > 0, "algproj two-group plan: chunk {} must be positive", chunk);
  AlgTwoGroupPlan out;
  auto fail = [&](std::string why) {
    out.plan = AlgRowPlan{};
    out.why_not = std::move(why);
    return out;
  };
  const int q = law.q();
  if (q % 2 != 0) return fail("an odd number of groups");
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d) {
      const std::vector<int>& b = law.support(a, d);
      const bool typed = std::find(b.begin(), b.end(), a) != b.end();
      const bool rest_own = std::all_of(b.begin(), b.end(), [&](int g) { return g == a || g == d; });
      if (!typed || !rest_own) return fail("a group's blocks are not the row type's and at most its own");
    }
  const int64_t n_out = widths.out[0];
  for (int g = 0; g < q; ++g) {
    if (widths.out[g] != n_out) return fail("unequal output groups");
    if (widths.in[g] == 0 || widths.in[g] % chunk != 0) return fail("an input block is not whole chunks");
  }
  if (n_out == 0 || n_out % kAlgTmaAlign != 0 || n_out > half_cols) return fail("an output group is no store box");
  const std::vector<int64_t> k_off = widths.in_offsets(), n_off = widths.out_offsets();
  AlgRowPlan& plan = out.plan;
  plan.slot_rows = tile_rows;
  plan.slot_cols = 2 * half_cols;
  std::vector<std::vector<int32_t>> rows_of(q);
  for (size_t m = 0; m < row_types.size(); ++m) rows_of[row_types[m]].push_back(static_cast<int32_t>(m));
  // Segment slots of type a and the pair (d, d + 1); a slot's length 0 where it adds nothing.
  const auto block = [&](int g, bool used) {
    return AlgSegment{narrow(k_off[g], "column"), used ? narrow(k_off[g + 1] - k_off[g], "column") : 0};
  };
  // A tile's reduction with the typed block counted for both groups.
  const auto reduction = [&](const AlgRowTile& t) { return reduction_length(plan, t) + plan.segments[t.seg_begin].len; };
  for (int a = 0; a < q; ++a) {
    const std::vector<int32_t>& rows = rows_of[a];
    if (rows.empty()) continue;
    const int32_t row_begin = static_cast<int32_t>(plan.rows.size());
    plan.rows.insert(plan.rows.end(), rows.begin(), rows.end());
    for (int d = 0; d < q; d += 2) {
      const int32_t seg_begin = static_cast<int32_t>(plan.segments.size());
      plan.segments.push_back(block(a, true));
      for (int g = d; g < d + 2; ++g) {
        const std::vector<int>& b = law.support(a, g);
        plan.segments.push_back(block(g, g != a && std::find(b.begin(), b.end(), g) != b.end()));
      }
      for (int32_t r0 = 0; r0 < static_cast<int32_t>(rows.size()); r0 += tile_rows) {
        AlgRowTile t;
        t.row_begin = row_begin + r0;
        t.row_count = std::min<int32_t>(tile_rows, static_cast<int32_t>(rows.size()) - r0);
        t.col0 = narrow(n_off[d], "column");
        t.ncols = narrow(2 * n_out, "column");
        t.seg_begin = seg_begin;
        t.seg_count = 3;
        t.slot = -1;
        plan.tiles.push_back(t);
        plan.macs += static_cast<int64_t>(t.row_count) * n_out * reduction(t);
      }
    }
  }
  // Longest reduction first, as the other row plans.
  std::stable_sort(plan.tiles.begin(), plan.tiles.end(),
                   [&](const AlgRowTile& x, const AlgRowTile& y) { return reduction(x) > reduction(y); });
  if (tile_row_stride(plan, static_cast<int64_t>(row_types.size())) == 0)
    return fail("a tile's rows are not one progression of a stride that divides M");
  return out;
}

int tile_row_stride(const AlgRowPlan& plan, int64_t M) {
  int stride = 0;
  for (const AlgRowTile& t : plan.tiles) {
    if (t.row_count < 2) continue;
    const int s = plan.rows[t.row_begin + 1] - plan.rows[t.row_begin];
    if (s < 1 || (stride != 0 && s != stride)) return 0;
    stride = s;
    for (int i = 2; i < t.row_count; ++i)
      if (plan.rows[t.row_begin + i] - plan.rows[t.row_begin + i - 1] != s) return 0;
  }
  if (stride == 0) stride = 1;  // single rows only
  return M % stride == 0 ? stride : 0;
}

int uniform_row_stride(const AlgRowPlan& plan, int64_t M) {
  for (const AlgRowTile& t : plan.tiles)
    if (t.col0 % kAlgTmaAlign != 0) return 0;
  for (const AlgSegment& sg : plan.segments)
    if (sg.k0 % kAlgTmaAlign != 0) return 0;
  return tile_row_stride(plan, M);
}

AlgStoreBox uniform_store_box(const AlgRowPlan& plan, int64_t M) {
  if (plan.tiles.empty() || !plan.splits.empty()) return {};
  const AlgRowTile& first = plan.tiles.front();
  for (const AlgRowTile& t : plan.tiles)
    if (t.slot >= 0 || t.row_count != first.row_count || t.ncols != first.ncols || t.col0 % kAlgTmaAlign != 0)
      return {};
  if (first.row_count < 1 || first.row_count > 256 || first.ncols % kAlgTmaAlign != 0 || first.ncols > 256) return {};
  const int stride = tile_row_stride(plan, M);
  if (stride == 0) return {};
  return {first.row_count, first.ncols, stride};
}

AlgWeightPlan plan_weight_pass(const algebra::Law& law, const algebra::GroupWidths& widths,
                               const std::vector<int>& row_types, int tile_rows, int tile_cols, bool split,
                               int64_t min_pieces) {
  check_plan_args(law, widths, row_types, tile_rows, tile_cols);
  const int q = law.q();
  const std::vector<int64_t> in_off = widths.in_offsets(), out_off = widths.out_offsets();
  std::vector<std::vector<int32_t>> type_rows(q);
  for (size_t m = 0; m < row_types.size(); ++m) type_rows[row_types[m]].push_back(static_cast<int32_t>(m));

  AlgWeightPlan plan;
  std::map<std::vector<bool>, std::pair<int32_t, int32_t>> lists;  // set of types -> rows range
  auto rows_of = [&](const std::vector<bool>& set) {
    auto it = lists.find(set);
    if (it != lists.end()) return it->second;
    std::vector<int32_t> rows;
    for (int a = 0; a < q; ++a)
      if (set[a]) rows.insert(rows.end(), type_rows[a].begin(), type_rows[a].end());
    std::sort(rows.begin(), rows.end());
    const std::pair<int32_t, int32_t> range{static_cast<int32_t>(plan.rows.size()),
                                            static_cast<int32_t>(rows.size())};
    plan.rows.insert(plan.rows.end(), rows.begin(), rows.end());
    lists.emplace(set, range);
    return range;
  };
  for (int b = 0; b < q; ++b)
    for (int d = 0; d < q; ++d) {
      const int64_t s = in_off[b + 1] - in_off[b], r = out_off[d + 1] - out_off[d];
      if (s == 0 || r == 0) continue;
      std::vector<bool> set(q);
      for (int a = 0; a < q; ++a) set[a] = law.contributes(a, b, d);
      const auto [list_begin, list_count] = rows_of(set);
      for (int64_t k0 = 0; k0 < s; k0 += tile_rows)
        for (int64_t c0 = 0; c0 < r; c0 += tile_cols) {
          AlgWeightTile t;
          t.k0 = static_cast<int32_t>(in_off[b] + k0);
          t.nk = static_cast<int32_t>(std::min<int64_t>(tile_rows, s - k0));
          t.col0 = static_cast<int32_t>(out_off[d] + c0);
          t.ncols = static_cast<int32_t>(std::min<int64_t>(tile_cols, r - c0));
          t.list_begin = list_begin;
          t.list_count = list_count;
          t.slot = -1;
          plan.tiles.push_back(t);
          plan.macs += static_cast<int64_t>(t.nk) * t.ncols * list_count;
        }
    }
  // Long lists: the row pass's rule (twice the median, at least 512 rows), and, where the plan
  // has fewer than `min_pieces` tiles (a few dW blocks reduced over many rows: a small weight
  // at a large M), pieces of about total / min_pieces rows (at least 512), so that the kernel
  // has enough blocks to hide its latency. Slots are bounded by twice dW's size or 32 MB; the
  // pieces are consecutive parts of the list.
  plan.slot_rows = tile_rows;
  plan.slot_cols = tile_cols;
  if (split && !plan.tiles.empty()) {
    std::vector<int64_t> sorted;
    int64_t total = 0;
    for (const AlgWeightTile& t : plan.tiles) {
      sorted.push_back(t.list_count);
      total += t.list_count;
    }
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const int64_t slot_elems = static_cast<int64_t>(tile_rows) * tile_cols;
    auto parts_of = [](int64_t l, int64_t target) { return l > 2 * target ? (l + target - 1) / target : int64_t{1}; };
    auto aligned_up = [](int64_t v) { return (v + kAlgSplitAlign - 1) / kAlgSplitAlign * kAlgSplitAlign; };
    int64_t target = aligned_up(std::max<int64_t>(2 * sorted[sorted.size() / 2], 512));
    if (min_pieces > static_cast<int64_t>(plan.tiles.size()))
      target = std::min(target, aligned_up(std::max<int64_t>((total + min_pieces - 1) / min_pieces, 512)));
    for (;; target *= 2) {
      int64_t slots = 0;
      for (const AlgWeightTile& t : plan.tiles)
        if (parts_of(t.list_count, target) > 1) slots += parts_of(t.list_count, target);
      if (slots * slot_elems <= std::max<int64_t>(2 * widths.K() * widths.N(), int64_t{1} << 23)) break;
    }
    std::vector<AlgWeightTile> tiles;
    for (const AlgWeightTile& t : plan.tiles) {
      const int64_t parts = parts_of(t.list_count, target);
      if (parts == 1) {
        tiles.push_back(t);
        continue;
      }
      AlgWeightSplit sp{t.k0, t.nk, t.col0, t.ncols, plan.num_slots, static_cast<int32_t>(parts)};
      for (int64_t p = 0; p < parts; ++p) {
        AlgWeightTile piece = t;
        piece.list_begin = static_cast<int32_t>(t.list_begin + p * target);
        piece.list_count = static_cast<int32_t>(std::min<int64_t>(target, t.list_count - p * target));
        piece.slot = static_cast<int32_t>(sp.slot0 + p);
        tiles.push_back(piece);
      }
      plan.num_slots += sp.parts;
      plan.splits.push_back(sp);
    }
    plan.tiles = std::move(tiles);
  }
  std::stable_sort(plan.tiles.begin(), plan.tiles.end(),
                   [](const AlgWeightTile& x, const AlgWeightTile& y) { return x.list_count > y.list_count; });
  return plan;
}

AlgWeightChunks plan_weight_chunks(const AlgWeightPlan& plan, const std::vector<int>& row_types, int stride) {
  AlgWeightChunks out;
  const int64_t M = static_cast<int64_t>(row_types.size());
  QV_CHECK(stride >= 1, "algproj tiles: chunk stride {} must be positive", stride);
  // Cuts rows (ascending within each run of one step) into chunks along runs of step 1 or stride.
  auto cut = [&](const std::vector<int32_t>& rows) {
    size_t i = 0;
    while (i < rows.size()) {
      int32_t d = 1;
      if (i + 1 < rows.size() && rows[i + 1] - rows[i] == stride) d = stride;
      size_t n = 1;
      while (i + n < rows.size() && n < static_cast<size_t>(kAlgTmaChunkRows) &&
             rows[i + n] - rows[i + n - 1] == d)
        ++n;
      out.chunks.push_back({rows[i], static_cast<int16_t>(n), static_cast<int16_t>(d != 1)});
      i += n;
    }
  };
  auto progression = [](const int32_t* r, int32_t n, int32_t d) {
    for (int32_t i = 1; i < n; ++i)
      if (r[i] - r[i - 1] != d) return false;
    return true;
  };
  int64_t rows_total = 0;
  std::vector<std::vector<int32_t>> by_type;
  for (const AlgWeightTile& t : plan.tiles) {
    if (t.k0 % kAlgTmaAlign != 0 || t.col0 % kAlgTmaAlign != 0) return AlgWeightChunks{};
    out.tile_begin.push_back(static_cast<int32_t>(out.chunks.size()));
    const int32_t* r = plan.rows.data() + t.list_begin;
    rows_total += t.list_count;
    if (t.list_count == 0) continue;
    if (progression(r, t.list_count, 1) || progression(r, t.list_count, stride)) {
      cut(std::vector<int32_t>(r, r + t.list_count));
      continue;
    }
    by_type.assign(by_type.size(), {});
    for (int32_t i = 0; i < t.list_count; ++i) {
      const int ty = row_types[r[i]];
      if (static_cast<size_t>(ty) >= by_type.size()) by_type.resize(ty + 1);
      by_type[ty].push_back(r[i]);
    }
    for (const std::vector<int32_t>& rows : by_type) cut(rows);
  }
  out.tile_begin.push_back(static_cast<int32_t>(out.chunks.size()));
  narrow(static_cast<int64_t>(out.chunks.size()), "weight chunks");
  const bool strided = std::any_of(out.chunks.begin(), out.chunks.end(), [](const AlgWeightChunk& c) { return c.strided; });
  if ((strided && M % stride != 0) ||
      (!out.chunks.empty() && 2 * rows_total < static_cast<int64_t>(out.chunks.size()) * kAlgTmaChunkRows))
    return AlgWeightChunks{};
  out.stride = stride;
  return out;
}

AlgPairPlan plan_pair_pass(const algebra::Law& law, const algebra::GroupWidths& widths, const std::vector<int>& row_types,
                           int tile_rows, int groups, int group_box) {
  check_plan_args(law, widths, row_types, tile_rows, group_box);
  QV_CHECK(groups == 1 || groups == 2, "algproj pair plan: {} groups a tile (1 or 2)", groups);
  AlgPairPlan out;
  auto fail = [&](std::string why) {
    out.tiles.clear();
    out.why_not = std::move(why);
    return out;
  };
  const int q = law.q();
  const int64_t M = static_cast<int64_t>(row_types.size());
  for (int a = 0; a < q; ++a)
    for (int d = 0; d < q; ++d) {
      const std::vector<int>& b = law.support(a, d);
      const bool own = std::find(b.begin(), b.end(), d) != b.end();
      const bool rest_typed = b.size() == 1 || (b.size() == 2 && std::find(b.begin(), b.end(), a) != b.end());
      if (!own || !rest_typed) return fail("a group reduces over blocks other than its own and the row type's");
    }
  const int64_t in = widths.in[0], n_out = widths.out[0];
  const std::vector<int64_t> k_off = widths.in_offsets(), n_off = widths.out_offsets();
  for (int g = 0; g < q; ++g)
    if (widths.in[g] != in || widths.out[g] != n_out) return fail("unequal group widths");
  if (in % 2 != 0 || n_out % 2 != 0) return fail("odd group widths");
  // Rows: each type's rows in runs of tile_rows, each run one progression of the plan's stride.
  std::vector<std::vector<int32_t>> rows_of(q);
  for (int64_t m = 0; m < M; ++m) rows_of[row_types[m]].push_back(static_cast<int32_t>(m));
  int64_t stride = 0;
  for (const auto& r : rows_of) {
    if (r.size() % tile_rows != 0) return fail("a type's rows are not whole tiles");
    for (size_t i = 0; i < r.size(); i += tile_rows)
      for (int j = 1; j < tile_rows; ++j) {
        const int64_t step = r[i + j] - r[i + j - 1];
        if (stride == 0) stride = step;
        if (step != stride) return fail("a tile's rows are not one progression of the plan's stride");
      }
  }
  if (stride == 0) stride = 1;
  if (M % stride != 0) return fail("M is not a multiple of the rows' stride");
  // Columns: whole groups in pairs, or equal parts of one group, each tile from a 16-byte boundary.
  int64_t parts = 1, cols = n_out;
  if (groups == 2) {
    if (q % 2 != 0) return fail("an odd number of groups");
    if ((2 * n_out) % kAlgTmaAlign != 0 || 2 * n_out > 256) return fail("a pair of groups is no store box");
    if (n_out + (n_out % kAlgTmaAlign) > group_box) return fail("a group is wider than its W box");
  } else {
    while (cols > group_box || cols % kAlgTmaAlign != 0) {
      if (++parts > n_out) return fail("a group cannot be cut into store boxes");
      if (n_out % parts == 0) cols = n_out / parts;
    }
  }
  // x boxes: the least odd multiple of 8 columns holding every block from its 8-column boundary
  // (rows of 16 · odd bytes: the 8 rows of one ldmatrix fall in distinct banks).
  int64_t need = 0;
  for (int g = 0; g < q; ++g) need = std::max(need, k_off[g] % 8 + in);
  int64_t slot = 8;
  while (slot < need) slot += 16;
  out.stride = static_cast<int>(stride);
  out.in = static_cast<int>(in);
  out.slot = static_cast<int>(slot);
  out.group_cols = static_cast<int>(cols);
  out.tile_cols = static_cast<int>(groups * cols);
  if (groups == 2) {
    int64_t gap = (k_off[1] & ~int64_t{7}) - (k_off[0] & ~int64_t{7});
    for (int d = 2; d < q; d += 2)
      if ((k_off[d + 1] & ~int64_t{7}) - (k_off[d] & ~int64_t{7}) != gap) gap = 0;
    out.own_gap = static_cast<int>(gap);
  }
  for (int a = 0; a < q; ++a)
    for (size_t i = 0; i < rows_of[a].size(); i += tile_rows)
      for (int d = 0; d < q; d += groups)
        for (int64_t part = 0; part < parts; ++part) {
          AlgPairTile t{};
          t.row0 = rows_of[a][i];
          t.col0 = narrow(n_off[d] + part * cols, "column");
          t.k_typed = narrow(k_off[a], "column");
          for (int g = 0; g < groups; ++g) {
            const int64_t first = n_off[d + g] + part * cols;
            t.k_own[g] = narrow(k_off[d + g], "column");
            t.w_col[g] = narrow(first / kAlgTmaAlign * kAlgTmaAlign, "column");
            t.shift[g] = static_cast<int32_t>(first - t.w_col[g]);
            if (law.support(a, d + g).size() == 2) t.typed |= 1 << g;
            out.macs += static_cast<int64_t>(tile_rows) * cols * static_cast<int64_t>(law.support(a, d + g).size()) * in;
          }
          if (t.col0 % 64 == 0) out.segments.push_back(static_cast<int32_t>(out.tiles.size()));
          out.tiles.push_back(t);
        }
  out.segments.push_back(static_cast<int32_t>(out.tiles.size()));
  return out;
}

}  // namespace quiver::ops
