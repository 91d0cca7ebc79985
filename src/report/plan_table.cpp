#include "report/plan_table.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/units.h"
#include "plan/local_plan.h"
#include "report/plan_text.h"

namespace ht::report {

namespace {

using Row = std::vector<std::string>;

struct Unit {
  double scale;
  const char* name;
};

Unit byte_unit(double bytes) {
  constexpr double kib = 1024, mib = kib * 1024, gib = mib * 1024;
  if (bytes >= gib) return {gib, "GiB"};
  if (bytes >= mib) return {mib, "MiB"};
  if (bytes >= kib) return {kib, "KiB"};
  return {1, "B"};
}

// The number only, so a breakdown can share its total's unit.
std::string amount(double bytes, Unit unit) {
  return unit.scale == 1 ? number("%.0f", bytes) : number("%.1f", bytes / unit.scale);
}

std::string rate_text(double per_s) { return number(per_s >= 100 ? "%.0f" : "%.1f", per_s); }

std::string percent(double fraction) { return number("%.0f%%", fraction * 100); }

std::string counted(size_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// Device names may hold any UTF-8; counting bytes would misalign the columns after them.
size_t display_width(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// Left-aligned columns two spaces apart; the last column is not padded, so no line ends
// in blanks.
std::string align(const std::vector<Row>& rows) {
  std::vector<size_t> width;
  for (const Row& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], display_width(row[i]));
  }
  std::string out;
  for (const Row& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += row[i];
      if (i + 1 < row.size()) out += std::string(width[i] - display_width(row[i]) + 2, ' ');
    }
    out += "\n";
  }
  return out;
}

// A run of consecutive ranks shown as one line.
struct Group {
  const plan::RankPlan* first;
  const plan::RankPlan* last;
  Row cells;
};

// Consecutive ranks with equal cells share a group when `continues(last, next)`; ranks
// with no cells are left out.
template <class CellsOf, class Continues>
std::vector<Group> group_ranks(const plan::Plan& plan, CellsOf cells_of, Continues continues) {
  std::vector<Group> groups;
  for (const plan::RankPlan& r : plan.ranks) {
    Row cells = cells_of(r);
    if (cells.empty()) continue;
    Group* g = groups.empty() ? nullptr : &groups.back();
    if (g && g->last->rank + 1 == r.rank && g->cells == cells && continues(*g->last, r))
      g->last = &r;
    else
      groups.push_back({&r, &r, std::move(cells)});
  }
  return groups;
}

std::string range(int first, int last) {
  return first == last ? std::to_string(first) : number("%d-%d", first, last);
}

std::string rank_range(const Group& g) { return range(g.first->rank, g.last->rank); }

std::string shape(const plan::Plan& plan) {
  const auto& replicas = plan.layout.replicas;
  const std::string name = plan::to_string(plan.strategy);
  if (replicas.empty()) return name;
  const size_t r = replicas.size(), s = replicas[0].size();
  if (s == 1) return name + ": " + counted(r, "replica");
  if (r == 1) return name + ": " + counted(s, "stage");
  return name + ": " + counted(r, "replica") + " x " + counted(s, "stage");
}

// In data parallelism every rank is its own replica, so a row that merged only ranks with
// equal replicas would never merge there: a group spans a run of replicas of one stage.
bool same_stage_next_replica(const plan::RankPlan& last, const plan::RankPlan& next) {
  if (last.replica < 0 || next.replica < 0) return last.replica == next.replica;
  return next.stage == last.stage && next.replica == last.replica + 1;
}

std::string placement(const Group& g) {
  if (g.first->replica < 0) return "-";
  const std::string replicas = range(g.first->replica, g.last->replica);
  return "r" + replicas + number("/s%d", g.first->stage);
}

std::string layers(const plan::Plan& plan, const plan::RankPlan& r) {
  if (r.replica < 0 || r.block_end <= r.block_begin) return "-";
  if (r.block_begin == 0 && r.block_end == plan.blocks) return "all";
  if (r.block_end - r.block_begin == 1) return number("b%d", r.block_begin);
  return number("b%d-b%d", r.block_begin, r.block_end - 1);
}

std::string share(const plan::RankPlan& r) {
  if (r.replica < 0) return "-";
  return std::to_string(r.samples) + " (" + std::to_string(r.micro_batches) + "x" +
         std::to_string(r.micro_batch_size) + ")";
}

std::string memory_total(const plan::RankPlan& r) {
  const double used = r.memory.total(), capacity = r.device.memory_bytes;
  if (capacity <= 0) return format_bytes(used);  // capacity unknown: no ratio to show
  return format_bytes(used) + " / " + format_bytes(capacity) + " (" + percent(used / capacity) +
         ")";
}

// All four kinds in their total's unit, so they compare at a glance.
std::string memory_kinds(const plan::MemoryUse& m) {
  const Unit unit = byte_unit(m.total());
  return amount(m.params, unit) + "/" + amount(m.grads, unit) + "/" +
         amount(m.optimizer, unit) + "/" + amount(m.activations, unit) + " " + unit.name;
}

std::string header(const plan::Plan& plan) {
  return align({{"config:", plan.config_name},
                {"cluster:", plan.cluster_source},
                {"world size:", std::to_string(plan.world_size)},
                {"strategy:", shape(plan)},
                {"global batch:", std::to_string(plan.global_batch)},
                {"sync policy:", to_string(plan.sync_policy)}});
}

// Under local, per replica: its share of its group's first inner step of a round, in
// the micro-batches the executor runs it in (size_group_step). The layout's shares are
// the groups' nominal split of one global batch, which the inner steps scale: at 1,024
// ranks in one-rank groups every rank showed the whole global batch.
std::vector<std::string> local_shares(const plan::Plan& plan) {
  std::vector<std::string> out(plan.layout.samples.size());
  if (!plan.local) return out;
  for (size_t g = 0; g < plan.local->groups.size(); ++g) {
    const int group = static_cast<int>(g);
    const std::vector<int> replicas = plan.local->groups[g];
    const std::vector<int64_t> shares = plan::step_shares(plan, group, plan::inner_step_samples(plan, group, 0));
    // Each replica's micro-batches as size_group_step runs them. Replicas of one nominal
    // share and count get the step's split within one sample of each other (cumulative
    // floor): shown as one range, so that their rows stay one.
    std::vector<int64_t> mbs(shares.size());
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> range;  // (nominal, count) -> least, most
    auto key = [&](size_t i) { return std::make_pair(plan.layout.samples[static_cast<size_t>(replicas[i])], mbs[i]); };
    for (size_t i = 0; i < shares.size(); ++i) {
      const int64_t most = plan::fitting_micro_batch(plan, replicas[i]);
      mbs[i] = std::max<int64_t>(1, std::min(shares[i], (shares[i] + most - 1) / most));
      auto [it, fresh] = range.try_emplace(key(i), shares[i], shares[i]);
      it->second = {std::min(it->second.first, shares[i]), std::max(it->second.second, shares[i])};
    }
    for (size_t i = 0; i < shares.size(); ++i) {
      const auto [least, most_share] = range.at(key(i));
      out[static_cast<size_t>(replicas[i])] =
          (least == most_share ? std::to_string(least) : std::to_string(least) + "-" + std::to_string(most_share)) +
          " (" + std::to_string(mbs[i]) + "x" + std::to_string((most_share + mbs[i] - 1) / mbs[i]) + ")";
    }
  }
  return out;
}

std::string rank_table(const plan::Plan& plan) {
  std::vector<Row> rows = {
      {"rank", "device", "r/s", "GFLOP/s", "layers", "share", "memory", "p/g/o/a", "busy", "strategy"}};
  const std::vector<std::string> inner = local_shares(plan);
  const auto groups = group_ranks(plan, [&](const plan::RankPlan& r) -> Row {
    return {r.device.id + (r.slow_link ? "*" : ""),
            // Probed ranks of one CPU model differ only here (quotas, contention).
            number("%.0f", r.device.flops / 1e9),
            layers(plan, r),
            plan.local && r.replica >= 0 ? inner[static_cast<size_t>(r.replica)] : share(r),
            memory_total(r),
            memory_kinds(r.memory),
            percent(r.busy_fraction),
            memory_strategies_text(r.memory_strategies)};
  }, same_stage_next_replica);
  for (const Group& g : groups) {
    rows.push_back({rank_range(g), g.cells[0], placement(g)});
    rows.back().insert(rows.back().end(), g.cells.begin() + 1, g.cells.end());
  }
  std::string out = align(rows);
  const bool any_slow = std::any_of(plan.ranks.begin(), plan.ranks.end(),
                                    [](const plan::RankPlan& r) { return r.slow_link; });
  if (any_slow) out += "(* slow link: see below)\n";
  if (plan.local) out += "(share: of the rank's group's first inner step of a round, under sync: local below)\n";
  return out;
}

std::string predictions(const plan::Plan& plan) {
  const plan::Prediction& p = plan.predicted;
  const plan::Baseline& b = plan.baseline;
  std::string out = "predicted: step " + format_seconds(p.step_seconds) + ", " +
                    rate_text(p.samples_per_s) + " samples/s, bubble " +
                    percent(p.bubble_fraction) + "\n";
  out += "baseline (" + baseline_name(static_cast<int>(b.stage_ranges.size())) + "): step " +
         format_seconds(b.predicted.step_seconds) + ", " + rate_text(b.predicted.samples_per_s) +
         " samples/s\n";
  if (!b.fits) {
    out += "baseline does not fit:\n";
    for (const std::string& line : shortfall_lines(b.shortfalls)) out += "  " + line + "\n";
  }
  out += "speed-up over baseline: " +
         (plan.speedup < 1e6 ? number("%.2fx", plan.speedup) : number("%.3gx", plan.speedup)) +
         (b.fits ? "" : " (as if it fitted; it cannot run)") + "\n";
  // Against a baseline that cannot run, the one that can, where the notes have it: the
  // uniform layers of the plan's shape (DeepSpeed's default), which fits.
  if (!b.fits)
    for (const plan::PlanNote& n : plan.notes)
      if (n.kind == plan::NoteKind::uniform_baseline && !n.problem && n.seconds > 0 && p.step_seconds > 0)
        out += "speed-up over uniform layers over " + std::to_string(n.stages) +
               " stages (DeepSpeed's default, which fits): " + number("%.2fx", n.seconds / p.step_seconds) + "\n";
  return out;
}

// "title:" and one line per distinct line that `line_of` has for some rank, with every
// rank that has it, in the order of its first rank: an interleaved cluster of two
// devices gave one line per rank when only consecutive ranks shared one.
template <class LineOf>
std::string rank_section(const plan::Plan& plan, const std::string& title, LineOf line_of) {
  std::vector<std::pair<int, std::string>> items;
  for (const plan::RankPlan& r : plan.ranks)
    if (const Row cells = line_of(r); !cells.empty()) items.emplace_back(r.rank, cells[0]);
  if (items.empty()) return "";
  std::string out = title + ":\n";
  for (const auto& [line, ranks] : ranks_by_text(items)) out += "  " + ranks_text(ranks) + ": " + line + "\n";
  return out;
}

std::string sections(const plan::Plan& plan) {
  // Under local the memory fit is of the groups' nominal split of one global batch; the
  // inner steps take the fitting micro-batch as often as their shares need.
  std::string out = rank_section(plan, plan.local ? "memory strategies (at the groups' nominal split of one global batch)"
                                                  : "memory strategies",
                                 [](const plan::RankPlan& r) {
    const std::string reason = memory_reason_text(r);
    return reason.empty() ? Row{} : Row{reason};
  });
  out += rank_section(plan, "slow links", [](const plan::RankPlan& r) {
    return r.slow_link ? Row{slow_link_text(r)} : Row{};
  });
  if (!plan.notes.empty()) {
    out += "notes:\n";
    for (const plan::PlanNote& note : plan.notes) out += "  - " + note_text(note) + "\n";
  }
  return out;
}

}  // namespace

std::string format_plan(const plan::Plan& plan) {
  return header(plan) + "\n" + rank_table(plan) + "\n" + predictions(plan) + "\n" +
         sections(plan) + "candidates evaluated: " + std::to_string(plan.candidates) + "\n";
}

}  // namespace ht::report
