// The collectives of MpiCommunicator: split, and non-blocking MPI collectives completed
// by the polled wait, so that a deadline is a status, plus the emulated duration of each
// (see LinkEmulation in communicator.h for the model).
#include <algorithm>
#include <climits>

#include "comm/mpi_communicator.h"
#include "core/error.h"

namespace ht::comm {

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) const {
  check_usable("split");
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

  // In place when possible; staged through host copies for other devices, strided
  // views, and timed calls (an abandoned collective may still write its buffer later,
  // and the caller's buckets must stay as they were unless the result is done).
  std::vector<std::vector<float>> staged(buckets.size());
  std::vector<MPI_Request> reqs(buckets.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < buckets.size(); ++i) {
    Tensor& b = buckets[i];
    float* data = nullptr;
    if (!timeout && b.backend().kind() == DeviceKind::cpu && b.is_contiguous()) {
      data = b.data();
    } else {
      staged[i] = b.detach().to_vector();
      data = staged[i].data();
    }
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
      if (!staged[i].empty()) copy_host_into(buckets[i], staged[i].data());
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

std::vector<std::string> MpiCommunicator::allgather(const std::string& mine) {
  check_usable("allgather");
  HT_CHECK(mine.size() <= static_cast<size_t>(INT_MAX), "allgather: item of ", mine.size(),
           " bytes; expected at most ", INT_MAX);
  const auto start = Clock::now();
  std::vector<std::vector<float>> none;
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size_));
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &reqs[0]),
            "allgather: MPI_Iallgather of the lengths");
  wait_collective(reqs, none, start, std::nullopt, "allgather");
  std::vector<int> offsets(lens.size());
  long long total = 0;
  int largest = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    HT_CHECK(total + lens[i] <= INT_MAX, "allgather: items total more than ", INT_MAX, " bytes");
    offsets[i] = static_cast<int>(total);
    total += lens[i];
    largest = std::max(largest, lens[i]);
  }
  std::string all(static_cast<size_t>(total), '\0');
  const auto not_before =
      start + seconds_to_duration(collective_delay_s(links_snapshot(), Collective::allgather,
                                                     static_cast<size_t>(largest)));
  check_mpi(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(),
                            MPI_CHAR, comm_, &reqs[0]),
            "allgather: MPI_Iallgatherv of ", len, " bytes");
  wait_collective(reqs, none, not_before, std::nullopt, "allgather");
  std::vector<std::string> out;
  for (size_t i = 0; i < lens.size(); ++i)
    out.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(lens[i])));
  return out;
}

namespace {

class MpiConsultation final : public Consultation {
 public:
  MpiConsultation(Communicator& control, std::string mine, int tag)
      : c_(control), mine_(std::move(mine)), tag_(tag) {
    if (c_.rank() == 0) {
      for (int r = 1; r < c_.size(); ++r) {
        items_.push_back(std::make_shared<std::vector<char>>());
        recvs_.push_back(c_.irecv_message(items_.back(), r, tag_));
      }
    } else {
      HT_CHECK(mine_.size() <= static_cast<size_t>(INT_MAX), "consult: item of ", mine_.size(),
               " bytes; expected at most ", INT_MAX);
      sends_.push_back(c_.isend_bytes(mine_.data(), mine_.size(), 0, tag_));
      items_.push_back(std::make_shared<std::vector<char>>());
      recvs_.push_back(c_.irecv_message(items_.back(), 0, tag_));
    }
  }

  std::string finish(const Answer& answer) override {
    for (Request& r : recvs_) r.wait();
    if (c_.rank() != 0) {
      sends_[0].wait();
      return std::string(items_[0]->begin(), items_[0]->end());
    }
    std::vector<std::string> items{mine_};
    for (const auto& item : items_) items.emplace_back(item->begin(), item->end());
    answer_ = answer(items);
    HT_CHECK(answer_.size() <= static_cast<size_t>(INT_MAX), "consult: answer of ", answer_.size(),
             " bytes; expected at most ", INT_MAX);
    for (int r = 1; r < c_.size(); ++r) sends_.push_back(c_.isend_bytes(answer_.data(), answer_.size(), r, tag_));
    return answer_;
  }

 private:
  Communicator& c_;
  std::string mine_, answer_;
  int tag_;
  std::vector<std::shared_ptr<std::vector<char>>> items_;
  std::vector<Request> recvs_, sends_;  // last: destroyed (sends waited for) before the buffers
};

}  // namespace

std::unique_ptr<Consultation> MpiCommunicator::consult(const std::string& mine) {
  if (!control_) {  // collective: every rank makes it at its first consultation
    MPI_Comm dup = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(comm_, &dup), "consult: MPI_Comm_dup");
    control_ = std::make_unique<MpiCommunicator>(dup, host_, std::vector<LinkEmulation>{});
  }
  const int tag = consultations_++ % (control_->max_tag() + 1);
  return std::make_unique<MpiConsultation>(*control_, mine, tag);
}

void MpiCommunicator::set_link_emulation(std::vector<LinkEmulation> links) {
  check_links(links, size_, "set_link_emulation");
  std::lock_guard lock(emu_mutex_);
  links_ = std::move(links);
}

}  // namespace ht::comm
