#include "comm/local_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/comm_internal.h"
#include "core/error.h"

namespace ht::comm {

class LocalRecv final : public Request::Impl {
 public:
  LocalRecv(LocalCommunicator* comm, std::shared_ptr<LocalCommunicator::PendingRecv> r)
      : comm_(comm), r_(std::move(r)) {}
  bool test() override { return comm_->test_recv(*r_); }
  bool expire() override { return comm_->expire_recv(*r_); }
  bool cancelled() const override { return r_->cancelled; }
  bool is_receive() const override { return true; }

 private:
  LocalCommunicator* comm_;
  std::shared_ptr<LocalCommunicator::PendingRecv> r_;
};

LocalCommunicator::LocalCommunicator(std::vector<LinkEmulation> links) {
  set_link_emulation(std::move(links));
}

std::string LocalCommunicator::host() const {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int /*key*/, Timeout timeout,
                                                      std::string_view /*what*/) {
  deadline_from(timeout, "split");  // checks the argument; one rank never waits
  if (color < 0) return nullptr;
  return std::make_unique<LocalCommunicator>(links_);
}

// The same bound as OpenMPI's MPI_TAG_UB here, so tags that work alone work under mpirun.
int LocalCommunicator::max_tag() const { return INT_MAX; }

Request LocalCommunicator::isend_bytes(const void* data, size_t bytes, int dst, int tag) {
  check_peer(dst, 1, "isend_bytes", "destination");
  check_tag(tag, max_tag(), "isend_bytes");
  check_buffer(data, bytes, "isend_bytes");
  Message m;
  m.bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  m.due = now;
  if (any_active(links_)) {  // emulation: the message crosses this rank's link twice
    const LinkEmulation& l = links_[0];
    const double bw = l.bandwidth_bytes_per_s;
    const auto start = std::max(now, path_free_);
    path_free_ = bw > 0 ? start + seconds_to_duration(static_cast<double>(bytes) / bw) : start;
    m.due = path_free_ + seconds_to_duration(2 * l.latency_s);
  }
  m.due = std::max(m.due, last_due_);
  last_due_ = m.due;
  messages_[tag].push_back(std::move(m));
  // Buffered: the bytes are copied, so the send is complete at once.
  return Request(std::make_unique<DoneRequest>());
}

Request LocalCommunicator::irecv_bytes(void* data, size_t bytes, int src, int tag) {
  check_peer(src, 1, "irecv_bytes", "source");
  check_tag(tag, max_tag(), "irecv_bytes");
  check_buffer(data, bytes, "irecv_bytes");
  auto r = std::make_shared<PendingRecv>();
  r->data = data;
  r->bytes = bytes;
  r->tag = tag;
  return post(std::move(r));
}

Request LocalCommunicator::irecv_message(std::shared_ptr<std::vector<char>> into, int src,
                                         int tag) {
  check_peer(src, 1, "irecv_message", "source");
  check_tag(tag, max_tag(), "irecv_message");
  HT_CHECK(into != nullptr, "irecv_message: the buffer for rank ", src, " tag ", tag, " is null");
  auto r = std::make_shared<PendingRecv>();
  r->any = std::move(into);
  r->tag = tag;
  return post(std::move(r));
}

Request LocalCommunicator::post(std::shared_ptr<PendingRecv> r) {
  {
    std::lock_guard lock(mutex_);
    posted_[r->tag].push_back(r);
    match_locked(r->tag);
  }
  return Request(std::make_unique<LocalRecv>(this, std::move(r)));
}

void LocalCommunicator::match_locked(int tag) {
  auto p = posted_.find(tag);
  auto m = messages_.find(tag);
  if (p == posted_.end() || m == messages_.end()) return;
  const auto now = Clock::now();
  auto& recvs = p->second;
  auto& msgs = m->second;
  while (!recvs.empty() && !msgs.empty() && msgs.front().due <= now) {
    std::shared_ptr<PendingRecv> r = std::move(recvs.front());
    recvs.pop_front();
    Message msg = std::move(msgs.front());
    msgs.pop_front();
    if (r->any) {
      *r->any = std::move(msg.bytes);
    } else if (msg.bytes.size() != r->bytes) {
      r->error = "irecv_bytes: message from rank 0 tag " + std::to_string(tag) + " has " +
                 std::to_string(msg.bytes.size()) + " bytes; expected " + std::to_string(r->bytes) +
                 " (the message was dropped)";
    } else if (!msg.bytes.empty()) {
      std::memcpy(r->data, msg.bytes.data(), msg.bytes.size());
    }
    r->done = true;
  }
  if (recvs.empty()) posted_.erase(p);
  if (msgs.empty()) messages_.erase(m);
}

bool LocalCommunicator::test_recv(PendingRecv& r) {
  std::lock_guard lock(mutex_);
  if (!r.done) match_locked(r.tag);
  if (r.done && !r.error.empty()) throw Error(r.error);
  return r.done;
}

bool LocalCommunicator::expire_recv(PendingRecv& r) {
  std::lock_guard lock(mutex_);
  if (!r.done) match_locked(r.tag);  // a last look before giving up
  if (r.done) {
    if (!r.error.empty()) throw Error(r.error);
    return true;
  }
  // Unmatched: withdraw it, so that no later message is written into its buffer.
  auto p = posted_.find(r.tag);
  if (p != posted_.end()) {
    auto& q = p->second;
    q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& x) { return x.get() == &r; }),
            q.end());
    if (q.empty()) posted_.erase(p);
  }
  r.cancelled = true;
  return false;
}

WaitStatus LocalCommunicator::allreduce_sum(std::vector<Tensor>& buckets, Timeout timeout) {
  check_buckets(buckets, "allreduce_sum");
  deadline_from(timeout, "allreduce_sum");  // checks the argument; one rank never waits
  return WaitStatus::done;                  // the sum over one rank is its own value
}

WaitStatus LocalCommunicator::barrier(Timeout timeout) {
  deadline_from(timeout, "barrier");
  return WaitStatus::done;
}

std::vector<std::string> LocalCommunicator::allgather(const std::string& mine, Timeout timeout,
                                                      std::string_view /*what*/) {
  deadline_from(timeout, "allgather");
  return {mine};
}

std::vector<int> LocalCommunicator::roll_call(Timeout grace) {
  deadline_from(grace, "roll_call");
  return {};  // no other rank to miss
}

std::string LocalCommunicator::broadcast(const std::string& text, int root, Timeout timeout,
                                         std::string_view /*what*/) {
  check_peer(root, 1, "broadcast", "root");
  deadline_from(timeout, "broadcast");
  return text;
}

void LocalCommunicator::set_link_emulation(std::vector<LinkEmulation> links) {
  check_links(links, 1, "set_link_emulation");
  std::lock_guard lock(mutex_);
  links_ = std::move(links);
}

}  // namespace ht::comm
