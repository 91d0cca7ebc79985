// The implementation-independent half of the communication layer: requests and their
// polled deadline waits, argument checks, tensor messages on top of byte messages, and
// the link emulation model.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "comm/comm_internal.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ht::comm {

// ---- Request

Request::Request() : drop_wait_(kUnwaitedSendLimit) {}
Request::Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), drop_wait_(kUnwaitedSendLimit) {}
Request::Request(Request&&) noexcept = default;

namespace {
// Before a request goes away, nothing may still read or write its buffer: a receive is
// cancelled (or, when its message is already being copied in, finished); a send is
// waited for, up to `limit`, and then abandoned: its Impl is kept for good (MPI may
// still read what it owns) and the abandonment said on stderr. A failure is dropped:
// there is no caller to report it to.
void finish(std::unique_ptr<Request::Impl>& impl, Timeout limit) {
  if (!impl || impl->cancelled()) return;
  try {
    if (impl->is_receive()) {
      if (!impl->test()) impl->expire();
      return;
    }
    if (poll_until([&] { return impl->test(); }, deadline_from(limit, "Request")) == WaitStatus::done) return;
    if (limit.count() > 0) {  // else a wait on it timed out and said so
      std::string what = impl->label();
      if (what.empty()) what = "a send";
      std::fprintf(stderr, "hetrain: %s still pending after %.3g s was abandoned when its request was dropped\n",
                   what.c_str(), limit.count());
    }
    (void)impl.release();
  } catch (...) {
  }
}
}  // namespace

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish(impl_, drop_wait_);  // the request being replaced goes as if destroyed
    impl_ = std::move(other.impl_);
    drop_wait_ = other.drop_wait_;
  }
  return *this;
}

Request::~Request() { finish(impl_, drop_wait_); }

std::string Request::label() const { return impl_ ? impl_->label() : std::string{}; }

bool Request::test() {
  if (!impl_) return true;
  if (impl_->cancelled()) return false;
  return impl_->test();
}

WaitStatus Request::wait(Timeout timeout) {
  if (!impl_) return WaitStatus::done;
  Deadline deadline = deadline_from(timeout, "Request::wait");
  if (impl_->cancelled()) return WaitStatus::timed_out;
  if (poll_until([&] { return impl_->test(); }, deadline) == WaitStatus::done)
    return WaitStatus::done;
  if (impl_->expire()) return WaitStatus::done;
  drop_wait_ = Timeout(0);  // reported by this wait: dropping it need not wait again
  return WaitStatus::timed_out;
}

WaitStatus Request::spin(Timeout timeout) {
  if (!impl_) return WaitStatus::done;
  Deadline deadline = deadline_from(timeout, "Request::spin");
  if (impl_->cancelled()) return WaitStatus::timed_out;
  OwnStall own;
  while (!impl_->test())
    if (own.forgive(deadline); deadline && Clock::now() > *deadline) {
      if (impl_->expire()) return WaitStatus::done;
      drop_wait_ = Timeout(0);
      return WaitStatus::timed_out;
    }
  return WaitStatus::done;
}

namespace {
// The seconds this thread's last roll call took, for the message that follows it: the
// job ends that much after the peer timeout, and a message saying "after 5 s" 10 s in
// read as if the bound were not kept.
thread_local double last_roll_call_s = 0;
}  // namespace

std::vector<int> absent_after(Communicator& c, Timeout timeout) {
  const auto t0 = Clock::now();
  std::vector<int> absent = c.roll_call(std::min(timeout, Timeout(10)));
  last_roll_call_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return absent;
}

std::vector<int> stalled_among(Communicator& c, const std::vector<int>& waited_for, Timeout timeout) {
  const std::vector<int> absent = absent_after(c, timeout);
  std::vector<int> stalled;
  for (int w : waited_for)
    if (std::find(absent.begin(), absent.end(), w) != absent.end()) stalled.push_back(w);
  return stalled.empty() ? waited_for : stalled;
}

std::string peer_timeout_message(int me, const std::vector<int>& missing, std::string_view what,
                                 Timeout waited) {
  std::ostringstream s;
  s << "rank " << me << ": ";
  // A roll call (absent_after) just before this message lengthened the wait.
  const double roll_call = std::exchange(last_roll_call_s, 0.0);
  const std::string tail =
      roll_call >= 0.5 ? " (a roll call naming who was absent took " + std::to_string(std::lround(roll_call)) + " s more)" : "";
  if (missing.empty()) {
    s << "timed out after " << waited.count() << " s waiting for " << what
      << "; a rank of the group has stalled or died" << tail;
    return s.str();
  }
  s << "no word from rank" << (missing.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < missing.size(); ++i) s << (i ? ", " : "") << missing[i];
  s << " after " << waited.count() << " s waiting for " << what << "; "
    << (missing.size() > 1 ? "they have" : "it has") << " stalled or died" << tail;
  return s.str();
}

// ---- consultations

namespace {
class AllgatherConsultation final : public Consultation {
 public:
  AllgatherConsultation(Communicator& comm, std::string mine) : comm_(comm), mine_(std::move(mine)) {}
  std::string finish(const Answer& answer, Timeout timeout, std::string_view what) override {
    const std::vector<std::string> items = comm_.allgather(mine_, timeout, what);
    return comm_.allgather(comm_.rank() == 0 ? answer(items) : std::string(), timeout, what)[0];
  }

 private:
  Communicator& comm_;
  std::string mine_;
};
}  // namespace

std::unique_ptr<Consultation> Communicator::consult(const std::string& mine) {
  return std::make_unique<AllgatherConsultation>(*this, mine);
}

// ---- waits and checks

Clock::duration seconds_to_duration(double s) {
  return std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(s));
}

Deadline deadline_from(Timeout timeout, const char* op) {
  const double s = timeout.count();
  HT_CHECK(std::isfinite(s) && s >= 0, op, ": timeout ", s,
           " s is invalid; expected a finite number of seconds >= 0");
  if (s > 365.0 * 24 * 3600) return std::nullopt;  // keeps now + s from overflowing
  return Clock::now() + seconds_to_duration(s);
}

void backoff_sleep(int& polls, std::chrono::microseconds& pause, Deadline deadline, uint32_t heard) {
  // Most messages on one host land within microseconds: poll a few times before sleeping.
  constexpr int kSpinPolls = 64;
  if (++polls <= kSpinPolls) return;
  const BackoffPauses limits = backoff_pauses();
  auto p = pause;
  if (deadline) {
    auto left = *deadline - Clock::now();
    if (left <= Clock::duration::zero()) return;
    p = std::min(p, std::chrono::ceil<std::chrono::microseconds>(left));
  }
  pause = sleep_unless_rung(heard, p) ? limits.min : std::clamp(pause * 2, limits.min, limits.max);
}

void check_peer(int peer, int size, const char* op, const char* role) {
  HT_CHECK(peer >= 0 && peer < size, op, ": ", role, " rank ", peer, " is out of range [0, ", size,
           ")");
}

void check_tag(int tag, int max_tag, const char* op) {
  HT_CHECK(tag >= 0 && tag <= max_tag, op, ": tag ", tag, " is out of range [0, ", max_tag, "]");
}

void check_buffer(const void* data, size_t bytes, const char* op) {
  // MPI counts are int; a negative size converted to size_t also lands here.
  HT_CHECK(bytes <= static_cast<size_t>(INT_MAX), op, ": message size ", bytes, " bytes (",
           static_cast<long long>(bytes), " as signed) is invalid; expected 0 to ", INT_MAX);
  HT_CHECK(data != nullptr || bytes == 0, op, ": buffer is null for ", bytes, " bytes");
}

void check_buckets(const std::vector<Tensor>& buckets, const char* op) {
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Tensor& b = buckets[i];
    HT_CHECK(b.defined(), op, ": bucket ", i, " is undefined; expected a float32 tensor");
    HT_CHECK(b.dtype() == DType::f32, op, ": bucket ", i, " of shape ", to_string(b.shape()),
             " is ", dtype_name(b.dtype()), "; expected float32");
    HT_CHECK(b.numel() <= INT_MAX, op, ": bucket ", i, " has ", b.numel(),
             " elements; expected at most ", INT_MAX, " (split it)");
  }
}

void copy_host_into(Tensor& into, const void* host) {
  const size_t bytes = static_cast<size_t>(into.numel()) * dtype_size(into.dtype());
  if (into.is_contiguous()) {
    into.backend().copy_from_host(into.raw(), host, bytes);
    return;
  }
  // Stage densely on the device, then scatter into the strided view.
  Tensor dense = Tensor::empty(into.shape(), into.dtype(), into.backend(), "comm staging");
  dense.backend().copy_from_host(dense.raw(), host, bytes);
  into.backend().copy(dense.raw(), dense.strides(), into.raw(), into.strides(), into.shape());
}

// ---- link emulation model

void check_links(const std::vector<LinkEmulation>& links, int size, const char* who) {
  HT_CHECK(links.empty() || static_cast<int>(links.size()) == size, who, ": got ", links.size(),
           " links for a communicator of ", size, " ranks; expected ", size,
           " (one per rank) or none");
  for (size_t i = 0; i < links.size(); ++i) {
    const auto& l = links[i];
    HT_CHECK(std::isfinite(l.latency_s) && l.latency_s >= 0, who, ": rank ", i, " latency ",
             l.latency_s, " s is invalid; expected a finite value >= 0");
    HT_CHECK(std::isfinite(l.bandwidth_bytes_per_s) && l.bandwidth_bytes_per_s >= 0, who, ": rank ",
             i, " bandwidth ", l.bandwidth_bytes_per_s,
             " B/s is invalid; expected a finite value >= 0 (0 = unlimited)");
  }
}

bool any_active(const std::vector<LinkEmulation>& links) {
  return std::any_of(links.begin(), links.end(), [](const LinkEmulation& l) { return l.active(); });
}

double pair_bandwidth(const LinkEmulation& a, const LinkEmulation& b) {
  if (a.bandwidth_bytes_per_s <= 0) return b.bandwidth_bytes_per_s;
  if (b.bandwidth_bytes_per_s <= 0) return a.bandwidth_bytes_per_s;
  return std::min(a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s);
}

double collective_delay_s(const std::vector<LinkEmulation>& links, Collective kind, size_t bytes) {
  const size_t p = links.size();
  if (p < 2) return 0.0;  // one rank talks to no one
  double hop = 0.0, bw = 0.0;
  std::vector<double> lat;
  for (size_t i = 0; i < p; ++i) {
    hop = std::max(hop, links[i].latency_s + links[(i + 1) % p].latency_s);
    lat.push_back(links[i].latency_s);
    double b = links[i].bandwidth_bytes_per_s;
    if (b > 0) bw = bw > 0 ? std::min(bw, b) : b;
  }
  const double steps = static_cast<double>(p - 1);
  const double volume = static_cast<double>(bytes);
  switch (kind) {
    case Collective::allreduce:
      return 2 * steps * hop + (bw > 0 ? 2 * steps / static_cast<double>(p) * volume / bw : 0.0);
    case Collective::allgather:
      return steps * hop + (bw > 0 ? steps * volume / bw : 0.0);
    case Collective::barrier: {
      std::partial_sort(lat.begin(), lat.begin() + 2, lat.end(), std::greater<>());
      return std::ceil(std::log2(static_cast<double>(p))) * (lat[0] + lat[1]);
    }
  }
  return 0.0;
}

// ---- tensor messages: one message of a fixed header and the dense bytes

namespace {

constexpr uint32_t kTensorMagic = 0x534e5448;  // "HTNS"
constexpr int kMaxDims = 8;

struct TensorHeader {
  uint32_t magic;
  uint32_t dtype;
  uint32_t ndim;
  uint32_t reserved;
  int64_t dims[kMaxDims];
};

size_t tensor_bytes(const Tensor& t) {
  return static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
}

std::string describe(const Shape& shape, DType dtype) {
  std::ostringstream s;
  s << to_string(shape) << ' ' << dtype_name(dtype) << " ("
    << static_cast<size_t>(numel(shape)) * dtype_size(dtype) << " bytes)";
  return s.str();
}

// Keeps a send's host copy alive until the send has finished with it.
class OwningSend final : public Request::Impl {
 public:
  OwningSend(std::unique_ptr<std::vector<char>> buffer, Request inner)
      : buffer_(std::move(buffer)), inner_(std::move(inner)) {}
  bool test() override { return inner_.test(); }
  std::string label() const override { return inner_.label(); }

 private:
  std::unique_ptr<std::vector<char>> buffer_;  // declared first: destroyed after inner_
  Request inner_;
};

class TensorRecv final : public Request::Impl {
 public:
  TensorRecv(std::shared_ptr<std::vector<char>> buffer, Request inner, Tensor into, int src,
             int tag)
      : buffer_(std::move(buffer)),
        inner_(std::move(inner)),
        into_(std::move(into)),
        src_(src),
        tag_(tag) {}

  bool test() override {
    if (!error_.empty()) throw Error(error_);
    if (applied_) return true;
    if (!inner_.test()) return false;
    apply();
    return true;
  }
  bool expire() override {
    // A zero-timeout wait cancels the inner receive unless its message has arrived.
    if (inner_.wait(std::chrono::duration<double>(0)) == WaitStatus::done) return test();
    cancelled_ = true;
    return false;
  }
  bool cancelled() const override { return cancelled_; }
  bool is_receive() const override { return true; }

 private:
  void apply() {
    applied_ = true;
    const std::vector<char>& msg = *buffer_;
    const std::string want = describe(into_.shape(), into_.dtype());
    TensorHeader h{};
    if (msg.size() >= sizeof h) std::memcpy(&h, msg.data(), sizeof h);
    if (msg.size() < sizeof h || h.magic != kTensorMagic || h.ndim > kMaxDims ||
        h.dtype > static_cast<uint32_t>(DType::i32)) {
      fail_stored("recv: message from rank ", src_, " tag ", tag_, " of ", msg.size(),
                  " bytes is not a tensor message; expected a tensor of ", want);
    }
    Shape shape(h.dims, h.dims + h.ndim);
    const DType dtype = static_cast<DType>(h.dtype);
    const std::string got = describe(shape, dtype);
    if (shape != into_.shape() || dtype != into_.dtype()) {
      fail_stored("recv: tensor from rank ", src_, " tag ", tag_, " is ", got, "; `into` is ",
                  want);
    }
    const size_t bytes = tensor_bytes(into_);
    if (msg.size() != sizeof h + bytes) {
      fail_stored("recv: tensor from rank ", src_, " tag ", tag_, " declares ", got,
                  " but carries ", msg.size() - sizeof h, " bytes");
    }
    copy_host_into(into_, msg.data() + sizeof h);
  }

  template <class... Parts>
  [[noreturn]] void fail_stored(const Parts&... parts) {
    std::ostringstream s;
    (s << ... << parts);
    error_ = s.str();
    throw Error(error_);
  }

  std::shared_ptr<std::vector<char>> buffer_;
  Request inner_;
  Tensor into_;
  int src_, tag_;
  bool applied_ = false, cancelled_ = false;
  std::string error_;
};

}  // namespace

void Communicator::send_bytes(const void* data, size_t bytes, int dst, int tag, Timeout timeout,
                              std::string_view what) {
  deadline_from(timeout, "send_bytes");  // a bad timeout raises before anything is posted
  if (isend_bytes(data, bytes, dst, tag).wait(timeout) != WaitStatus::done)
    fail_as<PeerTimeout>(peer_timeout_message(world_rank(rank()), {world_rank(dst)}, what, timeout));
}

WaitStatus Communicator::recv_bytes(void* data, size_t bytes, int src, int tag, Timeout timeout) {
  deadline_from(timeout, "recv_bytes");  // a bad timeout raises before anything is posted
  return irecv_bytes(data, bytes, src, tag).wait(timeout);
}

Request Communicator::isend(const Tensor& t, int dst, int tag) {
  HT_CHECK(t.defined(), "isend: the tensor for rank ", dst, " tag ", tag, " is undefined");
  HT_CHECK(t.dim() <= kMaxDims, "isend: tensor of shape ", to_string(t.shape()), " has ", t.dim(),
           " dimensions; expected at most ", kMaxDims);
  check_peer(dst, size(), "isend", "destination");
  check_tag(tag, max_tag(), "isend");
  const size_t bytes = tensor_bytes(t);
  auto buffer = std::make_unique<std::vector<char>>(sizeof(TensorHeader) + bytes);
  TensorHeader h{};
  h.magic = kTensorMagic;
  h.dtype = static_cast<uint32_t>(t.dtype());
  h.ndim = static_cast<uint32_t>(t.dim());
  std::copy(t.shape().begin(), t.shape().end(), h.dims);
  std::memcpy(buffer->data(), &h, sizeof h);
  // A dense host copy: views may be strided, and OpenMPI here cannot read device memory.
  Tensor dense = contiguous(t.detach());
  dense.backend().copy_to_host(buffer->data() + sizeof h, dense.raw(), bytes);
  Request inner = isend_bytes(buffer->data(), buffer->size(), dst, tag);
  return Request(std::make_unique<OwningSend>(std::move(buffer), std::move(inner)));
}

Request Communicator::irecv(Tensor& into, int src, int tag) {
  HT_CHECK(into.defined(), "irecv: `into` for rank ", src, " tag ", tag,
           " is undefined; expected a tensor of the sender's shape and dtype");
  auto buffer = std::make_shared<std::vector<char>>();
  Request inner = irecv_message(buffer, src, tag);
  return Request(std::make_unique<TensorRecv>(buffer, std::move(inner), into, src, tag));
}

void Communicator::send(const Tensor& t, int dst, int tag, Timeout timeout, std::string_view what) {
  deadline_from(timeout, "send");
  if (isend(t, dst, tag).wait(timeout) != WaitStatus::done)
    fail_as<PeerTimeout>(peer_timeout_message(world_rank(rank()), {world_rank(dst)}, what, timeout));
}

WaitStatus Communicator::recv(Tensor& into, int src, int tag, Timeout timeout) {
  deadline_from(timeout, "recv");
  return irecv(into, src, tag).wait(timeout);
}

}  // namespace ht::comm
