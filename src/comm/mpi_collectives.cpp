// The collectives of MpiCommunicator: split; allreduce_sum and barrier as non-blocking
// MPI collectives completed by the polled wait, so that a deadline is a status; and
// allgather, broadcast and consult point to point on the control communicator, so that
// a deadline names the ranks missed; plus the emulated duration of each (see
// LinkEmulation in communicator.h for the model).
#include <algorithm>
#include <climits>
#include <exception>
#include <thread>

#include "comm/mpi_communicator.h"
#include "comm/watchdog.h"
#include "core/error.h"

namespace ht::comm {

// MPI_Comm_split cannot time out. The allgather of the colours before it is bounded and
// sees every rank arrive, so a rank that stalls later holds the split (and the duplicate
// for the new communicator's control messages) only while it is stalled, inside a call
// that is otherwise a few microseconds of work; a Watchdog bounds that stretch.
std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, Timeout timeout, std::string_view what) {
  check_usable("split");
  (void)allgather(std::to_string(color), timeout, concat("every rank to join ", what));
  Watchdog bound(concat("MPI_Comm_split of ", what, " (every rank reached the colours' allgather before it)"), timeout);
  MPI_Comm out = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), "split(color ",
            color, ", key ", key, "): MPI_Comm_split");
  if (out == MPI_COMM_NULL) return nullptr;
  std::vector<LinkEmulation> parent = links_snapshot(), links;
  if (!parent.empty()) {  // the members keep their links: map their ranks back to ours
    MPI_Group mine = MPI_GROUP_NULL, theirs = MPI_GROUP_NULL;
    check_mpi(MPI_Comm_group(comm_, &mine), "split: MPI_Comm_group");
    check_mpi(MPI_Comm_group(out, &theirs), "split: MPI_Comm_group");
    int n = 0;
    MPI_Group_size(theirs, &n);
    std::vector<int> sub(static_cast<size_t>(n)), ours(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) sub[static_cast<size_t>(i)] = i;
    check_mpi(MPI_Group_translate_ranks(theirs, n, sub.data(), mine, ours.data()),
              "split: MPI_Group_translate_ranks");
    for (int r : ours) links.push_back(parent[static_cast<size_t>(r)]);
    MPI_Group_free(&mine);
    MPI_Group_free(&theirs);
  }
  return std::make_unique<MpiCommunicator>(out, host_, std::move(links));
}

void MpiCommunicator::check_usable(const char* op) const {
  HT_CHECK(abandoned_.empty(), op, ": this communicator is unusable since ", abandoned_,
           " (MPI cannot cancel a collective); split a new one from a communicator that works");
}

std::vector<LinkEmulation> MpiCommunicator::links_snapshot() const {
  std::lock_guard lock(emu_mutex_);
  return links_;
}

WaitStatus MpiCommunicator::wait_collective(std::vector<MPI_Request>& reqs,
                                            std::vector<std::vector<float>>& buffers,
                                            Clock::time_point not_before, Deadline deadline,
                                            const char* op) {
  bool mpi_done = false;
  auto done = [&] {
    if (!mpi_done) {
      mpi_done = true;
      for (MPI_Request& r : reqs) {
        if (r == MPI_REQUEST_NULL) continue;
        int flag = 0;
        check_mpi(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), op, ": MPI_Test");
        mpi_done = mpi_done && flag;
      }
    }
    return mpi_done && Clock::now() >= not_before;  // the emulated duration has passed
  };
  if (poll_until(done, deadline) == WaitStatus::done) return WaitStatus::done;
  if (!mpi_done) {
    for (MPI_Request r : reqs)
      if (r != MPI_REQUEST_NULL) graveyard_->requests.push_back(r);
    for (auto& b : buffers) graveyard_->buffers.push_back(std::move(b));  // heap blocks stay put
    abandoned_ = concat(op, " timed out");
  }
  // Otherwise only the emulated time was left: the data arrived and the communicator
  // stays usable, but the result is timed_out as the caller's deadline says.
  return WaitStatus::timed_out;
}

WaitStatus MpiCommunicator::allreduce_sum(std::vector<Tensor>& buckets, Timeout timeout) {
  check_usable("allreduce_sum");
  check_buckets(buckets, "allreduce_sum");
  const Deadline deadline = deadline_from(timeout, "allreduce_sum");
  const auto start = Clock::now();
  size_t total = 0;
  for (const Tensor& b : buckets) total += static_cast<size_t>(b.numel()) * sizeof(float);
  const auto not_before = start + seconds_to_duration(collective_delay_s(
                                      links_snapshot(), Collective::allreduce, total));

  // Staged through host copies: an abandoned collective may still write its buffer
  // later, and the caller's buckets must stay as they were unless the result is done
  // (and other devices and strided views need a dense host copy anyway).
  std::vector<std::vector<float>> staged(buckets.size());
  std::vector<MPI_Request> reqs(buckets.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < buckets.size(); ++i) {
    Tensor& b = buckets[i];
    staged[i] = b.detach().to_vector();
    float* data = staged[i].data();
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(b.numel()), MPI_FLOAT,
                                  MPI_SUM, comm_, &reqs[i]);
    if (rc != MPI_SUCCESS) {
      if (i > 0) {  // earlier buckets are under way and cannot be withdrawn
        for (size_t j = 0; j < i; ++j) graveyard_->requests.push_back(reqs[j]);
        for (auto& s : staged) graveyard_->buffers.push_back(std::move(s));
        abandoned_ = "allreduce_sum failed part way";
      }
      check_mpi(rc, "allreduce_sum: MPI_Iallreduce of bucket ", i, " (", b.numel(), " floats)");
    }
  }
  const WaitStatus status = wait_collective(reqs, staged, not_before, deadline, "allreduce_sum");
  if (status == WaitStatus::done) {
    for (size_t i = 0; i < buckets.size(); ++i)
      if (buckets[i].numel() > 0) copy_host_into(buckets[i], staged[i].data());
  }
  return status;
}

WaitStatus MpiCommunicator::barrier(Timeout timeout) {
  check_usable("barrier");
  const Deadline deadline = deadline_from(timeout, "barrier");
  const auto not_before = Clock::now() + seconds_to_duration(collective_delay_s(
                                             links_snapshot(), Collective::barrier, 0));
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Ibarrier(comm_, &reqs[0]), "barrier: MPI_Ibarrier");
  std::vector<std::vector<float>> none;
  return wait_collective(reqs, none, not_before, deadline, "barrier");
}

int MpiCommunicator::next_control_tag() {
  return static_cast<int>(control_seq_++ % (static_cast<int64_t>(control_->max_tag()) + 1));
}

namespace {

// Polls every request in turn (a probe-matched receive progresses only while it is
// tested) until all are done or the deadline passes; returns which are not done.
std::vector<size_t> poll_all(std::vector<Request>& reqs, Deadline deadline) {
  std::vector<bool> done(reqs.size(), false);
  auto all_done = [&] {
    bool all = true;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!done[i]) done[i] = reqs[i].test();
      all = all && done[i];
    }
    return all;
  };
  std::vector<size_t> left;
  if (poll_until(all_done, deadline) == WaitStatus::done) return left;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (!done[i]) left.push_back(i);
  return left;
}

}  // namespace

std::vector<int> MpiCommunicator::swap_with_all(const std::shared_ptr<const std::string>& item,
                                                std::vector<std::shared_ptr<std::vector<char>>>& got,
                                                Deadline deadline) {
  const int tag = next_control_tag();
  got.assign(static_cast<size_t>(size_), nullptr);
  std::vector<Request> reqs;  // receives from each other rank, then sends to each
  std::vector<int> peer_of;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    got[static_cast<size_t>(r)] = std::make_shared<std::vector<char>>();
    reqs.push_back(control_->irecv_message(got[static_cast<size_t>(r)], r, tag));
    peer_of.push_back(r);
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    reqs.push_back(control_->isend_bytes(item->data(), item->size(), r, tag));
    peer_of.push_back(r);
  }
  const std::vector<size_t> left = poll_all(reqs, deadline);
  std::vector<int> missing;
  if (left.empty()) return missing;
  for (size_t i : left) {
    const int w = world_rank(peer_of[i]);
    if (std::find(missing.begin(), missing.end(), w) == missing.end()) missing.push_back(w);
  }
  std::sort(missing.begin(), missing.end());
  (void)new std::shared_ptr<const std::string>(item);  // the pending sends read it
  for (Request& r : reqs) (void)r.wait(Timeout(0));   // dropping them need not wait
  return missing;
}

std::vector<std::string> MpiCommunicator::allgather(const std::string& mine, Timeout timeout,
                                                    std::string_view what) {
  check_usable("allgather");
  HT_CHECK(mine.size() <= static_cast<size_t>(INT_MAX), "allgather: item of ", mine.size(),
           " bytes; expected at most ", INT_MAX);
  const Deadline deadline = deadline_from(timeout, "allgather");
  const auto start = Clock::now();
  // Owned here and kept past an abandoned send (swap_with_all): MPI may still read it.
  auto item = std::make_shared<const std::string>(mine);
  std::vector<std::shared_ptr<std::vector<char>>> got;
  const std::vector<int> missing = swap_with_all(item, got, deadline);
  if (!missing.empty()) fail_as<PeerTimeout>(peer_timeout_message(world_rank(rank_), missing, what, timeout));
  std::vector<std::string> out(static_cast<size_t>(size_));
  size_t largest = mine.size();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      out[static_cast<size_t>(r)] = mine;
    } else {
      const auto& g = *got[static_cast<size_t>(r)];
      out[static_cast<size_t>(r)].assign(g.begin(), g.end());
      largest = std::max(largest, g.size());
    }
  }
  // The emulated duration of the allgather (the data itself takes the control path).
  auto not_before = start + seconds_to_duration(collective_delay_s(links_snapshot(), Collective::allgather, largest));
  if (deadline) not_before = std::min(not_before, *deadline);
  if (Clock::now() < not_before) std::this_thread::sleep_until(not_before);
  return out;
}

// Not check_usable: this is for a communicator whose collective was just abandoned; the
// roll call is point to point on the control communicator.
std::vector<int> MpiCommunicator::roll_call(Timeout grace) {
  const Deadline deadline = deadline_from(grace, "roll_call");
  static const auto here = std::make_shared<const std::string>(1, 'r');
  std::vector<std::shared_ptr<std::vector<char>>> got;
  return swap_with_all(here, got, deadline);
}

std::string MpiCommunicator::broadcast(const std::string& text, int root, Timeout timeout,
                                      std::string_view what) {
  check_peer(root, size_, "broadcast", "root");
  HT_CHECK(text.size() <= static_cast<size_t>(INT_MAX), "broadcast: text of ", text.size(),
           " bytes; expected at most ", INT_MAX);
  const Deadline deadline = deadline_from(timeout, "broadcast");
  const int tag = next_control_tag();
  if (rank_ != root) {
    auto got = std::make_shared<std::vector<char>>();
    std::vector<Request> recv;
    recv.push_back(control_->irecv_message(got, root, tag));
    if (!poll_all(recv, deadline).empty())
      fail_as<PeerTimeout>(peer_timeout_message(world_rank(rank_), {world_rank(root)}, what, timeout));
    return std::string(got->begin(), got->end());
  }
  auto item = std::make_shared<const std::string>(text);  // kept past an abandoned send
  std::vector<Request> sends;
  std::vector<int> to;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    sends.push_back(control_->isend_bytes(item->data(), item->size(), r, tag));
    to.push_back(r);
  }
  const std::vector<size_t> left = poll_all(sends, deadline);
  if (!left.empty()) {
    std::vector<int> missing;
    for (size_t i : left) missing.push_back(world_rank(to[i]));
    (void)new std::shared_ptr<const std::string>(item);
    for (Request& r : sends) (void)r.wait(Timeout(0));
    fail_as<PeerTimeout>(peer_timeout_message(world_rank(rank_), missing, what, timeout));
  }
  return text;
}

namespace {

class MpiConsultation final : public Consultation {
 public:
  // `owner`: the communicator whose consult made it (its roll call names who stalled);
  // `control`: the owner's, which carries the messages.
  MpiConsultation(MpiCommunicator& owner, MpiCommunicator& control, std::string mine, int tag)
      : owner_(owner), c_(control), mine_(std::make_shared<const std::string>(std::move(mine))), tag_(tag) {
    if (c_.rank() == 0) {
      for (int r = 1; r < c_.size(); ++r) {
        items_.push_back(std::make_shared<std::vector<char>>());
        recvs_.push_back(c_.irecv_message(items_.back(), r, tag_));
      }
    } else {
      HT_CHECK(mine_->size() <= static_cast<size_t>(INT_MAX), "consult: item of ", mine_->size(),
               " bytes; expected at most ", INT_MAX);
      sends_.push_back(c_.isend_bytes(mine_->data(), mine_->size(), 0, tag_));
      items_.push_back(std::make_shared<std::vector<char>>());
      recvs_.push_back(c_.irecv_message(items_.back(), 0, tag_));
    }
  }

  // Rank 0 gives the others up to the finish's timeout to take its answer. A send still
  // pending then is abandoned (it was the job's end anyway: the others wait for that
  // answer up to the same timeout), and the bytes it reads are kept for good. While an
  // error unwinds, the job is ending: waiting would only hold the error's line back.
  ~MpiConsultation() override {
    try {
      if (finished_ && std::uncaught_exceptions() == 0) {
        const Deadline d = deadline_from(timeout_, "consult");
        for (Request& r : sends_) {
          const auto left = d ? std::max(Clock::duration::zero(), *d - Clock::now()) : Clock::duration::zero();
          (void)r.wait(std::chrono::duration_cast<Timeout>(left));
        }
      }
      bool pending = false;
      for (Request& r : sends_) pending = r.wait(Timeout(0)) != WaitStatus::done || pending;
      if (pending) {
        (void)new std::shared_ptr<const std::string>(mine_);
        (void)new std::shared_ptr<const std::string>(answer_);
      }
    } catch (...) {
    }
  }

  std::string finish(const Answer& answer, Timeout timeout, std::string_view what) override {
    const Deadline deadline = deadline_from(timeout, "consult");
    timeout_ = timeout;
    if (c_.rank() != 0) {
      std::vector<Request> both;
      both.push_back(std::move(sends_[0]));
      both.push_back(std::move(recvs_[0]));
      const bool late = !poll_all(both, deadline).empty();
      sends_[0] = std::move(both[0]);
      recvs_[0] = std::move(both[1]);
      if (late) {
        for (Request& r : sends_) (void)r.wait(Timeout(0));
        // Rank 0 may itself be waiting, for another rank's item: then it answers the roll
        // call (it takes one on its own timeout) and the absent are the ones to name (a
        // stopped idle rank's peers, waiting here first, named rank 0 and ended the job).
        const int root = c_.world_rank(0);
        const std::vector<int> absent = absent_after(owner_, timeout);
        const bool root_waits = !absent.empty() && std::find(absent.begin(), absent.end(), root) == absent.end();
        fail_as<PeerTimeout>(peer_timeout_message(
            c_.world_rank(c_.rank()), root_waits ? absent : std::vector<int>{root},
            concat("rank 0's answer to ", what, root_waits ? " (rank 0 was waiting too)" : ""), timeout));
      }
      return std::string(items_[0]->begin(), items_[0]->end());
    }
    const std::vector<size_t> left = poll_all(recvs_, deadline);
    if (!left.empty()) {
      std::vector<int> missing;
      for (size_t i : left) missing.push_back(c_.world_rank(static_cast<int>(i) + 1));
      // The roll call the others take on their timeout, waiting for this answer.
      missing = stalled_among(owner_, missing, timeout);
      fail_as<PeerTimeout>(peer_timeout_message(c_.world_rank(0), missing, concat("every rank's item of ", what),
                                                timeout));
    }
    std::vector<std::string> items{*mine_};
    for (const auto& item : items_) items.emplace_back(item->begin(), item->end());
    answer_ = std::make_shared<const std::string>(answer(items));
    HT_CHECK(answer_->size() <= static_cast<size_t>(INT_MAX), "consult: answer of ", answer_->size(),
             " bytes; expected at most ", INT_MAX);
    for (int r = 1; r < c_.size(); ++r) sends_.push_back(c_.isend_bytes(answer_->data(), answer_->size(), r, tag_));
    finished_ = true;
    return *answer_;
  }

 private:
  MpiCommunicator& owner_;
  MpiCommunicator& c_;
  std::shared_ptr<const std::string> mine_, answer_;
  int tag_;
  bool finished_ = false;
  Timeout timeout_{0};
  std::vector<std::shared_ptr<std::vector<char>>> items_;
  std::vector<Request> recvs_, sends_;  // last: destroyed before the buffers
};

}  // namespace

std::unique_ptr<Consultation> MpiCommunicator::consult(const std::string& mine) {
  return std::make_unique<MpiConsultation>(*this, *control_, mine, next_control_tag());
}

void MpiCommunicator::set_link_emulation(std::vector<LinkEmulation> links) {
  check_links(links, size_, "set_link_emulation");
  std::lock_guard lock(emu_mutex_);
  links_ = std::move(links);
}

}  // namespace ht::comm
