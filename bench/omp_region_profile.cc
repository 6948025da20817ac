// Where the threads of a run spend a decode step: an LD_PRELOAD library that
// wraps libgomp's GOMP_parallel (every `#pragma omp parallel` region GCC
// emits goes through it) and times, per region (by its outlined function),
// the region's wall time and each thread's time inside the region's body. At
// exit it prints, on stderr, the time between regions (the calling thread
// alone), the time in regions, each of the first two threads' busy time, and
// a line per region, the largest first. A region whose second thread is busy
// for 0 s ran on one thread (its `if` clause was false).
//
//   LD_PRELOAD=build/lib/libomp_region_profile.so build/bin/model_bench ...
//   OMP_REGION_PROFILE_AFTER=12   start timing 12 s after the process starts
//                                 (past a benchmark's set-up)
//
// Function addresses are printed relative to their object's load address;
// `nm -C` on the binary names them.
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

using Body = void (*)(void*);
using Parallel = void (*)(Body, void*, unsigned, unsigned);

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Region {
  long count = 0;
  double wall = 0, busy[2] = {0, 0};
};

struct Profile {
  Profile() {
    const char* after = std::getenv("OMP_REGION_PROFILE_AFTER");
    start = Now() + (after != nullptr ? std::atof(after) : 0.0);
  }

  double start;
  double between = 0, last_end = 0;
  std::mutex mu;  // regions nested in a region's body start on other threads
  std::unordered_map<Body, Region> regions;
};

Profile& TheProfile() {
  static Profile* profile = new Profile;  // never destroyed: Report runs at exit
  return *profile;
}

struct Call {
  Body body;
  void* data;
  Region* region;
};

void Timed(void* p) {
  const Call& call = *static_cast<Call*>(p);
  const double t0 = Now();
  call.body(call.data);
  const int thread = omp_get_thread_num();
  if (thread < 2) {
    std::lock_guard<std::mutex> lock(TheProfile().mu);
    call.region->busy[thread] += Now() - t0;
  }
}

void Report() {
  Profile& p = TheProfile();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<std::pair<Body, Region>> sorted(p.regions.begin(), p.regions.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.wall > b.second.wall; });
  double wall = 0, busy0 = 0, busy1 = 0;
  for (const auto& [body, r] : sorted) {
    wall += r.wall;
    busy0 += r.busy[0];
    busy1 += r.busy[1];
  }
  std::fprintf(stderr,
               "omp_region_profile: %.3f s between regions, %.3f s in regions; busy in "
               "regions: thread 0 %.3f s, thread 1 %.3f s\n",
               p.between, wall, busy0, busy1);
  for (const auto& [body, r] : sorted) {
    Dl_info info{};
    const void* address = reinterpret_cast<const void*>(body);
    if (dladdr(address, &info) != 0) {
      address = reinterpret_cast<const void*>(reinterpret_cast<const char*>(address) -
                                              static_cast<const char*>(info.dli_fbase));
    }
    std::fprintf(stderr,
                 "omp_region_profile: %p %s: %ld regions, %.3f s, thread 0 busy %.3f s, "
                 "thread 1 busy %.3f s\n",
                 address, info.dli_fname != nullptr ? info.dli_fname : "?", r.count, r.wall,
                 r.busy[0], r.busy[1]);
  }
}

}  // namespace

extern "C" void GOMP_parallel(Body body, void* data, unsigned threads, unsigned flags) {
  static const auto real = reinterpret_cast<Parallel>(dlsym(RTLD_NEXT, "GOMP_parallel"));
  static const int registered = std::atexit(Report);
  (void)registered;
  Profile& p = TheProfile();
  const double t0 = Now();
  if (t0 < p.start) return real(body, data, threads, flags);
  Region* region;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    region = &p.regions[body];
    // Time on the calling thread alone since the last region ended (a
    // region started inside another's body counts none).
    if (p.last_end > 0 && omp_get_level() == 0) p.between += t0 - p.last_end;
  }
  Call call{body, data, region};
  real(Timed, &call, threads, flags);
  const double t1 = Now();
  std::lock_guard<std::mutex> lock(p.mu);
  region->count += 1;
  region->wall += t1 - t0;
  if (omp_get_level() == 0) p.last_end = t1;
}
