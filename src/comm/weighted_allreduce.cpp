#include "comm/weighted_allreduce.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "comm/comm_internal.h"
#include "comm/doorbell.h"
#include "core/error.h"

namespace ht::comm {

HostBuffer::HostBuffer(Backend& be, int64_t floats)
    : alloc_(&be.allocator()), bytes_(static_cast<size_t>(floats) * sizeof(float)) {
  Allocator::HostStaging staging;
  p_ = static_cast<float*>(alloc_->allocate(bytes_, "allreduce_sum_weighted staging"));
}

HostBuffer::~HostBuffer() {
  if (p_) alloc_->deallocate(p_, bytes_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : alloc_(std::exchange(o.alloc_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      p_(std::exchange(o.p_, nullptr)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) alloc_->deallocate(p_, bytes_);
    alloc_ = std::exchange(o.alloc_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    p_ = std::exchange(o.p_, nullptr);
  }
  return *this;
}

namespace {

bool on_host(const Tensor& t) { return t.backend().kind() == DeviceKind::cpu; }

// One tag per tensor and round, so no receive depends on the order of another's.
constexpr int kTagBase = 1000;
int tag(size_t tensor, int round) { return kTagBase + static_cast<int>(tensor % 15000) * 2 + round; }

}  // namespace

std::vector<int64_t> part_offsets(int64_t n, const std::vector<double>& weights) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> off{0};
  double before = 0;
  for (double w : weights) {
    before += w;
    off.push_back(std::min<int64_t>(n, std::llround(static_cast<double>(n) * before / total)));
  }
  off.back() = n;
  return off;
}

// One tensor between its add and its end: its parts, what the peers sent for this rank's
// part, and the requests of the round it is in.
//
// A tensor off the CPU is staged: MPI is not assumed to reach device memory, so the
// tensor's parts travel through host buffers of its backend's host staging (pinned and
// mapped on a GPU). Round 1 sends from a host copy of the tensor, round 2 receives into
// that copy and uploads the peers' parts when they are in; the sums run on the device
// (Backend::axpy, which reads the mapped incoming buffers in place). A CPU tensor is sent
// from and received into its own memory, and summed by the CPU's axpy.
struct OverlappedAllreduce::Pending {
  Tensor tensor;
  int tag = 0;
  std::vector<int64_t> offsets;
  bool staged = false;  // the tensor is off the CPU
  HostBuffer host;      // staged: the tensor's host copy
  // [peer] round 1, for this rank's part; not zeroed (the receive fills it), since a
  // hub's are every peer's whole gradients, each step.
  std::vector<HostBuffer> incoming;
  std::vector<PeerRequest> requests;
  // Round 1 in flight; summed, round 2 not yet asked for (scatter_only); round 2 in flight.
  enum { collecting, scattered, spreading } state = collecting;
};

OverlappedAllreduce::OverlappedAllreduce(Communicator& comm, std::vector<double> weights, bool scatter_only)
    : comm_(comm), weights_(std::move(weights)), scatter_only_(scatter_only) {
  HT_CHECK(static_cast<int>(weights_.size()) == comm.size(), "allreduce_sum_weighted: ", weights_.size(),
           " weights for ", comm.size(), " ranks; expected one per rank");
  for (double w : weights_)
    HT_CHECK(std::isfinite(w) && w >= 0, "allreduce_sum_weighted: weight ", w, "; expected >= 0");
  HT_CHECK(std::accumulate(weights_.begin(), weights_.end(), 0.0) > 0,
           "allreduce_sum_weighted: every weight is 0; expected some rank to own a part");
}

// Messages still in flight here mean the job is failing (finish or drain gave up, or an
// error unwound the step). Their buffers must outlive MPI's use of them, and waiting could
// hang on a stalled peer, so they are left, unwaited, to the process's imminent end.
OverlappedAllreduce::~OverlappedAllreduce() {
  if (pending_.empty() && outgoing_.empty()) return;
  try {
    progress();
  } catch (...) {
  }
  for (auto& x : pending_) (void)x.release();
  for (auto& o : outgoing_)
    if (!o.sends.empty()) (void)new Outgoing(std::move(o));
}

void OverlappedAllreduce::add(std::vector<Tensor> tensors) {
  for (const Tensor& t : tensors)
    HT_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "allreduce_sum_weighted: tensors must be ",
             "contiguous float32; got ", dtype_name(t.dtype()), " of shape ", to_string(t.shape()));
  const int p = comm_.size(), me = comm_.rank();
  for (Tensor& t : tensors) {
    const size_t index = added_++;
    if (p == 1) continue;
    auto x = std::make_unique<Pending>();
    x->tensor = t;
    x->tag = tag(index, 0);
    x->offsets = part_offsets(t.numel(), weights_);
    x->staged = !on_host(t);
    float* data = t.data();
    if (x->staged) {  // round 1 sends from a host copy
      x->host = HostBuffer(t.backend(), t.numel());
      t.backend().copy_to_host(x->host.get(), data, static_cast<size_t>(t.numel()) * 4);
      data = x->host.get();
    }
    const auto& off = x->offsets;
    const int64_t mine = off[me + 1] - off[me];
    x->incoming.resize(static_cast<size_t>(p));
    for (int j = 0; j < p; ++j) {
      if (j == me) continue;
      const int64_t len = off[j + 1] - off[j];
      if (len > 0) x->requests.push_back({comm_.isend_bytes(data + off[j], static_cast<size_t>(len) * 4, j, x->tag), j});
      if (mine > 0) {
        auto& buf = x->incoming[static_cast<size_t>(j)];
        buf = HostBuffer(t.backend(), mine);
        x->requests.push_back({comm_.irecv_bytes(buf.get(), static_cast<size_t>(mine) * 4, j, x->tag), j});
      }
    }
    pending_.push_back(std::move(x));
  }
}

// Tests every request in turn (a receive is matched only while its own request is tested,
// see finish); a tensor whose round 1 is done is summed and, unless scatter_only, starts
// round 2.
bool OverlappedAllreduce::progress() {
  const int p = comm_.size(), me = comm_.rank();
  bool moved = false;
  for (auto& x : pending_) {
    moved = std::erase_if(x->requests, [](PeerRequest& r) { return r.request.test(); }) > 0 || moved;
    if (!x->requests.empty() || x->state != Pending::collecting) continue;
    const auto& off = x->offsets;
    float* part = x->tensor.data() + off[me];
    const int64_t mine = off[me + 1] - off[me];
    Backend& be = x->tensor.backend();
    for (int j = 0; j < p; ++j)  // in rank order, so every owner adds in the same order
      if (j != me && mine > 0) be.axpy(1.f, x->incoming[static_cast<size_t>(j)].get(), part, mine);
    // A device reads the incoming buffers until its sums are done.
    if (x->staged) be.synchronize();
    x->incoming.clear();
    if (scatter_only_) x->state = Pending::scattered;
    else spread(*x);
  }
  std::erase_if(pending_, [me](const std::unique_ptr<Pending>& x) {
    const bool done = x->state == Pending::spreading && x->requests.empty();
    if (done && x->staged) upload_peer_parts(*x, me);
    return done;
  });
  for (auto& o : outgoing_) moved = std::erase_if(o.sends, [](PeerRequest& r) { return r.request.test(); }) > 0 || moved;
  std::erase_if(outgoing_, [](const Outgoing& o) { return o.sends.empty(); });
  return moved;
}

// A staged tensor's round 2 is in its host copy: the peers' parts go up to the device.
void OverlappedAllreduce::upload_peer_parts(Pending& x, int me) {
  const auto& off = x.offsets;
  Backend& be = x.tensor.backend();
  for (size_t j = 0; j + 1 < off.size(); ++j)
    if (static_cast<int>(j) != me && off[j + 1] > off[j])
      be.copy_from_host(x.tensor.data() + off[j], x.host.get() + off[j],
                        static_cast<size_t>(off[j + 1] - off[j]) * 4);
}

// The part goes out from a copy, so the tensor is final once this rank's receives are
// (a staged tensor's once they are uploaded, see upload_peer_parts).
void OverlappedAllreduce::spread(Pending& x) {
  const int p = comm_.size(), me = comm_.rank();
  const auto& off = x.offsets;
  Backend& be = x.tensor.backend();
  x.staged = !on_host(x.tensor);  // gather may have brought a source of another backend
  if (x.staged && !x.host.get()) x.host = HostBuffer(be, x.tensor.numel());
  float* data = x.staged ? x.host.get() : x.tensor.data();
  const int64_t mine = off[me + 1] - off[me];
  Outgoing* out = nullptr;
  if (mine > 0) {
    out = &outgoing_.emplace_back();
    out->data = HostBuffer(be, mine);
    if (x.staged) be.copy_to_host(out->data.get(), x.tensor.data() + off[me], static_cast<size_t>(mine) * 4);
    else std::copy(data + off[me], data + off[me + 1], out->data.get());
  }
  for (int j = 0; j < p; ++j) {
    if (j == me) continue;
    const int64_t len = off[j + 1] - off[j];
    if (out) out->sends.push_back({comm_.isend_bytes(out->data.get(), static_cast<size_t>(mine) * 4, j, x.tag + 1), j});
    if (len > 0) x.requests.push_back({comm_.irecv_bytes(data + off[j], static_cast<size_t>(len) * 4, j, x.tag + 1), j});
  }
  x.state = Pending::spreading;
}

void OverlappedAllreduce::gather(std::vector<Tensor> sources) {
  HT_CHECK(scatter_only_, "OverlappedAllreduce::gather: round 2 already runs on its own; ",
           "expected an all-reduce made with scatter_only");
  if (comm_.size() == 1) return;
  HT_CHECK(sources.size() == pending_.size(), "OverlappedAllreduce::gather: ", sources.size(),
           " sources for ", pending_.size(), " tensors in flight; expected one per tensor added");
  for (size_t i = 0; i < sources.size(); ++i) {
    Pending& x = *pending_[i];
    const Tensor& t = sources[i];
    HT_CHECK(x.state == Pending::scattered, "OverlappedAllreduce::gather: tensor ", i,
             " is not summed yet; call finish first");
    HT_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == x.tensor.numel(),
             "OverlappedAllreduce::gather: source ", i, " is ", dtype_name(t.dtype()), " of shape ",
             to_string(t.shape()), "; expected contiguous float32 of ", x.tensor.numel(), " elements");
    x.tensor = t;
    spread(x);
  }
}

void OverlappedAllreduce::end_without_gather() {
  HT_CHECK(scatter_only_, "OverlappedAllreduce::end_without_gather: round 2 already runs on its own; ",
           "expected an all-reduce made with scatter_only");
  for (size_t i = 0; i < pending_.size(); ++i)
    HT_CHECK(pending_[i]->state == Pending::scattered, "OverlappedAllreduce::end_without_gather: tensor ", i,
             " is not summed yet; call finish first");
  pending_.clear();
}

WaitStatus OverlappedAllreduce::finish(Timeout timeout) { return poll(timeout, false); }

std::vector<int> OverlappedAllreduce::waiting_on() const {
  std::vector<int> peers;
  for (const auto& x : pending_)
    for (const PeerRequest& r : x->requests) peers.push_back(r.peer);
  for (const Outgoing& o : outgoing_)
    for (const PeerRequest& r : o.sends) peers.push_back(r.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}
WaitStatus OverlappedAllreduce::drain(Timeout timeout) { return poll(timeout, true); }

// Waiting on requests one by one can deadlock: a receive is matched only while its own
// request is tested (probe-based receives), so two ranks each waiting on a large send to
// the other would never match. So every request is polled in turn, backing off from
// polling to sleeps of up to 1 ms (backoff_pauses), so a throttled rank keeps its
// quota; a ring of the doorbell (doorbell.h) ends a sleep at once.
WaitStatus OverlappedAllreduce::poll(Timeout timeout, bool sends) {
  Deadline deadline = deadline_from(timeout, "OverlappedAllreduce");
  OwnStall own;
  auto pause = std::chrono::microseconds(0);
  auto summed = [](const std::unique_ptr<Pending>& x) { return x->state == Pending::scattered; };
  for (;;) {
    const uint32_t heard = doorbell_heard();
    const bool moved = progress();
    if (std::all_of(pending_.begin(), pending_.end(), summed) && (!sends || outgoing_.empty()))
      return WaitStatus::done;
    own.forgive(deadline);
    if (deadline && Clock::now() > *deadline) return WaitStatus::timed_out;
    const BackoffPauses limits = backoff_pauses();
    if (moved) pause = std::chrono::microseconds(0);
    else pause = std::clamp(pause * 2, limits.min, limits.max);
    if (pause.count() > 0 && sleep_unless_rung(heard, pause)) pause = std::chrono::microseconds(0);
  }
}

WaitStatus allreduce_sum_weighted(Communicator& comm, std::vector<Tensor>& tensors,
                                  const std::vector<double>& weights, Timeout timeout) {
  OverlappedAllreduce reduce(comm, weights);
  reduce.add(tensors);
  const WaitStatus s = reduce.finish(timeout);
  return s == WaitStatus::done ? reduce.drain(timeout) : s;
}

}  // namespace ht::comm
