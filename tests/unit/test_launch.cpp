// How a process was started, from its launcher's environment (comm/launch.h): mpirun,
// srun through PMIx or PMI-2, or no launcher at all.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "comm/launch.h"

using ht::comm::Launch;
using ht::comm::launch_from;

namespace {
Launch with(const std::map<std::string, std::string>& vars) {
  return launch_from([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}
}  // namespace

TEST_CASE("launch: no launcher is a world of one, with MPI left alone") {
  const Launch l = with({});
  CHECK_FALSE(l.launched);
  CHECK(l.rank == 0);
  // A Slurm allocation's shell (sbatch) holds SLURM_ variables but no PMI rank: not launched.
  CHECK_FALSE(with({{"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}}).launched);
}

TEST_CASE("launch: mpirun's world size and rank") {
  const Launch l = with({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"PMIX_RANK", "2"}});
  CHECK(l.launched);
  CHECK(l.size == 4);
  CHECK(l.rank == 2);
}

TEST_CASE("launch: srun is a launcher too (PMIx or PMI-2), its size from Slurm or PMI") {
  Launch l = with({{"PMIX_RANK", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "3"}});
  CHECK(l.launched);
  CHECK(l.rank == 3);
  CHECK(l.size == 8);
  l = with({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  CHECK(l.launched);
  CHECK(l.rank == 1);
  CHECK(l.size == 2);
  l = with({{"PMIX_RANK", "0"}});  // the size comes from MPI once it is up
  CHECK(l.launched);
  CHECK(l.size == 0);
}

TEST_CASE("launch: values that are not whole numbers are not taken") {
  CHECK_FALSE(with({{"OMPI_COMM_WORLD_SIZE", ""}}).launched);
  CHECK_FALSE(with({{"PMIX_RANK", "x"}}).launched);
  const Launch l = with({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "-1"}});
  CHECK(l.launched);
  CHECK(l.rank == 0);
}
