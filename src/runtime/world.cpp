#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "llamatrain/error.h"
#include "llamatrain/h5.h"
#include "llamatrain/runtime.h"

namespace lt {

namespace {

World& mutable_world() {
  static World w = [] {
    World x;
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    x.host = host;
    return x;
  }();
  return w;
}

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail(strcat(what, " failed: ", std::string(msg, size_t(len))));
  }
}

}  // namespace

bool launched_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"})
    if (std::getenv(var)) return true;
  return false;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  if (!launched_by_mpi_launcher()) return;
  h5::start_library();  // before MPI: see h5.h
  int provided = 0;
  mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  World& w = mutable_world();
  w.mpi = true;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI_Comm_size");
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
}

MpiSession::~MpiSession() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

void MpiSession::abort(const std::string& what, int code) const {
  const World& w = world();
  std::fprintf(stderr, "[rank %d/%d %s] %s\n", w.rank, w.size, w.host.c_str(), what.c_str());
  std::fflush(stderr);
  if (w.mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

const World& world() { return mutable_world(); }

int hardware_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

int omp_num_threads_env() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  return env ? std::max(0, std::atoi(env)) : 0;
}

int default_threads() {
  if (const int n = omp_num_threads_env(); n > 0) return n;
  const int per_rank = hardware_cores() / std::max(1, world().local_size);
  return std::max(1, per_rank);
}

}  // namespace lt
