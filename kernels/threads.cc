// Thread count of the CPU kernels: one OpenMP pool, which oneDNN shares.
#include "kernels/threads.h"

#include <omp.h>

#include <thread>

namespace deltaserve::kernels {

void SetNumThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  omp_set_num_threads(n);
}

int NumThreads() { return omp_get_max_threads(); }

}  // namespace deltaserve::kernels
