// Process runtime: MPI world (when launched by mpirun/srun), thread defaults, host facts.
#pragma once
#include <string>

namespace lt {

struct World {
  int rank = 0, size = 1;              // world
  int local_rank = 0, local_size = 1;  // this node (MPI_Comm_split_type SHARED)
  bool mpi = false;                    // MPI initialised (launched by an MPI launcher)
  std::string host;
};

// True when a launcher started us (Open MPI, PMIx, PMI/Slurm env): then MPI is initialised.
// A plain single process runs as a one-rank world without MPI, so no launcher is needed.
bool launched_by_mpi_launcher();

// Owns MPI initialisation for the process; finalizes on every path (destructor).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // Aborts every rank (MPI_Abort) after printing "[rank r/N host] what".
  [[noreturn]] void abort(const std::string& what, int code = 1) const;
};

// The world of this process (a one-rank world before/without MpiSession).
const World& world();

// OpenMP threads per rank: OMP_NUM_THREADS if set, else cores of the node / ranks on the node.
int default_threads();
// OMP_NUM_THREADS as default_threads reads it (its leading integer); 0 when unset or not positive.
int omp_num_threads_env();
int hardware_cores();

}  // namespace lt
