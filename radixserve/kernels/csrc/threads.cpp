// Pins PyTorch's OpenMP threads (which the C++ kernels share) one per CPU: thread i of the
// team runs only on cpus[i]. SGLang does the same for SGLANG_CPU_OMP_THREADS_BIND.
#include <sched.h>
#include <omp.h>

#include "common.h"
#include "kernels.h"

namespace radixserve {

int64_t bind_threads(const std::vector<int64_t>& cpus) {
  TORCH_CHECK(!cpus.empty(), "bind_threads needs at least one CPU");
  const int n = static_cast<int>(cpus.size());
  at::set_num_threads(n);
  int64_t bound = 0;
#pragma omp parallel num_threads(n) reduction(+ : bound)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpus[omp_get_thread_num()]), &set);
    if (sched_setaffinity(0, sizeof(set), &set) == 0) bound += 1;
  }
  return bound;
}

}  // namespace radixserve
