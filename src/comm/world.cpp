// world(): MPI when started by mpirun, one local rank otherwise.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/launch.h"
#include "comm/local_communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/watchdog.h"
#include "core/error.h"

namespace ht::comm {

namespace {

// Owns the world communicator and MPI's lifetime: the communicator (and its emulation
// thread) goes before MPI_Finalize, which runs at exit.
struct World {
  std::unique_ptr<Communicator> comm;
  bool finalize = false;
  bool launched = false;

  // Every rank's arrival, point to point, before the collective end: MPI_Finalize cannot
  // say whom it waits for, so a rank stalled on its way here is named now. Twice: the
  // others wait in the first for rank 0's final evaluation, and one stopped there had
  // sent its arrival already, so only the second, which none enters before every rank
  // has arrived, misses it (it was left to MPI_Finalize's unnamed timeout). A world left
  // unusable by an abandoned collective skips it (the watchdog still bounds the end).
  void arrive_at_end() {
    try {
      (void)comm->allgather("", blocking_call_limit(), "every rank at the job's end (MPI_Finalize)");
      (void)comm->allgather("", blocking_call_limit(), "every rank leaving at the job's end (MPI_Finalize)");
    } catch (const PeerTimeout& e) {
      end_with_peer_timeout(e.what());
    } catch (const std::exception&) {
    }
  }

  World() {
    // Without a launcher MPI is never initialised (comm/launch.h).
    const Launch started = launch();
    launched = started.launched;
    if (!started.launched) {
      comm = std::make_unique<LocalCommunicator>();
      return;
    }
    // Open MPI's start-up waits for every rank the launcher started, and so do the
    // world's first collectives: a rank stalled before them holds the rest.
    Watchdog bound("MPI start-up (MPI_Init_thread and the world's first collectives: every rank must reach them)");
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      HT_CHECK(rc == MPI_SUCCESS, "world: MPI_Init_thread failed with code ", rc, " (launched as rank ",
               started.rank, started.size > 0 ? " of " + std::to_string(started.size) : std::string(), ")");
      finalize = true;
    } else {
      MPI_Query_thread(&provided);
    }
    // The emulation thread and concurrent requests call MPI from several threads.
    HT_CHECK(provided >= MPI_THREAD_MULTIPLE, "world: MPI provides thread level ", provided,
             "; expected MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE, ")");
    comm = MpiCommunicator::make_world();
  }

  ~World() {
    if (launched) arrive_at_end();
    comm.reset();
    if (!finalize) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    Watchdog bound("MPI_Finalize (every rank must reach it)");
    MPI_Finalize();
  }
};

}  // namespace

Communicator& world() {
  static World w;  // initialised once, thread-safely; destroyed at exit
  return *w.comm;
}

void abort_job(int status) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    // MPI_Abort can wait forever for a launcher that has already gone (Open MPI 4's PMIx,
    // when several ranks abort at once): a watchdog ends the process regardless.
    std::thread([status] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(status);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  std::exit(status);
}

}  // namespace ht::comm
