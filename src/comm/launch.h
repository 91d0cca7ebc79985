// How this process was started, read from the launcher's environment before MPI is up:
// mpirun (Open MPI's OMPI_COMM_WORLD_*), srun (Slurm's PMIx or PMI-2 plugin: PMIX_RANK or
// PMI_RANK, with SLURM_NTASKS or PMI_SIZE), or another PMI launcher. Without any of them
// the process is a world of one and MPI is never initialised, so single-process commands
// work where no MPI runtime can start.
#pragma once

#include <functional>

namespace ht::comm {

struct Launch {
  bool launched = false;  // started by an MPI launcher: the world comes from MPI
  int rank = 0;           // this process's world rank (0 where not given)
  int size = 0;           // the world's size; 0 where the environment does not say
};

// `env` looks a variable up (nullptr: not set), as std::getenv does.
Launch launch_from(const std::function<const char*(const char*)>& env);
// This process's, from its environment.
Launch launch();

}  // namespace ht::comm
