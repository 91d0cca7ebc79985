// The bad-node guard: every step, before a rank's gradient contribution leaves the rank,
// the rank checks it (non-finite values; a norm far above its recent ones) and, when it
// fails, sends zeros with a sample count of 0 instead. The counts travel with the
// reduction, so after it every member of the stage group knows the samples kept and who
// was left out, and rescales the sum to the mean over the kept samples
// (rescale_to_kept). A member left out guard.quarantine_after times within guard.window
// steps is quarantined for guard.quarantine_steps steps, decided by every member from
// those same reduced verdicts, so all agree without another message.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "config/config.h"
#include "tensor/tensor.h"

namespace ht::runtime {

// Why a contribution was or was not used. The values travel in the reduced counts.
// overflow: a non-finite contribution under a dynamic loss scale above its least
// (runtime/loss_scale.h): left out, no offence, and the scale halves.
enum class Verdict : int { kept = 0, non_finite = 1, norm = 2, quarantined = 3, overflow = 4 };
// "kept", "non-finite gradient", "gradient norm outlier", "quarantined", "overflow (loss scale halved)"
const char* verdict_name(Verdict v);

// A quarantine's state (Quarantine::state: steps, members, each member's release step,
// then each member's offences) of one stage's members in the replica order `before`
// ([replica][stage] world ranks) for the same ranks in the order `after`: each member's
// release and offences follow its world rank, so that a resume whose new plan put the
// replicas in another order keeps a quarantined rank quarantined. Empty where the state
// is malformed or the two orders do not hold the same ranks on `stage`.
std::vector<int64_t> reorder_quarantine(const std::vector<int64_t>& state, const std::vector<std::vector<int>>& before,
                                        const std::vector<std::vector<int>>& after, int stage);

// The stage world rank `rank` runs in a guard layout's JSON ({"world", "replicas",
// "stages"}, the trainer's guard_layout), or -1.
int stage_in(const nlohmann::json& layout, int rank);
// A checkpoint's guard state ({"norms", "quarantine"} as JSON text) of layout `before`,
// for world rank `rank` running `stage` of layout `after`, where the two are one world
// split into the same stages, its replicas in another order: the quarantine follows the
// ranks (reorder_quarantine by the ranks of stage `column`, one for every stage so that
// all reorder it alike); the norm histories, of the rank's own stage's parameter groups,
// stand where it runs the same stage, else start afresh. Empty where the quarantine
// cannot be carried over (another world, other stages, other ranks, or either layout
// of local groups, whose guards are each of one group's members). Throws
// nlohmann::json's errors on malformed JSON.
std::string guard_state_for(const std::string& state, const nlohmann::json& before, const nlohmann::json& after,
                            int rank, int stage, int column);

// The sum of the squares of a float32 tensor's values: NaN when one is NaN, infinite
// when one is, finite for any finite values. On the CPU one pass over the values, in
// float by blocks added in double (guard.cpp says why and how close).
double sum_of_squares(const Tensor& t);

// The norm check needs this many accepted norms (or the whole window when it is
// shorter) before it judges: a median of one or two norms says little.
constexpr size_t kMinNormHistory = 5;
// Nor does it judge a contribution of fewer samples: their mean is one or two samples'
// gradients, whose norms differ by orders of magnitude between a well and a badly
// classified sample. Measured: the MLP on 4 ranks, unperturbed, with the rebalancer
// shrinking two ranks' shares to 1 to 6 samples, had 189 contributions left out as norm
// outliers, every one of at most 6 samples. The non-finite check applies to any share.
constexpr int64_t kMinNormSamples = 16;

// Whether `norm` is above `ratio` x the median of `history` (accepted norms). Never with
// ratio 0 (no norm check) or fewer than min(kMinNormHistory, window) norms.
bool norm_outlier(double norm, const std::vector<double>& history, double ratio, int64_t window);

// One rank's judgement of its own contribution, group by group as the groups join the
// reduction (block by block during Backward). A verdict other than kept sticks for the
// rest of the step: the groups still to come are left out too, so a contribution that
// turns bad part-way is left out from there on (the groups already sent stay, and each
// group is rescaled by its own kept samples, so each is still an exact mean). Judging
// the whole gradient at once would mean holding every send until Backward ends, giving
// up the all-reduce's overlap with it: on the MLP over 2 data-parallel ranks, the step
// is 4.4 ms of compute (most of it Backward) beside 8.4 ms of communication, so up to
// the Backward's time would be added to every step (estimated from those figures, not
// measured); per group it costs one pass over the gradient (sum_of_squares). A NaN
// spreads to every block before it in Backward, so the first group it reaches (the
// last block's, judged first) catches it before anything of it is sent.
class ContributionGuard {
 public:
  explicit ContributionGuard(const config::GuardConfig& cfg) : cfg_(cfg) {}
  void begin_step() { sticky_ = Verdict::kept; }
  // `key` names the group (its first parameter): each group keeps its own norm history,
  // since blocks' gradient norms differ by orders of magnitude. `sum_squares` is over
  // the group's gradients; their norm x global / samples (the norm of this rank's own
  // mean gradient, which does not move when its share does) is what the history holds.
  // A kept group's norm joins its history; a left-out one's does not, so a run of
  // outliers cannot raise the median to meet them. Fewer than kMinNormSamples samples
  // are not judged by norm, nor does their norm join the history.
  Verdict judge(size_t key, double sum_squares, int64_t samples, int64_t global);
  // The norm histories by group key, and back: a checkpoint keeps them, so that a
  // resumed run judges as the run it continues would have.
  const std::map<size_t, std::deque<double>>& history() const { return history_; }
  void restore_history(std::map<size_t, std::deque<double>> h) { history_ = std::move(h); }

 private:
  config::GuardConfig cfg_;
  Verdict sticky_ = Verdict::kept;
  std::map<size_t, std::deque<double>> history_;
};

// Who is quarantined. Every member of a stage group feeds it the same verdicts (read
// from the reduced counts), so every member holds the same state.
class Quarantine {
 public:
  Quarantine(const config::GuardConfig& cfg, int members);
  // In the coming step.
  bool quarantined(int member) const { return step_ + 1 < release_[static_cast<size_t>(member)]; }
  // One step's verdict for each member. Returns the members it quarantines (for
  // quarantine_steps steps from the next; their offences are then forgotten).
  std::vector<int> record(const std::vector<Verdict>& verdicts);
  // Its whole state as integers, and back (a deadline catch-up carries it with the
  // weights: a rank that missed steps takes the quarantines they decided). restore
  // throws ht::Error naming what does not fit this quarantine's members.
  std::vector<int64_t> state() const;
  void restore(const int64_t* ints, size_t count);

 private:
  config::GuardConfig cfg_;
  int64_t step_ = 0;                           // steps recorded
  std::vector<std::deque<int64_t>> offences_;  // per member, steps within the window
  std::vector<int64_t> release_;               // per member: the first step it is tried again
};

// A reduced sum of contributions, each pre-scaled by 1 / global (the executor scales
// the loss by 1 / (global batch x predictions)), becomes the sample-weighted mean over
// the `kept` samples that contributed: x global / kept. Unchanged when kept == global;
// kept == 0 leaves nothing to average (the caller skips the update). Contiguous float32
// tensors, in place. The deadline reduction uses it too, for contributions that did not
// arrive in time.
void rescale_to_kept(const std::vector<Tensor>& sums, int64_t global, double kept);

// One contribution left out of a step, or a member quarantined (verdict quarantined
// with quarantine_steps > 0), as the metrics and the log report it.
struct GuardEvent {
  int rank = 0;   // world rank
  int stage = 0;
  Verdict verdict = Verdict::kept;
  int64_t samples = 0;           // left out of the step
  int64_t quarantine_steps = 0;  // > 0: quarantined by this step for this many steps
};

}  // namespace ht::runtime
