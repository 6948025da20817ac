// The batch scheduler of one replica: a pure function of its queue, what the
// replica reported and the clock (the way vLLM's Scheduler.schedule() and
// update_from_output() are), with no threads, locks, network or model, so
// that it is tested alone with a fake clock and made-up results.
//
// Policy. Requests wait in arrival order for one of max_running places, with
// the MLA cache pages and the state slot they take (a fork of a running
// prefix may pass a prefix that waits, since that prefix holds its pages and
// slot until its forks start). Each
// step carries one decode token for the running sequences past their prompt
// (1/P of them on a P-stage pipeline, least recently served first and none of
// the last P - 1 steps' while others can go, so P steps of decoders are in
// the pipeline at once and none waits for another), then prefill chunks
// within a token budget and a time budget, each chunk cut by the cost model
// (runtime/scheduler/chunk_cost.h) so chunks shrink as a sequence's MLA
// prefix grows. The oldest prompt is promised a quarter of the budget and
// always gets some tokens, so a long prompt keeps moving under any load; the
// rest goes to the shortest remaining prompts first, so short requests are
// not stuck behind a million-token prefill. A step whose successor needs
// nothing from its result says more_coming, and up to one step per pipeline
// stage is in flight; a sequence whose next token is being sampled sits out,
// or, with decode_ahead, goes once more with the token fed by the replica
// (two steps per stage in flight then). A step sent ahead of a stop token's
// result samples one token too many, which is dropped.
//
// Prefix cache (prefix_cache_bytes > 0). A generation whose prompt begins
// with a prefix the replica already holds starts from that state instead of
// prefilling it again. The cache's entries are held prefixes (kPrefix
// sequences of the scheduler's own, ids from kCacheSequenceIds on), each the
// state after a whole number of kCachePageTokens-token pages from the
// sequence's start: at a page boundary every layer can be resumed, the MLA
// cache (its full pages, shared by reference) and each KDA layer's state and
// convolution tail (the slot, copied by the fork). One is made per request,
// for its prompt's last full page that leaves at least one token after it
// (the sparse set "the end of each prompt": a multi-turn chat's next turn
// finds the last one), computed as a fork of the longest entry it extends,
// and the request forks from it; so a miss costs the request one fork and
// one more step, a hit the prefix's prefill. A request that shares part of
// an entry's pages but not all (the same document, another question) also
// makes one at the last page they share, extended by its own: the next
// request sharing that part hits it. A request may also name its prompt's
// first tokens as a prefix others will share (cache_prefix): an entry is
// made at the last page within them as well, so the first question about a
// document leaves it for the rest. Entries are found by a hash of the
// tokens of their pages and checked token by token, within the request's
// cache namespace only: a request never starts from, extends or learns of
// an entry made for another namespace (the coordinator's: each principal
// its own, unless it shares them). Each account (the principal) may hold at
// most prefix_cache_account_bytes of entries; past it, its own least
// recently used entry goes first (but for the account ""). An entry costs a
// KDA slot and its own pages (those past the entry it extends); the cache
// holds at most prefix_cache_bytes of them, counted with page_bytes and
// slot_bytes, and evicts the least recently used entry that no request
// waits to fork from and no entry extends, for a new entry and whenever a
// waiting sequence does not fit for the entries' pages or slots. Eviction
// releases the entry's state; pages a running fork shares stay with it.
// Scoring and logits requests need every position's output and do not use
// the cache. The decisions are the scheduler's, so every rank of the
// replica follows them alike.
//
// Token-level endings happen here (stop token ids, max_tokens, the context);
// text-level ones (stop strings), cancellation and lost workers are the
// caller's, through Finish and Abandon (which hands back what to re-run). A finished sequence's
// state is released with the next step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/sampling.h"
#include "runtime/engine/step.h"
#include "runtime/model/config.h"
#include "runtime/model/state_pool.h"
#include "runtime/scheduler/chunk_cost.h"

namespace deltaserve {

struct SchedulerOptions {
  int64_t max_running = 64;   // sequences holding (or about to hold) state
  int64_t step_tokens = 512;  // token budget of one step
  int pipeline_stages = 1;    // of the replica: steps in flight, decode groups
  // A decoding sequence may have a second step in flight, sent before the
  // first one's result (SequenceWork::feed_sampled: the replica feeds the
  // token), and two steps per stage may be in flight: the round trip of a
  // result through the scheduler leaves the critical path of decoding. For a
  // replica behind a link (the coordinator's remote workers).
  bool decode_ahead = false;
  // Prefill chunks are cut by the cost model, or, when > 0, at most this many
  // tokens each (deltaserve generate/score --prefill-chunk).
  int64_t fixed_chunk = 0;
  // The replica's MLA cache in pages of kCachePageTokens (its ranks' pool,
  // runtime/model/state_pool.h); 0: not bounded here. A sequence starts only
  // when the pages of its whole length (prompt, plus max_tokens for a
  // generation) fit beside those reserved by the running ones, so none runs
  // out halfway; one that could never fit fails at once. A prefix's full
  // pages are reserved once for it and its forks (they share them) and
  // stay reserved until the last of them is gone.
  int64_t cache_pages = 0;
  // Sequences the replica's ranks hold state for at once (their pools' KDA
  // slots); 0: not bounded here. Every running sequence takes one, a held
  // prefix too; prefixes may hold all but one, so their forks always find
  // one.
  int64_t state_slots = 0;
  // The prefix cache (above): the bytes of state its entries may hold on a
  // rank, counted as page_bytes per MLA page and slot_bytes per KDA slot (a
  // rank's pool: StatePool::page_bytes, slot_bytes); 0: no cache.
  int64_t prefix_cache_bytes = 0;
  // Of that, what one account's entries may hold (0: all of it); the
  // account "" (a caller that tells no accounts apart) may hold all of it.
  int64_t prefix_cache_account_bytes = 0;
  int64_t page_bytes = 0;
  int64_t slot_bytes = 0;
};

// The ids of the prefix cache's own sequences start here; the caller's must
// be below.
inline constexpr uint64_t kCacheSequenceIds = uint64_t{1} << 62;

// What the prefix cache holds and has done.
struct PrefixCacheStats {
  int64_t entries = 0;        // held now (made or being made)
  int64_t bytes = 0;          // their cost, as the budget counts it
  int64_t lookups = 0;        // generations that looked
  int64_t hits = 0;           // of them, those that started from an entry
  int64_t cached_tokens = 0;  // prompt tokens the hits did not prefill
  int64_t evictions = 0;

  // Summed over caches (a coordinator's workers).
  PrefixCacheStats& operator+=(const PrefixCacheStats& o) {
    entries += o.entries;
    bytes += o.bytes;
    lookups += o.lookups;
    hits += o.hits;
    cached_tokens += o.cached_tokens;
    evictions += o.evictions;
    return *this;
  }
};

enum class SequenceKind {
  kGenerate,  // prefill the prompt, then sample up to max_tokens tokens
  kScore,     // the log-prob of every prompt token after the first
  kLogits,    // the logits of every prompt token
  kPrefix,    // prefill the prompt and hold its state for `forks` sequences
};

struct SequenceRequest {
  uint64_t id = 0;  // unique among the scheduler's sequences, below kCacheSequenceIds
  SequenceKind kind = SequenceKind::kGenerate;
  std::vector<int32_t> prompt;  // non-empty
  kernels::SamplingParams sampling;
  uint64_t seed = 0;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_ids;  // generation ends after one of these
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // kScore / kLogits: prompt tokens from this position on go one per step
  // (0: none), as decode steps would feed them.
  int64_t decode_from = 0;
  // Prefix reuse. A kPrefix sequence is prefilled once and its state held
  // until `forks` sequences have started from it (or left before starting);
  // then it is released. A sequence with fork_from starts as a copy of that
  // prefix's state (its prompt continues the prefix's tokens) in a step
  // after the prefix's last chunk; when the prefix is gone, it fails. A
  // prefilled prefix does not count towards max_running.
  int64_t forks = 0;
  std::optional<uint64_t> fork_from;
  // The prefix cache: the prompt's first tokens that later requests will
  // share (a document its questions follow); an entry is made at the last
  // page boundary within them too. 0: none named.
  int64_t cache_prefix = 0;
  // The cache namespace it looks in and makes entries in, and the account
  // its cache activity counts to (prefix_cache(account)).
  std::string cache_namespace;
  std::string cache_account;
};

enum class FinishReason { kLength, kStop, kContext };

struct SchedulerEvent {
  enum class Kind {
    kStarted,    // the sequence's first work went out
    kToken,      // a sampled token (output)
    kPiece,      // a scored piece: target log-probs or logits (output)
    kPrefilled,  // a kPrefix sequence's prompt is in (finished: released too)
    kProgress,   // a step with prompt tokens of the sequence has run (prefilled)
    kFailed,     // status says why; the sequence is gone
  };
  uint64_t id = 0;
  Kind kind = Kind::kToken;
  SequenceResult output;
  // kToken / kPiece: this was the sequence's last output; it is gone.
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  std::string stop;  // kStop by a token: "token N"
  absl::Status status;
  // kProgress: prompt tokens whose step has run, of the prompt's. Comes
  // before the same step's output event of the sequence.
  int64_t prefilled = 0, prompt_tokens = 0;
  // kStarted: prompt tokens the prefix cache supplied.
  int64_t cached_tokens = 0;
};

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;

  // `config` seeds the cost model; context length comes from it too.
  Scheduler(const ModelConfig& config, SchedulerOptions options);

  // Queues a sequence behind those waiting.
  void Add(SequenceRequest request);
  // Forgets a sequence (cancelled, ended by a stop string, ...); its state is
  // released with the next step. False when it is not here.
  bool Finish(uint64_t id);

  // Whether a step may go out now: nothing in flight and work to do, or the
  // window has room and the last step promised a successor (or, with
  // decode_ahead, a decoding sequence may go).
  bool CanSchedule() const;
  // The next step, with `events` receiving the deadlines that passed
  // (kFailed) and the sequences started. Empty when there is nothing to send
  // (only when nothing was promised).
  std::optional<Step> Schedule(Clock::time_point now, std::vector<SchedulerEvent>* events);

  // What one step did, for a step log: its prefill pieces (new tokens and
  // the prefix before them), how many decode rows rode along, its wall time
  // at the replica's leader and each stage's compute time.
  struct StepRecord {
    uint64_t step_id = 0;
    std::vector<StepPiece> prefill;
    int64_t decode_rows = 0;
    double wall_s = 0;
    std::vector<double> stage_compute_s;
  };
  struct Update {
    std::vector<SchedulerEvent> events;
    std::vector<StepRecord> records;  // one per step taken in, in step order
    int64_t prefill_tokens = 0;       // prompt tokens of the steps taken in
    double wall_s = 0;                // their wall time
    int64_t steps = 0;                // steps taken in
  };
  // Takes a step's result. Results are used in step order, whatever order
  // they come in; one for a step not in flight is ignored.
  Update TakeResult(StepResult result);
  // Whether a result from an untrusted worker matches the step it answers:
  // an output for each of that step's sequences that expects one (unless the
  // replica refused the step) and for no other, each once, with
  // the counts the step asked for (one token in the vocabulary per sampled
  // row; per scored token one target log-prob and its alternatives; no
  // logits unless asked). OK for a result of a step not in flight, which
  // TakeResult ignores. The error names the sequence and the count.
  absl::Status CheckResult(const StepResult& result) const;

  // The replica went away: every sequence leaves, in order, as a request to
  // run elsewhere. One that had not started is the request as given. A
  // generation that had continues: its prompt is the original prompt plus
  // the tokens sampled so far (whose results came in) and its max_tokens what
  // is left, so with position-keyed sampling (kernels::Rng::ForPosition) the
  // re-run samples what the lost replica would have. Scoring and logits start
  // over. Prefixes and their forks cannot move without the prefix's state:
  // they come back as `lost`.
  struct Abandoned {
    std::vector<SequenceRequest> rerun;
    std::vector<uint64_t> started;  // those of `rerun` the replica had begun
    std::vector<uint64_t> lost;
  };
  Abandoned Abandon();

  // Load and state.
  // Requests running and waiting (not the prefix cache's own sequences).
  int64_t running() const;
  int64_t waiting() const;
  // Sequences holding (or about to hold) state on the replica: the running
  // requests and the prefix cache's entries.
  int64_t held_sequences() const { return static_cast<int64_t>(running_.size()); }
  int64_t load() const { return running() + waiting(); }
  bool HasRoom() const { return load() < options_.max_running; }
  bool Idle() const;  // nothing waiting, running, in flight or to release
  int64_t in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  int64_t held_tokens() const;  // context of the sequences holding state
  int64_t reserved_pages() const { return reserved_pages_; }  // of options().cache_pages
  // What the replica said it holds after the last step taken in (sequences
  // and state bytes over its ranks; tokens as this scheduler counts them).
  const HeldState& held() const { return held_; }
  const ChunkCostModel& cost() const { return cost_; }
  // What the cost model expects step `step_id`, in flight, to take on the
  // replica's slowest stage (seconds); 0 when it is not in flight.
  double ExpectedSeconds(uint64_t step_id) const;
  const SchedulerOptions& options() const { return options_; }
  const PrefixCacheStats& prefix_cache() const { return cache_stats_; }
  // One account's part of it: its entries and its requests' lookups, hits
  // and the evictions of its entries.
  PrefixCacheStats prefix_cache(const std::string& account) const;
  // Drops every prefix cache entry that no request needs; their state is
  // released with the next step (so a replica left to another scheduler
  // holds none of this one's).
  void ClearPrefixCache();

 private:
  // Full pages of a held prefix, reserved once for it and every sequence
  // that shares them (its forks, and the cache entries that extend it),
  // released with the last of them.
  struct SharedPages {
    int64_t pages = 0;
    int64_t holders = 0;
  };
  struct Sequence {
    SequenceRequest request;
    size_t fed = 0;          // prompt tokens sent
    size_t prefilled = 0;    // prompt tokens whose step's result came back
    bool started = false;    // the replica holds (or will hold) its state
    int sampling = 0;        // steps in flight that sample its next token (0..2)
    uint64_t last_step = 0;  // the last step that carried work for it
    std::vector<int32_t> generated;
    size_t scored = 0;            // kScore / kLogits: prompt tokens whose output came back
    int64_t base = 0;             // tokens of the prefix it forked from
    uint64_t prefilled_step = 0;  // kPrefix: the step that carried its last chunk
    int64_t forks_left = 0;       // kPrefix: forks yet to start (or leave)
    int64_t pages = 0;            // MLA cache pages reserved for it alone while running
    // The full pages it shares: its own, for a prefix, and those of the
    // prefixes it continues, nearest last.
    std::vector<std::shared_ptr<SharedPages>> shared;
    // The prefix cache. An entry: every token from the sequence's start, the
    // request it was made for while it is made (its progress is that
    // request's), its cost, when it was last used, and the entries that
    // extend it. A request the cache serves: its prompt as given and the
    // tokens the cache supplied.
    bool cached = false;
    std::vector<int32_t> cache_tokens;
    std::vector<uint64_t> page_hashes;  // of its tokens' first 1, 2, ... pages
    uint64_t owner = 0;
    int64_t cost = 0;
    uint64_t last_used = 0;
    int64_t extensions = 0;
    std::vector<int32_t> full_prompt;
    int64_t from_cache = 0;
    bool start_reported = false;  // its kStarted went out (with its entry's first chunk)
    int64_t length() const { return base + static_cast<int64_t>(fed + generated.size()); }
    bool held_prefix() const { return request.kind == SequenceKind::kPrefix && !prompt_left(); }
    bool prompt_left() const { return fed < request.prompt.size(); }
    bool decoding() const { return !prompt_left() && !generated.empty(); }
  };
  using SequencePtr = std::shared_ptr<Sequence>;
  struct Item {
    SequencePtr sequence;
    StepPiece piece;
    WorkOutput output;
    bool prompt = false;      // a chunk of the prompt (not a decode token)
    bool last_piece = false;  // the prompt's last chunk
  };
  struct InFlight {
    uint64_t step_id = 0;
    std::vector<Item> items;
  };

  std::optional<Step> MakeStep(Clock::time_point now, std::vector<SchedulerEvent>* events);
  bool HasWork() const;
  bool PromptLeft() const;
  // Whether `s` may take a decode step now: its last token known, or with
  // decode_ahead, one step sampling it in flight whose token would not end
  // it by length or context.
  bool DecodeReady(const Sequence& s) const;
  bool AnyDecodeReady() const;
  bool DecodersOutside(const std::vector<Item>& items) const;
  int64_t PrefillsInFlight() const;  // steps in flight that carry prompt chunks
  void Drop(const Sequence& s);      // out of waiting / running; release if started
  SequencePtr Find(uint64_t id) const;
  int64_t Occupied() const;  // running sequences that count towards max_running
  // Tokens of a sequence's whole length: its prefix's, its prompt and, for
  // a generation, max_tokens (within the context).
  int64_t WholeLength(const Sequence& s) const;
  // The MLA cache pages `s` adds when it starts (0 without cache_pages): a
  // fork's excludes the full pages it shares with its prefix.
  int64_t PagesToAdmit(const Sequence& s) const;
  // Pages `s` needs alone, and whether the replica's cache could never hold
  // them (the sequence then fails at the next step).
  int64_t PagesAlone(const Sequence& s) const;
  bool NeverFits(const Sequence& s) const;
  // Whether `s` may start now: a place, its pages and a slot.
  bool Fits(const Sequence& s) const;
  // The waiting sequence to start next: the first one, when it fits; else,
  // when that one is a prefix, the first fork of a running prefix that fits
  // (null: none may start).
  SequencePtr NextToAdmit() const;
  bool CanAdmit() const;
  void Admit(const SequencePtr& s);  // waiting -> running, its pages reserved
  // A fork of `prefix` started or left; releases the prefix after the last.
  void ForkDone(uint64_t prefix);
  // Whether the fork `s` may start in step `step_id`; fails it (an event)
  // when its prefix is gone.
  bool ForkReady(const SequencePtr& s, uint64_t step_id, std::vector<SchedulerEvent>* events);
  void Process(const StepResult& result, const std::vector<Item>& items, Update* update);
  // Tokens of `s`'s prompt counted from its sequence's start: its prefix's
  // and its own.
  int64_t PromptFromStart(const Sequence& s) const;
  // The prefix cache: serves `s` (a generation being added) from it, making
  // its entry; evicts the least recently used entry that may go (false:
  // none); rewrites the events of the cache's own sequences as those of the
  // requests they are made for.
  void UseCache(const SequencePtr& s);
  // Of `account`'s entries when given.
  SequencePtr EvictionVictim(const std::string* account = nullptr) const;  // null: none may go
  // Whether the next in line waits while an entry could go for it.
  bool MayEvictToAdmit() const;
  bool EvictOne(const std::string* account = nullptr);
  void MapCacheEvents(std::vector<SchedulerEvent>* events, size_t from);
  std::optional<FinishReason> Ends(const Sequence& s, int32_t token, std::string* stop) const;

  const int64_t context_length_;
  const int64_t vocab_size_;
  const SchedulerOptions options_;
  ChunkCostModel cost_;
  uint64_t next_step_ = 1;
  std::deque<SequencePtr> waiting_;
  std::vector<SequencePtr> running_;
  std::vector<uint64_t> pending_release_;
  std::deque<InFlight> in_flight_;
  std::map<uint64_t, StepResult> early_;  // results ahead of their turn
  bool promised_ = false;
  HeldState held_;
  int64_t reserved_pages_ = 0;  // by the running sequences
  // The prefix cache's entries by the hash of their tokens.
  std::multimap<uint64_t, SequencePtr> cache_index_;
  PrefixCacheStats cache_stats_;
  std::map<std::string, PrefixCacheStats> account_stats_;  // by cache_account
  uint64_t next_cache_id_ = kCacheSequenceIds;
  uint64_t cache_clock_ = 0;
};

}  // namespace deltaserve
