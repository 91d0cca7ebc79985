// Point to point over MPI, and the link-emulation thread that delays sends.
#include "comm/mpi_communicator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <queue>
#include <thread>

#include "comm/doorbell.h"

namespace ht::comm {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    return "MPI error code " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len)) + " (MPI error code " + std::to_string(rc) +
         ")";
}

namespace {

// What a send's description holds; put into words only when asked (once, for a message),
// since sends are many. The destination is its world rank, as every message names it.
struct SendLabel {
  int world_dst;
  int tag;
  size_t bytes;
  std::string words() const { return concat("a send to rank ", world_dst, " (tag ", tag, ", ", bytes, " bytes)"); }
};

class MpiSend final : public Request::Impl {
 public:
  MpiSend(MPI_Request req, int dst, int tag, SendLabel label) : req_(req), dst_(dst), tag_(tag), label_(label) {}
  std::string label() const override { return label_.words(); }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "isend_bytes to rank ", dst_, " tag ",
              tag_, ": MPI_Test");
    return flag != 0;
  }

 private:
  MPI_Request req_;
  int dst_, tag_;
  SendLabel label_;
};

// The delivery thread's hand-over: set once the delayed MPI_Isend has been posted.
struct PostedSend {
  std::mutex mutex;
  bool posted = false;
  int rc = MPI_SUCCESS;
  MPI_Request req = MPI_REQUEST_NULL;
};

class EmulatedSend final : public Request::Impl {
 public:
  EmulatedSend(std::shared_ptr<PostedSend> slot, int dst, int tag, SendLabel label)
      : slot_(std::move(slot)), dst_(dst), tag_(tag), label_(label) {}
  std::string label() const override { return label_.words(); }
  bool test() override {
    std::lock_guard lock(slot_->mutex);
    if (!slot_->posted) return false;  // still held back by the link emulation
    check_mpi(slot_->rc, "isend_bytes to rank ", dst_, " tag ", tag_,
              ": MPI_Isend (emulated link)");
    if (slot_->req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    check_mpi(MPI_Test(&slot_->req, &flag, MPI_STATUS_IGNORE), "isend_bytes to rank ", dst_,
              " tag ", tag_, ": MPI_Test");
    return flag != 0;
  }

 private:
  std::shared_ptr<PostedSend> slot_;
  int dst_, tag_;
  SendLabel label_;
};

}  // namespace

// ---- link emulation: a thread posts each send at its due time, earliest first

class MpiCommunicator::Delivery {
 public:
  explicit Delivery(MPI_Comm comm) : comm_(comm), thread_([this] { run(); }) {}
  // Drains: every queued message is still posted at its due time, since its receiver
  // may be waiting for it.
  ~Delivery() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // `world_dst`: the destination's rank in MPI_COMM_WORLD, whose doorbell rings once posted.
  std::shared_ptr<PostedSend> enqueue(Clock::time_point due, const void* data, size_t bytes,
                                      int dst, int world_dst, int tag) {
    auto slot = std::make_shared<PostedSend>();
    {
      std::lock_guard lock(mutex_);
      queue_.push(Outgoing{due, next_seq_++, data, bytes, dst, world_dst, tag, slot});
      ++unposted_;
    }
    cv_.notify_all();
    return slot;
  }

  // Nothing waits to be posted, so a direct send cannot overtake a delayed one.
  bool idle() {
    std::lock_guard lock(mutex_);
    return unposted_ == 0;
  }

 private:
  struct Outgoing {
    Clock::time_point due;
    uint64_t seq;  // equal due times keep their send order
    const void* data;
    size_t bytes;
    int dst, world_dst, tag;
    std::shared_ptr<PostedSend> slot;
    bool operator>(const Outgoing& o) const { return due != o.due ? due > o.due : seq > o.seq; }
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (queue_.empty()) {
        if (stop_) return;
        cv_.wait(lock);
        continue;
      }
      const Clock::time_point due = queue_.top().due;
      const Clock::time_point now = Clock::now();
      if (now < due - kWakeEarly) {
        cv_.wait_until(lock, due - kWakeEarly);
        continue;
      }
      if (now < due) {  // the last stretch: yield rather than sleep, to post on time
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
        continue;
      }
      Outgoing o = queue_.top();
      queue_.pop();
      lock.unlock();
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc =
          MPI_Isend(o.data, static_cast<int>(o.bytes), MPI_BYTE, o.dst, o.tag, comm_, &req);
      {
        std::lock_guard slot_lock(o.slot->mutex);
        o.slot->rc = rc;
        o.slot->req = req;
        o.slot->posted = true;
      }
      if (rc == MPI_SUCCESS) ring_doorbell(o.world_dst);
      lock.lock();
      --unposted_;
    }
  }

  // Timed sleeps here end a few hundred microseconds late (measured ~0.34 ms for
  // condition-variable waits on this machine), which would add to every emulated delay.
  static constexpr std::chrono::microseconds kWakeEarly{500};

  MPI_Comm comm_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::priority_queue<Outgoing, std::vector<Outgoing>, std::greater<>> queue_;
  uint64_t next_seq_ = 0;
  size_t unposted_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

struct MpiCommunicator::PendingRecv {
  // abandoned: matched, but its sender stopped mid-message past kUnwaitedSendLimit; kept
  // for good (MPI may still write into it), its wait reported as timed out.
  enum class State { queued, receiving, done, cancelled, abandoned };
  void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<std::vector<char>> any;  // irecv_message: takes any size
  std::vector<char> discard;               // a message of the wrong size lands here
  MPI_Request req = MPI_REQUEST_NULL;
  std::atomic<State> state{State::queued};
  std::string error;  // raised once the matched message is in
  int src = 0, tag = 0;
};

class MpiRecv final : public Request::Impl {
 public:
  MpiRecv(MpiCommunicator* comm, std::shared_ptr<MpiCommunicator::PendingRecv> r)
      : comm_(comm), r_(std::move(r)) {}
  bool test() override { return comm_->test_recv(*r_); }
  bool expire() override {
    const bool done = comm_->expire_recv(*r_);
    if (r_->state.load() == MpiCommunicator::PendingRecv::State::abandoned) comm_->bury(r_);
    return done;
  }
  bool cancelled() const override {
    const auto s = r_->state.load();
    return s == MpiCommunicator::PendingRecv::State::cancelled || s == MpiCommunicator::PendingRecv::State::abandoned;
  }
  bool is_receive() const override { return true; }

 private:
  MpiCommunicator* comm_;
  std::shared_ptr<MpiCommunicator::PendingRecv> r_;
};

// ---- construction

MpiCommunicator::MpiCommunicator(MPI_Comm comm, HostInfo host, std::vector<LinkEmulation> links,
                                 bool with_control)
    : comm_(comm), host_(std::move(host)), graveyard_(std::make_unique<Graveyard>()) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
            "communicator: MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "communicator: MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "communicator: MPI_Comm_size");
  void* tag_ub = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found),
            "communicator: MPI_TAG_UB");
  if (found) max_tag_ = *static_cast<int*>(tag_ub);
  {  // each rank's rank in MPI_COMM_WORLD, whose doorbell a send to it rings
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    check_mpi(MPI_Comm_group(comm_, &mine), "communicator: MPI_Comm_group");
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "communicator: MPI_Comm_group of the world");
    std::vector<int> ours(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) ours[static_cast<size_t>(i)] = i;
    world_rank_.resize(static_cast<size_t>(size_));
    check_mpi(MPI_Group_translate_ranks(mine, size_, ours.data(), world, world_rank_.data()),
              "communicator: MPI_Group_translate_ranks");
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  path_free_.assign(static_cast<size_t>(size_), Clock::time_point{});
  last_due_.assign(static_cast<size_t>(size_), Clock::time_point{});
  set_link_emulation(std::move(links));
  if (with_control) {
    MPI_Comm dup = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(comm_, &dup), "communicator: MPI_Comm_dup for the control messages");
    control_ = std::make_unique<MpiCommunicator>(dup, host_, std::vector<LinkEmulation>{}, false);
  }
}

namespace {

// The doorbell of this host's ranks (collective over `host`): local rank 0 makes a POSIX
// shared-memory object, every rank maps it, and it is unlinked once all have, so nothing
// outlives the job, whichever way it ends. Null where it cannot be made (no /dev/shm,
// say): waits then sleep out their pauses, as they would without it.
std::unique_ptr<Doorbell> open_doorbell(MPI_Comm world, MPI_Comm host, int local_rank, int local_size) {
  const size_t bytes = Doorbell::bytes_for(local_size);
  char name[64] = {};
  if (local_rank == 0) {
    std::snprintf(name, sizeof name, "/hetrain-bell-%ld-%lld", static_cast<long>(getpid()),
                  static_cast<long long>(Clock::now().time_since_epoch().count()));
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      if (fd >= 0) {
        close(fd);
        shm_unlink(name);
      }
      name[0] = '\0';
    } else {
      close(fd);
    }
  }
  check_mpi(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, host), "world: MPI_Bcast of the doorbell's name");
  void* words = MAP_FAILED;
  if (name[0] != '\0') {
    const int fd = shm_open(name, O_RDWR, 0600);
    if (fd >= 0) {
      words = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
  }
  check_mpi(MPI_Barrier(host), "world: MPI_Barrier after mapping the doorbell");
  if (local_rank == 0 && name[0] != '\0') shm_unlink(name);
  if (words == MAP_FAILED) return nullptr;
  // Per world rank, its slot on this host (its local rank) or -1.
  int world_size = 0;
  check_mpi(MPI_Comm_size(world, &world_size), "world: MPI_Comm_size");
  MPI_Group host_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(host, &host_group), "world: MPI_Comm_group of the host group");
  check_mpi(MPI_Comm_group(world, &world_group), "world: MPI_Comm_group");
  std::vector<int> local(static_cast<size_t>(local_size)), in_world(static_cast<size_t>(local_size));
  for (int i = 0; i < local_size; ++i) local[static_cast<size_t>(i)] = i;
  check_mpi(MPI_Group_translate_ranks(host_group, local_size, local.data(), world_group, in_world.data()),
            "world: MPI_Group_translate_ranks of the host group");
  MPI_Group_free(&host_group);
  MPI_Group_free(&world_group);
  std::vector<int> slot_of(static_cast<size_t>(world_size), -1);
  for (int i = 0; i < local_size; ++i) slot_of[static_cast<size_t>(in_world[static_cast<size_t>(i)])] = i;
  return std::make_unique<Doorbell>(words, bytes, std::move(slot_of), local_rank);
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::make_world() {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "world: MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), "world: MPI_Comm_set_errhandler");
  HostInfo info;
  MPI_Comm shared = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
            "world: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  check_mpi(MPI_Comm_rank(shared, &info.local_rank), "world: MPI_Comm_rank of the host group");
  check_mpi(MPI_Comm_size(shared, &info.local_size), "world: MPI_Comm_size of the host group");
  set_process_doorbell(open_doorbell(dup, shared, info.local_rank, info.local_size));
  MPI_Comm_free(&shared);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  check_mpi(MPI_Get_processor_name(name, &len), "world: MPI_Get_processor_name");
  info.host.assign(name, static_cast<size_t>(len));
  return std::make_unique<MpiCommunicator>(dup, std::move(info), std::vector<LinkEmulation>{});
}

MpiCommunicator::~MpiCommunicator() {
  delivery_.reset();  // posts what is still queued
  control_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!abandoned_.empty()) {
    // A collective still refers to the communicator and its buffers: keep both.
    (void)graveyard_.release();
    return;
  }
  MPI_Comm_free(&comm_);
}

// ---- point to point

Request MpiCommunicator::isend_bytes(const void* data, size_t bytes, int dst, int tag) {
  check_peer(dst, size_, "isend_bytes", "destination");
  check_tag(tag, max_tag_, "isend_bytes");
  check_buffer(data, bytes, "isend_bytes");
  {
    std::lock_guard lock(emu_mutex_);
    // Under emulation, and while delayed sends are still queued (so that this one cannot
    // overtake them), the delivery thread posts the send.
    if (any_active(links_) || (delivery_ && !delivery_->idle())) {
      if (!delivery_) delivery_ = std::make_unique<Delivery>(comm_);
      auto slot = delivery_->enqueue(due_locked(bytes, dst), data, bytes, dst,
                                     world_rank_[static_cast<size_t>(dst)], tag);
      return Request(std::make_unique<EmulatedSend>(std::move(slot), dst, tag,
                                                    SendLabel{world_rank_[static_cast<size_t>(dst)], tag, bytes}));
    }
  }
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, dst, tag, comm_, &req),
            "isend_bytes to rank ", dst, " tag ", tag, " (", bytes, " bytes): MPI_Isend");
  ring_doorbell(world_rank_[static_cast<size_t>(dst)]);
  return Request(
      std::make_unique<MpiSend>(req, dst, tag, SendLabel{world_rank_[static_cast<size_t>(dst)], tag, bytes}));
}

Clock::time_point MpiCommunicator::due_locked(size_t bytes, int dst) {
  const auto now = Clock::now();
  const auto d = static_cast<size_t>(dst);
  Clock::time_point due = now;
  if (any_active(links_)) {
    const LinkEmulation& a = links_[static_cast<size_t>(rank_)];
    const LinkEmulation& b = links_[d];
    const double bw = pair_bandwidth(a, b);
    const auto start = std::max(now, path_free_[d]);
    path_free_[d] = bw > 0 ? start + seconds_to_duration(static_cast<double>(bytes) / bw) : start;
    due = path_free_[d] + seconds_to_duration(a.latency_s + b.latency_s);
  }
  due = std::max(due, last_due_[d]);
  last_due_[d] = due;
  return due;
}

Request MpiCommunicator::irecv_bytes(void* data, size_t bytes, int src, int tag) {
  check_peer(src, size_, "irecv_bytes", "source");
  check_tag(tag, max_tag_, "irecv_bytes");
  check_buffer(data, bytes, "irecv_bytes");
  auto r = std::make_shared<PendingRecv>();
  r->data = data;
  r->bytes = bytes;
  r->src = src;
  r->tag = tag;
  return post(std::move(r));
}

Request MpiCommunicator::irecv_message(std::shared_ptr<std::vector<char>> into, int src, int tag) {
  check_peer(src, size_, "irecv_message", "source");
  check_tag(tag, max_tag_, "irecv_message");
  HT_CHECK(into != nullptr, "irecv_message: the buffer for rank ", src, " tag ", tag, " is null");
  auto r = std::make_shared<PendingRecv>();
  r->any = std::move(into);
  r->src = src;
  r->tag = tag;
  return post(std::move(r));
}

Request MpiCommunicator::post(std::shared_ptr<PendingRecv> r) {
  {
    std::lock_guard lock(recv_mutex_);
    recv_queues_[{r->src, r->tag}].push_back(r);
    match_locked(r->src, r->tag);
  }
  return Request(std::make_unique<MpiRecv>(this, std::move(r)));
}

void MpiCommunicator::match_locked(int src, int tag) {
  auto it = recv_queues_.find({src, tag});
  if (it == recv_queues_.end()) return;
  auto& queue = it->second;
  while (!queue.empty()) {
    int found = 0;
    MPI_Message msg = MPI_MESSAGE_NULL;
    MPI_Status status;
    check_mpi(MPI_Improbe(src, tag, comm_, &found, &msg, &status), "irecv from rank ", src, " tag ",
              tag, ": MPI_Improbe");
    if (!found) break;
    int count = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &count), "irecv from rank ", src, " tag ", tag,
              ": MPI_Get_count");
    std::shared_ptr<PendingRecv> r = std::move(queue.front());
    queue.pop_front();
    const auto n = static_cast<size_t>(count);
    void* dst = nullptr;
    if (r->any) {
      r->any->resize(n);
      dst = r->any->data();
    } else if (n == r->bytes) {
      dst = r->data;
    } else {  // receive it anyway, so that the next receive gets the next message
      r->discard.resize(n);
      dst = r->discard.data();
      r->error = concat("irecv_bytes: message from rank ", src, " tag ", tag, " has ", n,
                        " bytes; expected ", r->bytes, " (the message was dropped)");
    }
    const int rc = MPI_Imrecv(dst, count, MPI_BYTE, &msg, &r->req);
    if (rc != MPI_SUCCESS) {
      r->error = concat("irecv from rank ", src, " tag ", tag,
                        ": MPI_Imrecv failed: ", mpi_error_string(rc));
      r->state = PendingRecv::State::done;
    } else {
      r->state = PendingRecv::State::receiving;
    }
  }
  if (queue.empty()) recv_queues_.erase(it);
}

bool MpiCommunicator::test_recv(PendingRecv& r) {
  std::lock_guard lock(recv_mutex_);
  using State = PendingRecv::State;
  if (r.state == State::queued) match_locked(r.src, r.tag);
  if (r.state == State::receiving) {
    int flag = 0;
    const int rc = MPI_Test(&r.req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      r.error = concat("irecv from rank ", r.src, " tag ", r.tag,
                       ": MPI_Test failed: ", mpi_error_string(rc));
      r.state = State::done;
    } else if (flag) {
      r.state = State::done;
      ring_doorbell(world_rank_[static_cast<size_t>(r.src)]);  // its sender may wait for this
    }
  }
  if (r.state == State::done && !r.error.empty()) throw Error(r.error);
  return r.state == State::done;
}

bool MpiCommunicator::expire_recv(PendingRecv& r) {
  using State = PendingRecv::State;
  {
    std::lock_guard lock(recv_mutex_);
    if (r.state == State::queued) match_locked(r.src, r.tag);  // a last look
    if (r.state == State::queued) {
      // Not matched: withdraw it. Nothing was posted to MPI, so nothing can write into
      // its buffer later (the role MPI_Cancel plays for a pre-posted MPI_Irecv).
      auto it = recv_queues_.find({r.src, r.tag});
      if (it != recv_queues_.end()) {
        auto& q = it->second;
        q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& x) { return x.get() == &r; }),
                q.end());
        if (q.empty()) recv_queues_.erase(it);
      }
      r.state = State::cancelled;
      return false;
    }
  }
  // Matched: its bytes are being copied in and a matched receive cannot be cancelled.
  // Finishing it takes no longer than the copy while the sender goes on, but a large
  // message's data follows its header only as the sender progresses: one stopped
  // mid-message would hold this wait for good. Past the limit it is abandoned (kept,
  // since MPI may still write into it) and the wait reports the peer as timed out.
  if (poll_until([&] { return test_recv(r); }, deadline_from(kUnwaitedSendLimit, "a matched receive")) ==
      WaitStatus::done)
    return true;
  r.state = State::abandoned;
  return false;
}

}  // namespace ht::comm
