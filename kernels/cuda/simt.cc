// The SIMT harness's scheduler (kernels/cuda/simt.h): fibers on one OS
// thread, switched by a few lines of x86-64 assembly (a saved stack pointer
// and the callee-saved registers; no signal masks, so a switch is a few
// nanoseconds rather than swapcontext's two system calls).
#include "kernels/cuda/simt.h"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/check.h"
#include "kernels/scratch.h"  // DELTASERVE_ASAN

#if DELTASERVE_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the SIMT harness switches fibers with x86-64 assembly"
#endif

// deltaserve_simt_switch(&save_sp, load_sp): pushes the callee-saved
// registers and the SSE and x87 control words on the current stack, stores
// the stack pointer in *save_sp, and pops the same from load_sp's stack.
extern "C" void deltaserve_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl deltaserve_simt_switch
  .hidden deltaserve_simt_switch
  .type deltaserve_simt_switch, @function
deltaserve_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size deltaserve_simt_switch, .-deltaserve_simt_switch
)");

namespace deltaserve::kernels::simt {
namespace {

// A thread's stack: kernels keep small arrays in registers, which here are
// stack; AddressSanitizer's redzones need more.
#if DELTASERVE_ASAN
constexpr size_t kStackBytes = size_t{256} << 10;
#else
constexpr size_t kStackBytes = size_t{64} << 10;
#endif
constexpr size_t kPageBytes = 4096;

enum class State : uint8_t { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;  // lowest usable byte
  State state = State::kRunnable;
  unsigned mask = 0;  // at a warp barrier: the lanes it waits for
  Dim3 tid;
  int linear = 0;
  size_t decls = 0;  // static shared declarations made so far
  void* fake_stack = nullptr;
};

// Stacks for up to kMaxBlockThreads fibers, each above a guard page, mapped
// once per OS thread and reused by every launch on it.
class StackPool {
 public:
  ~StackPool() {
    if (base_ != nullptr) munmap(base_, kMaxBlockThreads * Slot());
  }
  char* Stack(unsigned i) {
    if (base_ == nullptr) {
      void* p = mmap(nullptr, kMaxBlockThreads * Slot(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      DELTASERVE_CHECK(p != MAP_FAILED);
      base_ = static_cast<char*>(p);
      for (unsigned t = 0; t < kMaxBlockThreads; ++t) {
        DELTASERVE_CHECK(mprotect(base_ + t * Slot(), kPageBytes, PROT_NONE) == 0);
      }
    }
    return base_ + i * Slot() + kPageBytes;
  }

 private:
  static size_t Slot() { return kStackBytes + kPageBytes; }
  char* base_ = nullptr;
};

// One block in flight on this OS thread.
struct BlockRun {
  const char* kernel = nullptr;
  const std::function<void()>* body = nullptr;
  Dim3 grid, block, bid;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
  // Shared memory: [0, dynamic) dynamic, then the static declarations in the
  // order threads first make them; declarations of this launch keep their
  // offsets across its blocks.
  unsigned char* arena = nullptr;
  size_t dynamic = 0, used = 0;
  std::vector<size_t> decl_offsets;
  size_t decls_this_block = 0;
  std::vector<uint64_t> slots;  // [warps, 32]: warp exchanges
  std::string error;
#if DELTASERVE_ASAN
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;
#endif
};

thread_local BlockRun* tls_run = nullptr;
thread_local StackPool tls_stacks;

unsigned char* Arena() {
  thread_local std::unique_ptr<unsigned char, decltype(&std::free)> arena(
      static_cast<unsigned char*>(std::aligned_alloc(256, kMaxSharedBytes)), &std::free);
  DELTASERVE_CHECK(arena != nullptr);
  return arena.get();
}

BlockRun& Run() {
  if (tls_run == nullptr || tls_run->current == nullptr) {
    std::fprintf(stderr, "simt: a device function was called outside a kernel launch\n");
    std::abort();
  }
  return *tls_run;
}

std::string Where(const BlockRun& run, const Fiber& f) {
  char where[128];
  std::snprintf(where, sizeof(where), "block (%u, %u, %u) thread (%u, %u, %u)", run.bid.x,
                run.bid.y, run.bid.z, f.tid.x, f.tid.y, f.tid.z);
  return where;
}

// From a fiber back to the scheduler; returns when the scheduler resumes it.
void ToScheduler(BlockRun& run, Fiber& f) {
#if DELTASERVE_ASAN
  __sanitizer_start_switch_fiber(f.state == State::kDone ? nullptr : &f.fake_stack,
                                 run.scheduler_stack, run.scheduler_stack_bytes);
#endif
  deltaserve_simt_switch(&f.sp, run.scheduler_sp);
#if DELTASERVE_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &run.scheduler_stack, &run.scheduler_stack_bytes);
#endif
}

void FiberMain() {
  BlockRun& run = *tls_run;
#if DELTASERVE_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &run.scheduler_stack, &run.scheduler_stack_bytes);
#endif
  (*run.body)();
  Fiber& f = *run.current;
  f.state = State::kDone;
  ToScheduler(run, f);
  __builtin_unreachable();
}

void Resume(BlockRun& run, Fiber& f) {
  run.current = &f;
#if DELTASERVE_ASAN
  __sanitizer_start_switch_fiber(&run.scheduler_fake_stack, f.stack, kStackBytes);
#endif
  deltaserve_simt_switch(&run.scheduler_sp, f.sp);
#if DELTASERVE_ASAN
  __sanitizer_finish_switch_fiber(run.scheduler_fake_stack, nullptr, nullptr);
#endif
  run.current = nullptr;
}

void StartFiber(Fiber& f) {
#if DELTASERVE_ASAN
  ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
  // What deltaserve_simt_switch pops, from the top down: a pad (FiberMain is
  // entered as if called: its stack pointer 8 below a 16-byte boundary), the
  // return address, six registers, the control words.
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(f.stack) + kStackBytes) &
                                          ~uintptr_t{15});
  uint64_t* p = top;
  *--p = 0;
  *--p = reinterpret_cast<uint64_t>(&FiberMain);
  for (int r = 0; r < 6; ++r) *--p = 0;
  uint32_t mxcsr = 0;
  uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  *--p = uint64_t{mxcsr} | uint64_t{fpcw} << 32;
  f.sp = p;
  f.state = State::kRunnable;
  f.decls = 0;
  f.fake_stack = nullptr;
}

// Opens the barriers every thread they wait for has reached; "" when some
// opened, else why the block can go no further (it is stuck).
bool OpenBarriers(BlockRun& run) {
  const int threads = static_cast<int>(run.fibers.size());
  const int warps = (threads + kWarpSize - 1) / kWarpSize;
  bool opened = false;
  for (int w = 0; w < warps; ++w) {
    unsigned mask = 0;
    bool waiting = false;
    for (int l = 0; l < kWarpSize && w * kWarpSize + l < threads; ++l) {
      const Fiber& f = run.fibers[w * kWarpSize + l];
      if (f.state != State::kAtWarpBarrier) continue;
      if (waiting && f.mask != mask) {
        run.error =
            "lanes of one warp wait in collectives with different masks (" + Where(run, f) + ")";
        return false;
      }
      waiting = true;
      mask = f.mask;
    }
    if (!waiting) continue;
    bool all_here = true;
    for (int l = 0; l < kWarpSize; ++l) {
      if ((mask >> l & 1u) == 0) continue;
      const int t = w * kWarpSize + l;
      if (t >= threads) {
        run.error = "a warp collective's mask names lane " + std::to_string(l) +
                    ", which the block does not have";
        return false;
      }
      const Fiber& f = run.fibers[t];
      if (f.state == State::kDone) {
        run.error = "a warp collective waits for " + Where(run, f) + ", which has exited";
        return false;
      }
      if (f.state != State::kAtWarpBarrier) all_here = false;
    }
    if (!all_here) continue;
    for (int l = 0; l < kWarpSize; ++l) {
      if (mask >> l & 1u) run.fibers[w * kWarpSize + l].state = State::kRunnable;
    }
    opened = true;
  }
  if (opened) return true;
  // No warp barrier can open: the block barrier, if every thread is there.
  for (const Fiber& f : run.fibers) {
    if (f.state == State::kDone) {
      run.error = "__syncthreads() is not reached by " + Where(run, f) + ", which has exited";
      return false;
    }
    if (f.state == State::kAtWarpBarrier) {
      run.error = "__syncthreads() is not reached by " + Where(run, f) +
                  ", which waits in a warp collective";
      return false;
    }
  }
  for (Fiber& f : run.fibers) f.state = State::kRunnable;
  return true;
}

bool RunBlock(BlockRun& run) {
  run.decls_this_block = 0;
  if (run.dynamic > 0) std::memset(run.arena, 0xff, run.dynamic);
  for (Fiber& f : run.fibers) StartFiber(f);
  for (;;) {
    bool any_left = false;
    for (Fiber& f : run.fibers) {
      if (f.state == State::kRunnable) Resume(run, f);
      if (!run.error.empty()) return false;
    }
    for (const Fiber& f : run.fibers) any_left = any_left || f.state != State::kDone;
    if (!any_left) return true;
    if (!OpenBarriers(run)) return false;
  }
}

void Wait(State state, unsigned mask) {
  BlockRun& run = Run();
  Fiber& f = *run.current;
  f.state = state;
  f.mask = mask;
  ToScheduler(run, f);
  run.current = &f;
}

}  // namespace

std::string Launch(const char* kernel, Dim3 grid, Dim3 block, size_t dynamic_shared,
                   const std::function<void()>& body) {
  const std::string name = kernel;
  if (tls_run != nullptr) return name + ": launched from inside a kernel";
  if (grid.count() == 0 || block.count() == 0) return name + ": an empty grid or block";
  if (block.count() > kMaxBlockThreads || block.z > 64) {
    return name + ": a block of " + std::to_string(block.count()) + " threads (at most " +
           std::to_string(kMaxBlockThreads) + ", z at most 64)";
  }
  if (grid.y > 65535 || grid.z > 65535) return name + ": grid y and z are at most 65535";
  if (dynamic_shared > kMaxSharedBytes) {
    return name + ": " + std::to_string(dynamic_shared) + " bytes of dynamic shared memory";
  }
  BlockRun run;
  run.kernel = kernel;
  run.body = &body;
  run.grid = grid;
  run.block = block;
  run.arena = Arena();
  run.dynamic = (dynamic_shared + 15) / 16 * 16;
  run.used = run.dynamic;
  const unsigned threads = static_cast<unsigned>(block.count());
  run.fibers.resize(threads);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = run.fibers[t];
    f.linear = static_cast<int>(t);
    f.tid = Dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
    f.stack = tls_stacks.Stack(t);
  }
  run.slots.assign(((threads + kWarpSize - 1) / kWarpSize) * kWarpSize, 0);
  tls_run = &run;
  bool ok = true;
  for (unsigned z = 0; z < grid.z && ok; ++z) {
    for (unsigned y = 0; y < grid.y && ok; ++y) {
      for (unsigned x = 0; x < grid.x && ok; ++x) {
        run.bid = Dim3(x, y, z);
        ok = RunBlock(run);
      }
    }
  }
  tls_run = nullptr;
  return ok ? std::string() : name + ": " + run.error;
}

const Dim3& ThreadIdx() { return Run().current->tid; }
const Dim3& BlockIdx() { return Run().bid; }
const Dim3& BlockDim() { return Run().block; }
const Dim3& GridDim() { return Run().grid; }
int LaneId() { return Run().current->linear % kWarpSize; }

void SyncThreads() { Wait(State::kAtBlockBarrier, 0); }

void SyncWarp(unsigned mask) {
  if ((mask >> LaneId() & 1u) == 0) {
    BlockRun& run = Run();
    run.error =
        "a warp collective's mask leaves out its own lane (" + Where(run, *run.current) + ")";
  }
  Wait(State::kAtWarpBarrier, mask);
}

uint64_t Exchange(unsigned mask, uint64_t bits, int src_lane) {
  BlockRun& run = Run();
  const int linear = run.current->linear, warp_base = linear / kWarpSize * kWarpSize;
  run.slots[linear] = bits;
  SyncWarp(mask);
  if (src_lane < 0 || src_lane >= kWarpSize || (mask >> src_lane & 1u) == 0) {
    run.error = "a shuffle reads lane " + std::to_string(src_lane) + ", outside its mask (" +
                Where(run, *run.current) + ")";
  }
  const uint64_t out = run.slots[warp_base + (src_lane & (kWarpSize - 1))];
  SyncWarp(mask);  // nobody publishes again before every lane has read
  return out;
}

unsigned BallotSync(unsigned mask, int predicate) {
  BlockRun& run = Run();
  const int linear = run.current->linear, warp_base = linear / kWarpSize * kWarpSize;
  run.slots[linear] = predicate != 0 ? 1 : 0;
  SyncWarp(mask);
  unsigned out = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    if ((mask >> l & 1u) && run.slots[warp_base + l] != 0) out |= 1u << l;
  }
  SyncWarp(mask);
  return out;
}

void* StaticShared(size_t bytes, size_t align) {
  BlockRun& run = Run();
  Fiber& f = *run.current;
  const size_t n = f.decls++;
  if (n == run.decl_offsets.size()) {
    const size_t offset = (run.used + align - 1) / align * align;
    if (offset + bytes > kMaxSharedBytes) {
      run.error = "shared memory beyond " + std::to_string(kMaxSharedBytes) + " bytes";
      Wait(State::kDone, 0);  // never resumed: the launch stops
    }
    run.decl_offsets.push_back(offset);
    run.used = offset + bytes;
  }
  if (n == run.decls_this_block) {  // first reached in this block: poison it
    std::memset(run.arena + run.decl_offsets[n], 0xff, bytes);
    ++run.decls_this_block;
  }
  return run.arena + run.decl_offsets[n];
}

void* DynamicShared() { return Run().arena; }

}  // namespace deltaserve::kernels::simt
