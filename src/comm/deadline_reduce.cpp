#include "comm/deadline_reduce.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>

#include "comm/doorbell.h"
#include "core/error.h"

namespace ht::comm {

namespace {

// Above the weighted all-reduce's tags (1000 + 2 x 15000) on the same group.
constexpr int kTag = 32100;

// Members a leader still waits for until the budget expires: those that missed fewer
// than this many steps in a row with nothing heard from them (a stalled one costs this
// many budgets, then none; a slow one, whose contributions arrive fewer than kSendTo
// steps late, is waited for every step).
constexpr int kWaitFor = 2;
// Members a leader still sends results to: a member that missed more steps in a row is
// caught up when it returns instead (results queued for a stopped process would pile up).
constexpr int kSendTo = 4;
// Closed steps a leader remembers, for the records that a catch-up carries: up to
// kHistory, fewer where the members are many (each record names its contributors, 32
// bytes each: 100,000 records of 512 members were 1.6 GB on every rank), at least
// kMinHistory. A member back from a longer absence gets the last ones; rank 0's metrics
// then lack the records of the steps before them.
constexpr size_t kHistory = 100000;
constexpr size_t kMinHistory = 1000;
constexpr size_t kHistoryContributors = 2'000'000;
// Full steps in the running median that adapts the budget.
constexpr size_t kMedianOf = 9;
// The waits' sleep between polls; a peer's message on this host ends it at once (the
// doorbell, comm/doorbell.h).
constexpr std::chrono::microseconds kPollSleep{200};

// A member's deadlines on its leader count the time this rank was there to hear. One back
// from a stop of its own (SIGSTOP, a host that descheduled it) finds its patience spent
// with its leader's answer still in flight (a large message moves only while both sides
// poll): a member stopped 5 s in its wait made the next rank leader on waking, a change
// that nothing had called for. A gap between two checks of at least kAway (a stop, not a
// quota's throttling of tens of milliseconds, which a member that waits must ride out)
// moves the patience on by the gap, and leaves a patience from now; the peer timeout moves
// by the gap too, by at most the timeout once over, so every wait stays bounded.
constexpr double kAway = 0.5;

class Presence {
 public:
  explicit Presence(double timeout_s) : spare_(std::chrono::duration<double>(timeout_s)) {}
  // A deadline was just set: time before it is not a gap against it.
  void armed() { last_ = Clock::now(); }
  void check(double patience_s, Clock::time_point& wait_until, Clock::time_point& give_up) {
    const Clock::time_point now = Clock::now();
    const Clock::duration gap = now - last_;
    last_ = now;
    if (gap < std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kAway))) return;
    const Clock::duration more = std::min(std::chrono::duration_cast<Clock::duration>(spare_), gap);
    give_up += more;
    spare_ -= more;
    wait_until = std::max(wait_until + gap,
                          now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(patience_s)));
  }

 private:
  Clock::time_point last_ = Clock::now();
  std::chrono::duration<double> spare_;  // what the peer timeout may still be moved by
};

enum Kind : int64_t { contribution = 1, result, catch_up_request, catch_up, notice, done, done_ok, fin, catch_up_at };

struct Header {
  int64_t kind = 0;
  int64_t step = 0;
  int64_t term = 0;
  int64_t samples = 0;  // contribution: the sender's; catch-up at: the step asked for
  int64_t verdict = 0;  // contribution: the sender's Contribution::verdict
  uint64_t hash = 0;  // contribution, catch-up request, done: the sender's; result: the base
  int64_t n_ints = 0;
  int64_t n_floats = 0;
  double loss = 0;
  double budget = 0;
};

uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 of the sum: order-sensitive, cheap
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void put_record(std::vector<int64_t>& out, const StepRecord& r) {
  int64_t loss_bits = 0;
  std::memcpy(&loss_bits, &r.loss_sum, sizeof loss_bits);
  out.insert(out.end(), {r.step, r.term, r.leader, r.samples, r.fresh_samples, r.samples_dropped,
                         r.closed_short ? 1 : 0, r.staleness_applied, loss_bits,
                         static_cast<int64_t>(r.contributors.size()), static_cast<int64_t>(r.shares.size())});
  for (const Contribution& c : r.contributors) out.insert(out.end(), {c.rank, c.samples, c.staleness, c.verdict});
  out.insert(out.end(), r.shares.begin(), r.shares.end());
}

StepRecord take_record(const std::vector<int64_t>& in, size_t& at) {
  HT_CHECK(at + 11 <= in.size(), "deadline reduce: a step record is cut short at ", at, " of ", in.size());
  StepRecord r;
  r.step = in[at];
  r.term = in[at + 1];
  r.leader = static_cast<int>(in[at + 2]);
  r.samples = in[at + 3];
  r.fresh_samples = in[at + 4];
  r.samples_dropped = in[at + 5];
  r.closed_short = in[at + 6] != 0;
  r.staleness_applied = in[at + 7];
  std::memcpy(&r.loss_sum, &in[at + 8], sizeof r.loss_sum);
  const int64_t n = in[at + 9], n_shares = in[at + 10];
  at += 11;
  const size_t left = in.size() - at;  // compared without sums that a corrupt count could overflow
  HT_CHECK(n >= 0 && static_cast<uint64_t>(n) <= left / 4 && n_shares >= 0 &&
               static_cast<uint64_t>(n_shares) <= left - 4 * static_cast<size_t>(n),
           "deadline reduce: a step record of ", n, " contributors and ", n_shares, " shares is cut short");
  for (int64_t i = 0; i < n; ++i, at += 4)
    r.contributors.push_back({static_cast<int>(in[at]), in[at + 1], in[at + 2], in[at + 3]});
  const auto from = in.begin() + static_cast<std::ptrdiff_t>(at);
  r.shares.assign(from, from + static_cast<std::ptrdiff_t>(n_shares));
  at += static_cast<size_t>(n_shares);
  return r;
}

// The gradients end to end at host memory `dst` (each one contiguous float32: reduce
// checks them), through their backend: a GPU rank's are in device memory.
void gather(const std::vector<Tensor>& grads, float* dst) {
  for (const Tensor& g : grads) {
    g.backend().copy_to_host(dst, g.data(), static_cast<size_t>(g.numel()) * 4);
    dst += g.numel();
  }
}

}  // namespace

uint64_t mix_step_hash(uint64_t previous, int64_t step, int64_t term, int leader,
                       const std::vector<Contribution>& contributors) {
  uint64_t h = mix(mix(mix(previous, static_cast<uint64_t>(step)), static_cast<uint64_t>(term)),
                   static_cast<uint64_t>(leader));
  for (const Contribution& c : contributors)
    h = mix(mix(mix(mix(h, static_cast<uint64_t>(c.rank)), static_cast<uint64_t>(c.samples)),
                static_cast<uint64_t>(c.staleness)),
            static_cast<uint64_t>(c.verdict));
  return h;
}

// A received message keeps its bytes and reads its floats in place: a gradient or a sum
// is the whole model's, and every copy of it costs a throttled rank a good part of a
// millisecond (the header is 80 bytes and the ints 8 each, so the floats stay aligned).
struct DeadlineReduce::Message {
  Header header;
  std::vector<int64_t> ints;
  std::shared_ptr<const std::vector<char>> bytes;
  const float* float_data = nullptr;
  size_t n_floats = 0;
  std::span<const float> floats() const { return {float_data, n_floats}; }

  static std::shared_ptr<std::vector<char>> encode(const Header& h, const std::vector<int64_t>& ints,
                                                   const float* floats, size_t n_floats) {
    Header hh = h;
    hh.n_ints = static_cast<int64_t>(ints.size());
    hh.n_floats = static_cast<int64_t>(n_floats);
    auto out = std::make_shared<std::vector<char>>(sizeof hh + ints.size() * 8 + n_floats * 4);
    char* p = out->data();
    std::memcpy(p, &hh, sizeof hh);
    if (!ints.empty()) std::memcpy(p + sizeof hh, ints.data(), ints.size() * 8);
    if (n_floats > 0) std::memcpy(p + sizeof hh + ints.size() * 8, floats, n_floats * 4);
    return out;
  }
  static Message decode(std::shared_ptr<const std::vector<char>> received, int from) {
    const std::vector<char>& bytes = *received;
    Message m;
    HT_CHECK(bytes.size() >= sizeof(Header), "deadline reduce: a message of ", bytes.size(), " bytes from rank ",
             from, "; expected at least its ", sizeof(Header), "-byte header");
    std::memcpy(&m.header, bytes.data(), sizeof(Header));
    const auto ni = static_cast<size_t>(m.header.n_ints), nf = static_cast<size_t>(m.header.n_floats);
    HT_CHECK(bytes.size() == sizeof(Header) + ni * 8 + nf * 4, "deadline reduce: a message of ", bytes.size(),
             " bytes from rank ", from, " whose header announces ", ni, " ints and ", nf, " floats");
    m.ints.resize(ni);
    if (ni) std::memcpy(m.ints.data(), bytes.data() + sizeof(Header), ni * 8);
    static_assert(sizeof(Header) % alignof(float) == 0);
    m.float_data = reinterpret_cast<const float*>(bytes.data() + sizeof(Header) + ni * 8);
    m.n_floats = nf;
    m.bytes = std::move(received);
    return m;
  }
};

std::shared_ptr<std::vector<char>> DeadlineReduce::word(int64_t kind, int64_t step, int64_t term, uint64_t hash,
                                                        int64_t samples) {
  Header h;
  h.kind = kind;
  h.step = step;
  h.term = term;
  h.hash = hash;
  h.samples = samples;
  return Message::encode(h, {}, nullptr, 0);
}

struct DeadlineReduce::Pending {
  int from = -1;
  Message message;
};

DeadlineReduce::DeadlineReduce(Communicator& comm, DeadlineOptions options, std::vector<int64_t> shares,
                               int64_t first_step, SaveState save, LoadState load)
    : comm_(comm), options_(options), shares_(std::move(shares)), save_(std::move(save)), load_(std::move(load)),
      rank_(comm.rank()), size_(comm.size()), tag_(kTag), step_(first_step) {
  HT_CHECK(static_cast<int>(shares_.size()) == size_, "deadline reduce: ", shares_.size(), " shares for ", size_,
           " members; expected one per member");
  HT_CHECK(comm.max_tag() >= kTag, "deadline reduce: the communicator's largest tag is ", comm.max_tag(),
           "; expected at least ", kTag);
  HT_CHECK(options_.predicted_step_s > 0 && options_.slack >= 0 && options_.max_staleness >= 0 &&
               options_.peer_timeout_s > 0,
           "deadline reduce: predicted step ", options_.predicted_step_s, " s, slack ", options_.slack,
           ", max_staleness ", options_.max_staleness, ", peer timeout ", options_.peer_timeout_s,
           " s; expected a positive step and timeout and a non-negative slack and staleness");
  hash_ = mix(0x6865747261696eull, static_cast<uint64_t>(first_step));  // every member starts equal
  last_sent_.assign(static_cast<size_t>(size_), first_step - 1);
  missed_in_row_.assign(static_cast<size_t>(size_), 0);
  noticed_term_.assign(static_cast<size_t>(size_), -1);
  sent_to_.assign(static_cast<size_t>(size_), 0);
  fin_.assign(static_cast<size_t>(size_), false);
  inbox_.resize(static_cast<size_t>(size_));
  receives_.resize(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p)
    if (p != rank_) post_receive(p);
  last_budget_ = options_.predicted_step_s * (1 + options_.slack);
}

// Messages still in flight here mean the job is failing (finish gave up or an error
// unwound a step): their buffers stay with the process's imminent end, unwaited, since a
// wait could hang on a stalled peer.
DeadlineReduce::~DeadlineReduce() {
  for (Outgoing& o : outgoing_)
    if (!o.request.test()) new Outgoing(std::move(o));
}

// The median over recent closed steps of the latest arrival (a stall is one outlier
// among them), so that a budget that the plan set too short grows to what the members
// take; before that, the last budget this rank was told (the plan's at first).
double DeadlineReduce::budget() const {
  std::vector<double> v;
  for (const auto& [step, a] : arrivals_)
    if (step < step_) v.push_back(a.second);
  if (v.size() < 3) return last_budget_;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2] * (1 + options_.slack);
}

// A member waits this long for its leader's result before moving to the next leader:
// the leader closes within a budget of its own start, which is at most a little before
// the member's, plus the time the sum takes to travel.
double DeadlineReduce::patience() const { return std::max(2 * last_budget_ + 0.02, options_.min_patience_s); }

void DeadlineReduce::post_receive(int peer) {
  auto& box = inbox_[static_cast<size_t>(peer)];
  box = std::make_shared<std::vector<char>>();
  receives_[static_cast<size_t>(peer)] = comm_.irecv_message(box, peer, tag_);
}

void DeadlineReduce::send(int dst, std::shared_ptr<std::vector<char>> bytes) {
  // No receive is posted for this rank's own messages: a large one would never complete,
  // and the drain at the end would wait for it until the peer timeout.
  HT_CHECK(dst != rank_, "deadline reduce: rank ", rank_, " sent a message of kind ",
           reinterpret_cast<const Header*>(bytes->data())->kind, " to itself");
  Outgoing o{std::move(bytes), Request()};
  o.request = comm_.isend_bytes(o.bytes->data(), o.bytes->size(), dst, tag_);
  outgoing_.push_back(std::move(o));
  ++sent_to_[static_cast<size_t>(dst)];
}

void DeadlineReduce::send_notice(int dst) {
  noticed_term_[static_cast<size_t>(dst)] = term_;
  Header h;
  h.kind = notice;
  h.step = step_;
  h.term = term_;
  send(dst, Message::encode(h, {}, nullptr, 0));
}

// The leader's state between steps: the weights and optimiser state after step_ - 1.
// `since`: the step the member said it is at; it has the records of the steps before.
void DeadlineReduce::send_catch_up(int dst, int64_t since, bool final) {
  ReplicaState state = save_();
  std::vector<int64_t> ints{static_cast<int64_t>(state.ints.size())};
  ints.insert(ints.end(), state.ints.begin(), state.ints.end());
  std::vector<const StepRecord*> records;
  for (const StepRecord& r : history_)
    if (r.step >= since) records.push_back(&r);
  ints.push_back(static_cast<int64_t>(records.size()));
  for (const StepRecord* r : records) put_record(ints, *r);
  ints.insert(ints.end(), shares_.begin(), shares_.end());  // those of step_, which the receiver goes on from
  Header h;
  h.kind = catch_up;
  h.samples = final ? 1 : 0;
  h.step = step_;
  h.term = term_;
  h.hash = hash_;
  h.budget = budget();
  send(dst, Message::encode(h, ints, state.floats.data(), state.floats.size()));
  last_sent_[static_cast<size_t>(dst)] = step_ - 1;
  // Sent the results from here on, but not waited for: its first word back is empty (it
  // has no gradient of this state), and it is waited for once that word arrives.
  missed_in_row_[static_cast<size_t>(dst)] = kWaitFor;
}

void DeadlineReduce::send_contribution() {
  // One in flight (to a leader that stalled) must stay as it was: a new term's send
  // goes from a copy. The first send, the usual case, goes from the encoded bytes.
  if (contribution_.use_count() > 1) contribution_ = std::make_shared<std::vector<char>>(*contribution_);
  auto* h = reinterpret_cast<Header*>(contribution_->data());
  h->term = term_;
  send(leader(), contribution_);
}

void DeadlineReduce::adopt_term(int64_t term) {
  if (term <= term_) return;
  term_ = term;
  catch_up_asked_ = false;
  done_ok_ = false;
  // Contributions and requests held for an older term's leader are no longer this rank's
  // to answer (a member asks the new leader again).
  if (leader() != rank_) {
    arrived_.clear();
    held_.clear();
  }
  // Reports of the end count in the term they were made in: a member reports again to
  // each term's leader (finish). One kept from an earlier term may be of a state the
  // member has since left (a later leader caught it up); a rank leading again would agree
  // on it, and the member, refusing that end, would move the term on past every leader.
  done_.clear();
  stop_done_.clear();
}

// This rank has waited out its patience for the leader: on to the next term, and every
// peer is told, so that all move to it together (a leader that was replaced, or one
// collecting the end's reports, hears of it even when nothing else would reach it).
void DeadlineReduce::suspect_leader() {
  adopt_term(term_ + 1);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) send_notice(p);
}

bool DeadlineReduce::poll() {
  std::erase_if(outgoing_, [](Outgoing& o) { return o.request.test(); });
  bool any = false;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Request& r = receives_[static_cast<size_t>(p)];
    if (!r.test()) continue;
    any = true;
    Message m = Message::decode(std::move(inbox_[static_cast<size_t>(p)]), p);
    post_receive(p);
    handle(p, m);
  }
  serve_held();
  return any;
}

// Every poll is between steps or in a step before its result is applied, where the state
// is that of step_'s start: a request for step_ (or an earlier one) is answered now.
void DeadlineReduce::serve_held() {
  if (held_.empty() || leader() != rank_) return;
  for (auto it = held_.begin(); it != held_.end();) {
    if (step_ < it->second.second) {
      ++it;
      continue;
    }
    send_catch_up(it->first, it->second.first, finishing_);  // from finish: the end
    it = held_.erase(it);
  }
}

void DeadlineReduce::handle(int from, const Message& m) {
  const Header& h = m.header;
  if (h.kind == fin) {
    fin_[static_cast<size_t>(from)] = true;
    return;
  }
  if (h.term < term_) {  // from a rank that has not heard of this term: tell it
    if (h.kind != notice) send_notice(from);
    return;
  }
  adopt_term(h.term);
  switch (h.kind) {
    case notice: return;
    case contribution:
      if (leader() != rank_) return;
      if (auto a = arrivals_.find(h.step); a != arrivals_.end() && m.n_floats > 0)
        a->second.second = std::max(a->second.second, std::chrono::duration<double>(Clock::now() - a->second.first).count());
      if (options_.on_report && !m.ints.empty()) {
        std::vector<double> measures(m.ints.size());
        std::memcpy(measures.data(), m.ints.data(), m.ints.size() * sizeof(double));
        options_.on_report(from, h.step, measures);
      }
      arrived_[{h.step, from}] = std::make_unique<Pending>(Pending{from, m});
      return;
    case result:
      results_.push_back(std::make_unique<Pending>(Pending{from, m}));
      return;
    case catch_up:
      catch_up_ = std::make_unique<Pending>(Pending{from, m});
      return;
    case catch_up_request:
      // A finished member serves one behind it too (see ahead_done_), with its final state.
      if (leader() == rank_ || finishing_) send_catch_up(from, std::min(h.step, step_), finishing_);
      return;
    case catch_up_at:
      if (leader() != rank_) return;
      held_[from] = {h.step, h.samples};
      // Away until then: not waited for (it is sent the results all the same).
      missed_in_row_[static_cast<size_t>(from)] = std::max(missed_in_row_[static_cast<size_t>(from)], kWaitFor);
      return;
    case done:
      // A member ahead ended training (back from a stop, this rank takes its end), or a
      // member stopped (a signal, --stop-after): the chain ends at its state, which this
      // rank takes at once rather than leading on (the stop reached the others only when
      // the term came round to the stopped rank, up to a patience per member).
      if (!finishing_ && (h.step > step_ || h.samples == 1)) ahead_done_ = from;
      if (leader() != rank_) return;
      done_[from] = {h.step, h.hash};
      if (h.samples == 1) stop_done_[from] = h.step;
      return;
    case done_ok:
      done_ok_ = h.step == step_ && h.hash == hash_;
      return;
    default:
      fail("deadline reduce: a message of kind ", h.kind, " from rank ", from, "; expected a kind from 1 to 9");
  }
}

void DeadlineReduce::fail_wait(const std::string& what, const std::vector<int>& missing) const {
  std::vector<int> world;  // the message names world ranks
  for (int j : missing) world.push_back(comm_.world_rank(j));
  const std::chrono::duration<double> waited(options_.peer_timeout_s);
  // A roll call of the ranks whose waits timed out too: a member that waited for its leader
  // while the leader waited for a stalled member names that member, not the leader (it
  // named rank 0 while rank 0 named the stopped rank).
  const std::vector<int> absent = absent_after(comm_, waited);
  std::vector<int> stalled;
  for (int w : world)
    if (std::find(absent.begin(), absent.end(), w) != absent.end()) stalled.push_back(w);
  std::string also;
  const int leader_rank = comm_.world_rank(leader());
  if (stalled.empty() && world == std::vector<int>{leader_rank} && leader() != rank_ && !absent.empty()) {
    stalled = absent;
    // Named as this rank's: "its leader" read as the absent rank's.
    also = " (rank " + std::to_string(comm_.world_rank(rank_)) + "'s leader then, rank " + std::to_string(leader_rank) +
           ", was waiting for it too)";
  }
  if (stalled.empty()) stalled = world;
  fail_as<PeerTimeout>(
      peer_timeout_message(comm_.world_rank(rank_), stalled, "the deadline reduction's " + what + also, waited));
}

// The history follows this rank's chain: a record replaces those of its step and after
// (kept from a chain that a catch-up then replaced).
void DeadlineReduce::remember(const StepRecord& r) {
  while (!history_.empty() && history_.back().step >= r.step) history_.pop_back();
  history_.push_back(r);
  const size_t keep = std::max(kMinHistory, std::min(kHistory, kHistoryContributors / static_cast<size_t>(size_)));
  while (history_.size() > keep) history_.pop_front();
}

// Whether member `from`'s contribution computed for step `c` is already in a step this
// chain applied: a member that missed the result of the step that took it (a leader
// stopped mid-send, a slow link) resends it to the next term's leader, which had applied
// that result, and as a stale contribution it would count the same batch twice.
bool DeadlineReduce::applied_before(int from, int64_t c) const {
  for (auto r = history_.rbegin(); r != history_.rend() && r->step >= c; ++r)
    for (const Contribution& k : r->contributors)
      if (k.rank == from && r->step - k.staleness == c) return true;
  return false;
}

// Applies a closed step to this rank's chain (the sum itself is the caller's to apply).
void DeadlineReduce::apply_record(const StepRecord& r) {
  chain_[r.step] = hash_;
  while (chain_.size() > static_cast<size_t>(options_.max_staleness) + 2) chain_.erase(chain_.begin());
  HT_CHECK(r.shares.empty() || r.shares.size() == shares_.size(), "deadline reduce: the record of step ", r.step,
           " re-splits into ", r.shares.size(), " shares; expected one per member (", shares_.size(), ")");
  hash_ = mix_step_hash(hash_, r.step, r.term, r.leader, r.contributors);
  for (int64_t n : r.shares) hash_ = mix(hash_, static_cast<uint64_t>(n));
  if (!r.shares.empty()) shares_ = r.shares;
  step_ = r.step + 1;
  remember(r);
}

// The leader's side of step_: own gradient already in `sum` (or zeros with
// own_fresh false in the record's terms), what arrives until every member that is waited
// for is in or the budget runs out. Returns false when this rank stopped leading (a higher
// term arrived) before closing.
bool DeadlineReduce::lead_step(std::vector<float>& sum, Clock::time_point opened, StepRecord& record) {
  const double budget_s = budget();
  last_budget_ = budget_s;
  const auto close_at = opened + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget_s));
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options_.peer_timeout_s));
  const int64_t s = step_;
  arrivals_[s] = {opened, std::chrono::duration<double>(Clock::now() - opened).count()};  // own, so far
  while (arrivals_.size() > kMedianOf + 1) arrivals_.erase(arrivals_.begin());
  std::vector<const Pending*> fresh(static_cast<size_t>(size_), nullptr);
  std::vector<const Pending*> stale(static_cast<size_t>(size_), nullptr);
  bool all_in = false;
  for (;;) {
    if (options_.while_leading) options_.while_leading();
    const uint32_t heard = doorbell_heard();  // before the poll: a ring after it ends the sleep
    // Everything queued, not one message per peer: a leader back from a stop has the
    // others' word of a later term or of the end of training queued behind their older
    // messages, and read a message a poll it closed steps alone before reaching it (a
    // loaded host fits few polls in a budget).
    bool any = false;
    while (poll()) any = true;
    if (leader() != rank_ || ahead_done_ >= 0) return false;
    // Sort what arrived: this step's on this chain, late ones, and out-of-step senders.
    for (auto it = arrived_.begin(); it != arrived_.end();) {
      const auto [c, from] = it->first;
      const Header& h = it->second->message.header;
      const auto j = static_cast<size_t>(from);
      if (c > s) break;  // a later step's (from a rank ahead of this one): held
      // A member fewer than kSendTo steps behind is slow, not stalled: it is waited for
      // again (the budget grows to its late arrivals). One further behind is back from a
      // stop, stepping through the results queued for it, or too slow to be waited for:
      // it cannot reach this step by the budget, and waiting for it held each step to the
      // budget until it had caught up (six steps after a 5 s stop).
      if (s - c < kSendTo) missed_in_row_[j] = 0;
      bool keep = false;
      if (c == s && h.hash == hash_) {
        fresh[j] = it->second.get();
        keep = true;
      } else if (c < s && options_.max_staleness > 0 && s - c <= options_.max_staleness && chain_.count(c) &&
                 chain_[c] == h.hash && !fresh[j] && !applied_before(from, c)) {
        stale[j] = it->second.get();
        keep = true;
      }
      // A sender that is out of step with this chain and will not have the results it
      // waits for (it computed on another state, or missed them): it catches up now.
      if (!keep && (c == s || last_sent_[j] < c)) send_catch_up(from, c);
      if (keep) {
        ++it;
      } else {
        it = arrived_.erase(it);
      }
    }
    all_in = true;
    for (int j = 0; j < size_; ++j)
      if (j != rank_ && !fresh[static_cast<size_t>(j)] && missed_in_row_[static_cast<size_t>(j)] < kWaitFor)
        all_in = false;
    if (all_in || Clock::now() >= close_at) break;
    if (Clock::now() >= give_up) {
      std::vector<int> missing;  // the members still waited for
      for (int j = 0; j < size_; ++j)
        if (j != rank_ && !fresh[static_cast<size_t>(j)] && missed_in_row_[static_cast<size_t>(j)] < kWaitFor)
          missing.push_back(j);
      fail_wait("closing step " + std::to_string(s), missing);
    }
    if (!any) sleep_unless_rung(heard, kPollSleep);
  }
  // Close: the sum in rank order, this rank's own gradient at its place.
  record.step = s;
  record.term = term_;
  record.leader = rank_;
  const bool own = !record.contributors.empty();  // the caller put this rank's own entry there
  const Contribution mine = own ? record.contributors.front() : Contribution{};
  record.contributors.clear();
  std::vector<float> total(sum.size(), 0.0f);
  double loss = own ? record.loss_sum : 0.0;
  int64_t fresh_samples = own ? mine.samples : 0;
  for (int j = 0; j < size_; ++j) {
    const auto k = static_cast<size_t>(j);
    std::span<const float> g;
    bool given = false;
    Contribution c{j, 0, 0};
    if (j == rank_ && own) {
      g = sum;
      given = true;
      c.samples = mine.samples;
      c.verdict = mine.verdict;
    } else if (fresh[k]) {
      g = fresh[k]->message.floats();
      given = true;
      c.samples = fresh[k]->message.header.samples;
      c.verdict = fresh[k]->message.header.verdict;
      loss += fresh[k]->message.header.loss;
      fresh_samples += c.samples;
    } else if (stale[k]) {
      g = stale[k]->message.floats();
      given = true;
      c.samples = stale[k]->message.header.samples;
      c.verdict = stale[k]->message.header.verdict;
      c.staleness = s - stale[k]->message.header.step;
    }
    if (!given || (g.empty() && c.samples == 0)) continue;  // present, with nothing to add
    // Counted where applied: a late empty word (present after a catch-up) adds nothing.
    if (c.staleness > 0) ++record.staleness_applied;
    HT_CHECK(g.size() == total.size(), "deadline reduce: rank ", j, " contributed ", g.size(),
             " gradient values to step ", s, "; expected ", total.size());
    for (size_t i = 0; i < total.size(); ++i) total[i] += g[i];
    record.samples += c.samples;
    record.contributors.push_back(c);
  }
  record.fresh_samples = fresh_samples;
  record.loss_sum = loss;
  bool every = true;
  for (int j = 0; j < size_; ++j) {
    const auto k = static_cast<size_t>(j);
    const bool present = j == rank_ || fresh[k] != nullptr;
    // In: arrived with samples, or with a verdict that left them out (the guard's
    // exclusion, counted by the guard, not as a contribution that missed the budget).
    const bool in = j == rank_ ? own
                               : present && (fresh[k]->message.header.samples > 0 || fresh[k]->message.header.verdict != 0);
    if (!in) {
      record.samples_dropped += shares_[k];
      every = false;
    }
    if (j != rank_) missed_in_row_[k] = present ? 0 : missed_in_row_[k] + 1;
  }
  record.closed_short = !every;
  // The re-split this rank decided after closing the step before, where it led that one
  // too under the same shares (another leader's steps between may have moved them).
  if (!pending_shares_.empty() && pending_term_ == term_ && pending_step_ == s && pending_base_ == shares_)
    record.shares = pending_shares_;
  pending_shares_.clear();
  for (auto it = arrived_.begin(); it != arrived_.end();)  // used, or now late for good
    it = it->first.first <= s ? arrived_.erase(it) : std::next(it);
  sum.swap(total);

  std::vector<int64_t> ints;
  put_record(ints, record);
  Header h;
  h.kind = result;
  h.step = s;
  h.term = term_;
  h.hash = hash_;  // the base the sum was built on
  h.budget = budget_s;
  auto bytes = Message::encode(h, ints, sum.data(), sum.size());
  for (int j = 0; j < size_; ++j) {
    const auto k = static_cast<size_t>(j);
    if (j == rank_) continue;
    if (missed_in_row_[k] < kSendTo) {
      send(j, bytes);
      last_sent_[k] = s;
    } else if (noticed_term_[k] != term_) {
      send_notice(j);  // small: tells a leader that was replaced and returns who leads now
    }
  }
  apply_record(record);
  // A re-split is decided once the result is on its way (the decision simulates plans,
  // which the members' patience should not have to cover), and rides with the next
  // step's record.
  if (options_.reshare) {
    std::vector<int64_t> next = options_.reshare(s, shares_);
    if (!next.empty()) {
      const int64_t before = std::accumulate(shares_.begin(), shares_.end(), int64_t{0});
      const int64_t after = std::accumulate(next.begin(), next.end(), int64_t{0});
      HT_CHECK(next.size() == shares_.size() && after == before &&
                   std::all_of(next.begin(), next.end(), [](int64_t n) { return n >= 1; }),
               "deadline reduce: a re-split of ", next.size(), " shares summing to ", after, "; expected ",
               shares_.size(), " shares of 1 or more summing to the global batch's ", before);
    }
    if (!next.empty() && next != shares_) {
      pending_shares_ = std::move(next);
      pending_term_ = term_;
      pending_step_ = s + 1;
      pending_base_ = shares_;
    }
  }
  return true;
}

void DeadlineReduce::take_catch_up() {
  const Message& m = catch_up_->message;
  ReplicaState state;
  size_t at = 0;
  HT_CHECK(!m.ints.empty() && static_cast<size_t>(m.ints[0]) < m.ints.size(), "deadline reduce: a catch-up from rank ",
           catch_up_->from, " is cut short");
  const auto n_state = static_cast<size_t>(m.ints[at++]);
  state.ints.assign(m.ints.begin() + 1, m.ints.begin() + 1 + static_cast<long>(n_state));
  at += n_state;
  const int64_t records = m.ints[at++];
  for (int64_t i = 0; i < records; ++i) {
    StepRecord r = take_record(m.ints, at);
    if (r.step >= step_) missed_.push_back(r);
    remember(r);
  }
  HT_CHECK(m.ints.size() == at + shares_.size(), "deadline reduce: a catch-up from rank ", catch_up_->from, " holds ",
           m.ints.size() - std::min(at, m.ints.size()), " values after its records; expected the ", shares_.size(),
           " members' shares");
  shares_.assign(m.ints.begin() + static_cast<std::ptrdiff_t>(at), m.ints.end());
  state.floats.assign(m.floats().begin(), m.floats().end());
  load_(state);
  step_ = m.header.step;
  hash_ = m.header.hash;
  last_budget_ = m.header.budget;
  chain_.clear();
  catch_up_.reset();
  catch_up_asked_ = false;
  ahead_done_ = -1;
  asked_end_term_ = -1;
}

bool DeadlineReduce::ask_final_state(int member) {
  if (asked_end_term_ == term_) return false;
  send(member, word(catch_up_request, step_, term_, hash_));
  asked_end_term_ = term_;
  return true;
}

void DeadlineReduce::take_waiting_catch_up() {
  poll();
  if (!catch_up_ || catch_up_->message.header.samples == 1) return;
  take_catch_up();
  caught_up_early_ = true;
}

DeadlineOutcome DeadlineReduce::reduce(std::vector<Tensor>& grads, int64_t samples, double loss_sum,
                                       Clock::time_point step_start, int64_t verdict) {
  size_t n = 0;
  for (const Tensor& g : grads) {
    HT_CHECK(g.dtype() == DType::f32 && g.is_contiguous(), "deadline reduce: gradients must be contiguous float32");
    n += static_cast<size_t>(g.numel());
  }
  // The gradients stay as they are until the step's sum replaces them at the end, so the
  // contribution is encoded from them directly, and a rank that leads reads its own from
  // them; the sum comes back as a received result (read in place) or as the one this
  // rank made.
  const auto own_gradient = [&] {
    std::vector<float> v(n);
    gather(grads, v.data());
    return v;
  };
  Message result;           // the leader's, when another rank closed the step
  std::vector<float> made;  // the sum, when this rank closed it
  bool led = false;
  DeadlineOutcome out;
  out.caught_up = caught_up_early_;
  caught_up_early_ = false;
  const int64_t my_step = step_;
  const uint64_t my_base = hash_;  // the state the gradient was computed on
  auto own_is_current = [&] { return my_step == step_ && my_base == hash_; };
  Header h;
  h.kind = contribution;
  h.step = my_step;
  h.samples = samples;
  h.verdict = verdict;
  h.hash = my_base;
  h.loss = loss_sum;
  h.n_ints = static_cast<int64_t>(report_.size());  // the measures, as 8-byte words
  h.n_floats = static_cast<int64_t>(n);
  const size_t words = report_.size() * 8;
  contribution_ = std::make_shared<std::vector<char>>(sizeof h + words + n * 4);
  std::memcpy(contribution_->data(), &h, sizeof h);
  if (words) std::memcpy(contribution_->data() + sizeof h, report_.data(), words);
  gather(grads, reinterpret_cast<float*>(contribution_->data() + sizeof h + words));  // aligned: see Message
  bool reported = false;  // this rank's own measures, to itself as leader
  int64_t sent_term = -1;  // the term whose leader has this rank's contribution
  const int64_t entry_term = term_;
  auto wait_until = Clock::now();
  auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.peer_timeout_s));
  Presence presence(options_.peer_timeout_s);
  auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  poll();  // a term change or a catch-up that arrived during the step
  for (;;) {
    if (catch_up_) {
      const bool final = catch_up_->message.header.samples == 1;
      take_catch_up();
      out.caught_up = true;
      if (final) {
        out.ended = true;
        out.missed = std::move(missed_);
        missed_.clear();
        return out;
      }
      sent_term = -1;  // say so to the leader: present, at the step it gave
    }
    if (ahead_done_ >= 0) {
      // A member has ended its training at a later step than this rank's: the job's chain
      // went on without this rank, which leading or contributing would only extend alone
      // (a rank 0 back from a stop past the peer timeout led itself through a thousand
      // steps, and its checkpoints replaced the job's). It takes that member's final state.
      if (ask_final_state(ahead_done_)) {
        wait_until = Clock::now() + seconds(patience());
        presence.armed();
      }
      presence.check(patience(), wait_until, give_up);
      if (Clock::now() >= give_up)
        fail_wait("the final state of rank " + std::to_string(ahead_done_) + ", which ended training ahead of it",
                  {ahead_done_});
      const uint32_t heard = doorbell_heard();
      if (!poll()) sleep_unless_rung(heard, kPollSleep);
      continue;
    }
    bool applied = false;
    while (!results_.empty() && !applied) {
      const std::unique_ptr<Pending> next = std::move(results_.front());
      results_.pop_front();
      const Message& m = next->message;
      const int from = next->from;
      if (m.header.step == step_ && m.header.hash == hash_) {
        size_t at = 0;
        out.record = take_record(m.ints, at);
        HT_CHECK(m.n_floats == n, "deadline reduce: a result of ", m.n_floats, " values from rank ", from,
                 "; expected ", n);
        last_budget_ = m.header.budget;
        out.budget_s = m.header.budget;
        result = m;
        apply_record(out.record);
        applied = true;
        break;
      }
      if (m.header.step >= step_ && !catch_up_asked_) {  // this rank is off the leader's chain
        send(from, word(catch_up_request, step_, term_, hash_));
        catch_up_asked_ = true;
        wait_until = Clock::now() + seconds(patience());
        presence.armed();
      }
    }
    if (applied) break;
    if (leader() == rank_) {
      StepRecord record;
      std::vector<float> sum;
      if (options_.on_report && !report_.empty() && !reported) {
        options_.on_report(rank_, my_step, report_);
        reported = true;
      }
      if (own_is_current()) {
        record.contributors.push_back({rank_, samples, 0, verdict});
        record.loss_sum = loss_sum;
        sum = own_gradient();
      } else {
        sum.assign(n, 0.0f);
      }
      // A leader from the step's start runs the budget from its own start; one that took
      // over runs it from now, when the members are turning to it.
      const auto opened = term_ == entry_term ? step_start : Clock::now();
      if (lead_step(sum, opened, record)) {
        out.record = record;
        out.budget_s = last_budget_;
        made.swap(sum);
        led = true;
        break;
      }
      // Replaced while leading (contribute to the new leader), or a member ended ahead
      // (above): either way from the top, where this rank may still lead.
      sent_term = -1;
      continue;
    }
    if (sent_term != term_) {
      if (own_is_current()) {
        send_contribution();
      } else {  // the gradient is of another state: present, with nothing to add
        send(leader(), word(contribution, step_, term_, hash_));
      }
      sent_term = term_;
      wait_until = Clock::now() + seconds(patience());
      presence.armed();
      if (options_.after_contribution) options_.after_contribution();
    }
    presence.check(patience(), wait_until, give_up);
    if (Clock::now() >= give_up) fail_wait("result of step " + std::to_string(step_), {leader()});
    if (Clock::now() >= wait_until) {  // the leader has stalled: on to the next
      suspect_leader();
      continue;
    }
    const uint32_t heard = doorbell_heard();
    if (!poll()) sleep_unless_rung(heard, kPollSleep);
  }
  const float* total = led ? made.data() : result.float_data;
  size_t at = 0;
  for (Tensor& g : grads) {
    const auto k = static_cast<size_t>(g.numel());
    g.backend().copy_from_host(g.data(), total + at, k * 4);
    at += k;
  }
  out.missed = std::move(missed_);
  missed_.clear();
  return out;
}

DeadlineOutcome DeadlineReduce::align_to(int64_t target) {
  DeadlineOutcome out;
  if (step_ >= target) return out;
  const auto seconds = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  auto give_up = Clock::now() + seconds(options_.peer_timeout_s);
  // The leader holds the request until it is at `target`, a step or two of its own: a few
  // patiences before it counts as silent.
  constexpr double kAlignPatiences = 3;
  int64_t asked_term = -1;
  auto wait_until = Clock::now();
  Presence presence(options_.peer_timeout_s);
  for (;;) {
    const uint32_t heard = doorbell_heard();  // before the poll: a ring after it ends the sleep
    const bool any = poll();
    if (catch_up_) {
      out.ended = catch_up_->message.header.samples == 1;
      take_catch_up();
      out.caught_up = true;
      break;
    }
    if (asked_term != term_ && leader() != rank_) {
      send(leader(), word(catch_up_at, step_, term_, hash_, target));
      asked_term = term_;
      wait_until = Clock::now() + seconds(kAlignPatiences * patience());
      presence.armed();
    } else if (asked_term != term_) {  // this rank leads by an old term it has not yet heard replaced
      asked_term = term_;
      wait_until = Clock::now() + seconds(kAlignPatiences * patience());
      presence.armed();
    }
    presence.check(kAlignPatiences * patience(), wait_until, give_up);
    if (Clock::now() >= give_up)
      fail_wait("a catch-up to step " + std::to_string(target) + " for its replica's other stages", {leader()});
    if (Clock::now() >= wait_until) {
      suspect_leader();
      continue;
    }
    if (!any) sleep_unless_rung(heard, kPollSleep);
  }
  out.missed = std::move(missed_);
  missed_.clear();
  return out;
}

std::vector<StepRecord> DeadlineReduce::finish(FinishReason why) {
  finishing_ = true;
  ahead_done_ = -1;
  const int64_t stop_flag = why == FinishReason::stop ? 1 : 0;
  auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options_.peer_timeout_s));
  bool agreed = false;
  // The term this rank last reported in: a member that hears of a later term (another
  // member suspected the leader) reports to that term's leader at once. Reporting only
  // after its own patience ran out, it moved the term on each time, so a leader could
  // wait out its term without some member's report, term after term, until the timeout.
  int64_t sent_term = -1;
  auto wait_until = Clock::now();
  Presence presence(options_.peer_timeout_s);
  auto send_done = [&] {
    send(leader(), word(done, step_, term_, hash_, stop_flag));
    sent_term = term_;
    done_ok_ = false;
    wait_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(patience()));
    presence.armed();
  };
  while (!agreed) {
    const uint32_t heard = doorbell_heard();  // before the poll: a ring after it ends the sleep
    const bool any = poll();
    presence.check(patience(), wait_until, give_up);
    if (Clock::now() >= give_up) {
      std::vector<int> missing;  // the leader: members that have not reported; a member: its leader
      if (leader() == rank_) {
        for (int j = 0; j < size_; ++j)
          if (j != rank_ && !done_.count(j)) missing.push_back(j);
      } else {
        missing.push_back(leader());
      }
      fail_wait("agreeing on the final step", missing);
    }
    if (leader() == rank_ && catch_up_) take_catch_up();  // from a member that ended ahead of it (below)
    // A leader behind a member that ended at a later step (back from a stop that the
    // others trained through) takes that member's state, rather than sending its own older
    // one to every member as the end.
    auto ahead = std::find_if(done_.begin(), done_.end(), [&](const auto& d) { return d.second.first > step_; });
    // Finishing for a stop that reached it (not its own, not the end of training), a
    // leader ends where the latest stopped member's state is: on a hybrid plan its own
    // stage may have stepped past the step the stopped replica agreed on, and every stage
    // must end at that one.
    if (why == FinishReason::propagated && !stop_done_.empty()) {
      const auto latest = std::max_element(stop_done_.begin(), stop_done_.end(),
                                           [](const auto& a, const auto& b) { return a.second < b.second; });
      const auto d = done_.find(latest->first);
      if (d != done_.end() && d->second != std::make_pair(step_, hash_)) ahead = d;
    }
    if (leader() == rank_ && ahead != done_.end()) {
      ask_final_state(ahead->first);
    } else if (leader() == rank_) {
      // Members still stepping (behind, back from a stall, or on this state) are told the
      // end: each contribution is answered with the final state, and so is each request to
      // align to a step this chain will not reach now (serve_held answers those it did).
      for (auto it = arrived_.begin(); it != arrived_.end(); it = arrived_.erase(it))
        send_catch_up(it->first.second, std::min(it->first.first, step_), true);
      for (auto it = held_.begin(); it != held_.end(); it = held_.erase(it))
        send_catch_up(it->first, std::min(it->second.first, step_), true);
      agreed = true;
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        auto d = done_.find(j);
        if (d == done_.end()) {
          agreed = false;
          continue;
        }
        if (d->second != std::make_pair(step_, hash_)) {
          send_catch_up(j, d->second.first, true);
          done_.erase(d);
          agreed = false;
          continue;
        }
      }
      if (agreed) {
        auto bytes = word(done_ok, step_, term_, hash_);
        for (int j = 0; j < size_; ++j)
          if (j != rank_) send(j, bytes);
        done_.clear();
      }
    } else {
      if (catch_up_) {  // as in reduce: the leader's state, then report again
        take_catch_up();
        sent_term = -1;
      }
      results_.clear();  // of steps this rank has finished with (or will catch up past)
      if (done_ok_) {
        agreed = true;
        break;
      }
      if (sent_term != term_) send_done();
      if (Clock::now() >= wait_until) {
        suspect_leader();
        continue;
      }
    }
    if (!any) sleep_unless_rung(heard, kPollSleep);
  }
  // Drain: once this rank's sends are through, it says so; it keeps receiving until every
  // peer has said so, so that no send to it is left without a receive.
  bool fin_sent = false;
  int64_t reported_term = term_;
  for (;;) {
    const uint32_t heard = doorbell_heard();  // before the poll: a ring after it ends the sleep
    const bool any = poll();
    if (Clock::now() >= give_up) {
      std::vector<int> missing;  // those not yet through with their sends
      for (int j = 0; j < size_; ++j)
        if (j != rank_ && !fin_[static_cast<size_t>(j)]) missing.push_back(j);
      fail_wait("draining the last messages", missing);
    }
    // A later term's leader (one that suspected the last before its answer came) is still
    // collecting the reports: it has this rank's, the final state, again.
    if (term_ != reported_term && leader() != rank_) {
      send(leader(), word(done, step_, term_, hash_, stop_flag));
      reported_term = term_;
    }
    if (leader() == rank_)  // a member that asks again (its answer crossed a term change)
      for (auto it = done_.begin(); it != done_.end(); it = done_.erase(it)) {
        send(it->first, word(done_ok, step_, term_, hash_));
      }
    if (!fin_sent && outgoing_.empty()) {
      Header h;
      h.kind = fin;
      h.term = term_;
      auto bytes = Message::encode(h, {}, nullptr, 0);
      for (int j = 0; j < size_; ++j)
        if (j != rank_) send(j, bytes);
      fin_sent = true;
    }
    bool all = fin_sent && outgoing_.empty();
    for (int j = 0; j < size_; ++j)
      if (j != rank_ && !fin_[static_cast<size_t>(j)]) all = false;
    if (all) break;
    if (!any) sleep_unless_rung(heard, kPollSleep);
  }
  for (Request& r : receives_) r = Request();  // cancels the receives left posted
  std::vector<StepRecord> out = std::move(missed_);
  missed_.clear();
  return out;
}

}  // namespace ht::comm
