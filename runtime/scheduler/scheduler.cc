#include "runtime/scheduler/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <span>

#include "absl/strings/str_cat.h"

namespace deltaserve {
namespace {

// The prefix cache's key: FNV-1a over the tokens, continued page by page.
constexpr uint64_t kHashSeed = 0xcbf29ce484222325ull;
uint64_t HashTokens(uint64_t h, std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

Scheduler::Scheduler(const ModelConfig& config, SchedulerOptions options)
    : context_length_(config.max_position_embeddings),
      vocab_size_(config.vocab_size),
      options_(options),
      cost_(config) {}

void Scheduler::Add(SequenceRequest request) {
  auto s = std::make_shared<Sequence>();
  s->request = std::move(request);
  // Sorted once here (Ends checks each sampled token by binary search).
  auto& stop_ids = s->request.stop_ids;
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  if (s->request.kind == SequenceKind::kPrefix) s->forks_left = s->request.forks;
  if (options_.prefix_cache_bytes > 0 && s->request.kind == SequenceKind::kGenerate &&
      !s->request.fork_from) {
    UseCache(s);
  }
  waiting_.push_back(std::move(s));
}

void Scheduler::UseCache(const SequencePtr& s) {
  SequenceRequest& r = s->request;
  // Pages an entry may cover: a token must be left to sample from.
  const int64_t pages = (static_cast<int64_t>(r.prompt.size()) - 1) / kCachePageTokens;
  if (pages <= 0) return;
  ++cache_stats_.lookups;
  PrefixCacheStats& account = account_stats_[r.cache_account];
  ++account.lookups;
  std::vector<uint64_t> hashes(pages);
  // The namespace leads the key: another namespace's entries hash apart
  // (and are told apart below when they collide).
  uint64_t h = kHashSeed;
  for (const char c : r.cache_namespace) {
    const int32_t byte = static_cast<unsigned char>(c);
    h = HashTokens(h, std::span<const int32_t>(&byte, 1));
  }
  for (int64_t k = 0; k < pages; ++k) {
    h = HashTokens(h, std::span(r.prompt).subspan(k * kCachePageTokens, kCachePageTokens));
    hashes[k] = h;
  }
  SequencePtr hit;
  int64_t hit_pages = 0;
  for (int64_t k = pages; k >= 1 && hit == nullptr; --k) {
    const size_t tokens = static_cast<size_t>(k * kCachePageTokens);
    auto [begin, end] = cache_index_.equal_range(hashes[k - 1]);
    for (auto it = begin; it != end; ++it) {
      const std::vector<int32_t>& t = it->second->cache_tokens;
      if (it->second->request.cache_namespace == r.cache_namespace && t.size() == tokens &&
          std::equal(t.begin(), t.end(), r.prompt.begin())) {
        hit = it->second;
        hit_pages = k;
        break;
      }
    }
  }
  // Entries to make, each extending the one before: at the last page this
  // prompt shares with an entry it does not fully contain (where requests
  // that share a document part, each with its own question, so the next one
  // hits), and at the prompt's last full page.
  int64_t shared_pages = hit_pages;
  for (const auto& [hash, e] : cache_index_) {
    if (e->request.cache_namespace != r.cache_namespace) continue;
    const int64_t limit = std::min<int64_t>(pages, e->page_hashes.size());
    int64_t k = 0;
    while (k < limit && e->page_hashes[k] == hashes[k]) ++k;
    if (k > shared_pages && std::equal(r.prompt.begin(), r.prompt.begin() + k * kCachePageTokens,
                                       e->cache_tokens.begin())) {
      shared_pages = k;
    }
  }
  // And at the last page of the prefix the request names as shared.
  const int64_t named_pages = std::min(r.cache_prefix / kCachePageTokens, pages);
  SequencePtr from = hit;
  int64_t from_pages = hit_pages;
  for (const int64_t end :
       {std::min(shared_pages, named_pages), std::max(shared_pages, named_pages), pages}) {
    if (end <= from_pages) continue;
    const int64_t cost = options_.slot_bytes + (end - from_pages) * options_.page_bytes;
    if (from != nullptr) ++from->forks_left;  // not evicted for its own extension
    const int64_t account_limit =
        !r.cache_account.empty() && options_.prefix_cache_account_bytes > 0
            ? options_.prefix_cache_account_bytes
            : options_.prefix_cache_bytes;
    while (account.bytes + cost > account_limit && EvictOne(&r.cache_account)) {
    }
    while (cache_stats_.bytes + cost > options_.prefix_cache_bytes && EvictOne()) {
    }
    if (from != nullptr) --from->forks_left;
    if (cache_stats_.bytes + cost > options_.prefix_cache_bytes ||
        account.bytes + cost > account_limit) {
      break;
    }
    auto c = std::make_shared<Sequence>();
    c->request.id = next_cache_id_++;
    c->request.kind = SequenceKind::kPrefix;
    c->request.cache_namespace = r.cache_namespace;
    c->request.cache_account = r.cache_account;
    c->request.prompt.assign(r.prompt.begin() + from_pages * kCachePageTokens,
                             r.prompt.begin() + end * kCachePageTokens);
    if (from != nullptr) {
      c->request.fork_from = from->request.id;
      ++from->forks_left;
      ++from->extensions;
    }
    c->cached = true;
    c->cache_tokens.assign(r.prompt.begin(), r.prompt.begin() + end * kCachePageTokens);
    c->page_hashes.assign(hashes.begin(), hashes.begin() + end);
    c->owner = r.id;
    c->cost = cost;
    cache_index_.emplace(hashes[end - 1], c);
    ++cache_stats_.entries;
    cache_stats_.bytes += cost;
    ++account.entries;
    account.bytes += cost;
    waiting_.push_back(c);
    from = c;
    from_pages = end;
  }
  if (from == nullptr) return;
  if (hit != nullptr) {
    ++cache_stats_.hits;
    cache_stats_.cached_tokens += hit_pages * kCachePageTokens;
    ++account.hits;
    account.cached_tokens += hit_pages * kCachePageTokens;
  }
  // Most recently used: the entry and every entry it extends.
  for (SequencePtr e = from; e != nullptr;
       e = e->request.fork_from ? Find(*e->request.fork_from) : nullptr) {
    e->last_used = ++cache_clock_;
  }
  s->full_prompt = r.prompt;
  s->from_cache = hit_pages * kCachePageTokens;
  r.prompt.erase(r.prompt.begin(),
                 r.prompt.begin() + static_cast<int64_t>(from->cache_tokens.size()));
  r.fork_from = from->request.id;
  ++from->forks_left;
}

PrefixCacheStats Scheduler::prefix_cache(const std::string& account) const {
  const auto it = account_stats_.find(account);
  return it == account_stats_.end() ? PrefixCacheStats{} : it->second;
}

Scheduler::SequencePtr Scheduler::EvictionVictim(const std::string* account) const {
  SequencePtr victim;
  for (const auto& [hash, e] : cache_index_) {
    if (e->prompt_left() || e->forks_left > 0 || e->extensions > 0) continue;
    if (account != nullptr && e->request.cache_account != *account) continue;
    if (victim == nullptr || e->last_used < victim->last_used) victim = e;
  }
  return victim;
}

bool Scheduler::MayEvictToAdmit() const {
  return !waiting_.empty() && Occupied() < options_.max_running && EvictionVictim() != nullptr;
}

bool Scheduler::EvictOne(const std::string* account) {
  const SequencePtr victim = EvictionVictim(account);
  if (victim == nullptr) return false;
  ++cache_stats_.evictions;
  ++account_stats_[victim->request.cache_account].evictions;
  Drop(*victim);
  return true;
}

void Scheduler::ClearPrefixCache() {
  while (const SequencePtr entry = EvictionVictim()) Drop(*entry);
}

void Scheduler::MapCacheEvents(std::vector<SchedulerEvent>* events, size_t from) {
  if (options_.prefix_cache_bytes <= 0) return;
  size_t kept = from;
  for (size_t i = from; i < events->size(); ++i) {
    SchedulerEvent& e = (*events)[i];
    bool keep = true;
    if (e.id >= kCacheSequenceIds) {
      // An entry's first chunk starts the request it is made for, and its
      // prefill is that request's; nothing else of it goes out.
      const SequencePtr entry = Find(e.id);
      const SequencePtr owner = entry != nullptr ? Find(entry->owner) : nullptr;
      keep = false;
      if (owner != nullptr && !owner->started) {
        if (e.kind == SchedulerEvent::Kind::kStarted && !owner->start_reported) {
          e.id = owner->request.id;
          e.cached_tokens = owner->from_cache;
          owner->start_reported = true;
          keep = true;
        } else if (e.kind == SchedulerEvent::Kind::kProgress) {
          e.id = owner->request.id;
          e.prefilled += entry->base;
          e.prompt_tokens = static_cast<int64_t>(owner->full_prompt.size());
          keep = true;
        }
      }
    } else if (const SequencePtr s = Find(e.id); s != nullptr && !s->full_prompt.empty()) {
      // A request the cache serves: its prompt counts from its start.
      if (e.kind == SchedulerEvent::Kind::kStarted) {
        keep = !s->start_reported;
        s->start_reported = true;
        e.cached_tokens = s->from_cache;
      } else if (e.kind == SchedulerEvent::Kind::kProgress) {
        e.prefilled += s->base;
        e.prompt_tokens = static_cast<int64_t>(s->full_prompt.size());
      }
    }
    if (!keep) continue;
    if (kept != i) (*events)[kept] = std::move(e);
    ++kept;
  }
  events->resize(kept);
}

void Scheduler::Drop(const Sequence& s) {
  auto erase = [&](auto& list) {
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const SequencePtr& p) { return p.get() == &s; }),
               list.end());
  };
  if (s.started) pending_release_.push_back(s.request.id);
  reserved_pages_ -= s.pages;
  for (const std::shared_ptr<SharedPages>& shared : s.shared) {
    if (--shared->holders == 0) reserved_pages_ -= shared->pages;
  }
  const std::optional<uint64_t> prefix = s.started ? std::nullopt : s.request.fork_from;
  if (s.cached) {
    for (auto it = cache_index_.begin(); it != cache_index_.end(); ++it) {
      if (it->second.get() != &s) continue;
      cache_index_.erase(it);
      --cache_stats_.entries;
      cache_stats_.bytes -= s.cost;
      PrefixCacheStats& account = account_stats_[s.request.cache_account];
      --account.entries;
      account.bytes -= s.cost;
      break;
    }
    if (s.request.fork_from) {
      if (const SequencePtr extended = Find(*s.request.fork_from)) --extended->extensions;
    }
  }
  erase(waiting_);
  erase(running_);
  if (prefix) ForkDone(*prefix);  // a fork that leaves before it starts
}

Scheduler::SequencePtr Scheduler::Find(uint64_t id) const {
  for (const SequencePtr& s : running_) {
    if (s->request.id == id) return s;
  }
  for (const SequencePtr& s : waiting_) {
    if (s->request.id == id) return s;
  }
  return nullptr;
}

int64_t Scheduler::PromptFromStart(const Sequence& s) const {
  if (s.cached) return static_cast<int64_t>(s.cache_tokens.size());
  int64_t tokens = static_cast<int64_t>(s.request.prompt.size());
  if (s.request.fork_from) {
    if (const SequencePtr prefix = Find(*s.request.fork_from)) tokens += PromptFromStart(*prefix);
  }
  return tokens;
}

int64_t Scheduler::WholeLength(const Sequence& s) const {
  const SequenceRequest& r = s.request;
  int64_t tokens = PromptFromStart(s);
  // The last sampled token is never fed, so a generation holds at most
  // prompt + max_tokens - 1 tokens; one more covers a step sent ahead.
  if (r.kind == SequenceKind::kGenerate) tokens += std::clamp<int64_t>(r.max_tokens, 0, INT32_MAX);
  if (context_length_ > 0) tokens = std::min(tokens, context_length_);
  return tokens;
}

int64_t Scheduler::PagesToAdmit(const Sequence& s) const {
  if (options_.cache_pages <= 0) return 0;
  const int64_t pages = CachePagesFor(WholeLength(s));
  if (!s.request.fork_from) return pages;
  const SequencePtr prefix = Find(*s.request.fork_from);
  int64_t shared = 0;
  if (prefix != nullptr) {
    for (const std::shared_ptr<SharedPages>& p : prefix->shared) shared += p->pages;
  }
  return pages - shared;
}

int64_t Scheduler::PagesAlone(const Sequence& s) const {
  // A fork may need its prefix's partly filled page beside its own.
  return CachePagesFor(WholeLength(s)) + (s.request.fork_from ? 1 : 0);
}

bool Scheduler::NeverFits(const Sequence& s) const {
  return options_.cache_pages > 0 && PagesAlone(s) > options_.cache_pages;
}

bool Scheduler::Fits(const Sequence& s) const {
  if (Occupied() >= options_.max_running) return false;
  if (options_.cache_pages > 0 && reserved_pages_ + PagesToAdmit(s) > options_.cache_pages) {
    return false;
  }
  if (options_.state_slots <= 0) return true;
  const int64_t held = static_cast<int64_t>(running_.size());
  if (held >= options_.state_slots) return false;
  if (s.request.kind != SequenceKind::kPrefix) return true;
  const int64_t prefixes =
      std::count_if(running_.begin(), running_.end(),
                    [](const SequencePtr& r) { return r->request.kind == SequenceKind::kPrefix; });
  return prefixes + 1 < options_.state_slots;
}

Scheduler::SequencePtr Scheduler::NextToAdmit() const {
  if (waiting_.empty()) return nullptr;
  const SequencePtr& front = waiting_.front();
  if (Fits(*front)) return front;
  if (front->request.kind != SequenceKind::kPrefix) return nullptr;
  // A prefix that must wait (for pages or a slot) goes on waiting, but not in
  // front of the forks of prefixes already running: those prefixes hold their
  // pages and slots until their forks start, so the first fork that fits goes
  // ahead.
  for (const SequencePtr& s : waiting_) {
    if (!s->request.fork_from || !Fits(*s)) continue;
    const SequencePtr prefix = Find(*s->request.fork_from);
    if (prefix != nullptr &&
        std::find(running_.begin(), running_.end(), prefix) != running_.end()) {
      return s;
    }
  }
  return nullptr;
}

bool Scheduler::CanAdmit() const { return NextToAdmit() != nullptr; }

void Scheduler::Admit(const SequencePtr& s) {
  if (options_.cache_pages > 0) {
    s->pages = PagesToAdmit(*s);
    reserved_pages_ += s->pages;
    const SequenceRequest& r = s->request;
    if (r.fork_from) {
      if (const SequencePtr prefix = Find(*r.fork_from)) {
        s->shared = prefix->shared;
        for (const std::shared_ptr<SharedPages>& shared : s->shared) ++shared->holders;
      }
    }
    if (r.kind == SequenceKind::kPrefix) {
      // Its own full pages are shared with its forks: reserved once for all.
      // (A prefix that extends another starts at a page boundary.)
      auto own = std::make_shared<SharedPages>();
      own->pages = static_cast<int64_t>(r.prompt.size()) / kCachePageTokens;
      own->holders = 1;
      s->pages -= own->pages;
      s->shared.push_back(std::move(own));
    }
  }
  running_.push_back(s);
}

int64_t Scheduler::Occupied() const {
  return std::count_if(running_.begin(), running_.end(),
                       [](const SequencePtr& s) { return !s->held_prefix(); });
}

void Scheduler::ForkDone(uint64_t prefix) {
  const SequencePtr p = Find(prefix);
  if (p == nullptr || p->request.kind != SequenceKind::kPrefix) return;
  if (--p->forks_left > 0) return;
  // A cache entry stays once made; one left unmade by every request that
  // waited for it goes.
  if (p->cached ? p->prompt_left() : !p->prompt_left()) Drop(*p);
}

bool Scheduler::ForkReady(const SequencePtr& s, uint64_t step_id,
                          std::vector<SchedulerEvent>* events) {
  const SequencePtr p = Find(*s->request.fork_from);
  if (p == nullptr || p->request.kind != SequenceKind::kPrefix) {
    SchedulerEvent e;
    e.id = s->request.id;
    e.kind = SchedulerEvent::Kind::kFailed;
    e.status = absl::FailedPreconditionError(
        absl::StrCat("the prefix it forks from (sequence ", *s->request.fork_from, ") is gone"));
    events->push_back(std::move(e));
    Drop(*s);
    return false;
  }
  // Its state is whole once the step with its last chunk has gone out.
  return !p->prompt_left() && p->prefilled_step < step_id;
}

bool Scheduler::Finish(uint64_t id) {
  const SequencePtr found = Find(id);
  if (found == nullptr) return false;
  Drop(*found);
  return true;
}

int64_t Scheduler::running() const {
  return std::count_if(running_.begin(), running_.end(),
                       [](const SequencePtr& s) { return !s->cached; });
}

int64_t Scheduler::waiting() const {
  return std::count_if(waiting_.begin(), waiting_.end(),
                       [](const SequencePtr& s) { return !s->cached; });
}

bool Scheduler::HasWork() const {
  const bool live = std::any_of(running_.begin(), running_.end(), [](const SequencePtr& s) {
    return !s->cached || s->prompt_left();
  });
  return !pending_release_.empty() || live || CanAdmit() || MayEvictToAdmit() ||
         std::any_of(waiting_.begin(), waiting_.end(),
                     [&](const SequencePtr& s) { return NeverFits(*s); });
}

bool Scheduler::Idle() const {
  return waiting() == 0 && running() == 0 && in_flight_.empty() && pending_release_.empty();
}

bool Scheduler::CanSchedule() const {
  if (in_flight_.empty()) return HasWork();
  const int64_t stages = std::max(1, options_.pipeline_stages);
  const bool ahead = options_.decode_ahead && AnyDecodeReady();
  if (in_flight() < stages) return promised_ || ahead;
  // Past one step per stage, steps carrying prompt chunks stay one per stage
  // (deeper, they would hold back a new request's first chunk), and decode
  // steps go ahead beside them; a prompt is never starved by decoding.
  if (in_flight() >= 2 * stages) return false;
  return ahead || (PromptLeft() && PrefillsInFlight() < stages);
}

int64_t Scheduler::PrefillsInFlight() const {
  return std::count_if(in_flight_.begin(), in_flight_.end(), [](const InFlight& f) {
    return std::any_of(f.items.begin(), f.items.end(), [](const Item& i) { return i.prompt; });
  });
}

bool Scheduler::PromptLeft() const {
  if (CanAdmit()) return true;
  return std::any_of(running_.begin(), running_.end(),
                     [](const SequencePtr& s) { return s->prompt_left(); });
}

bool Scheduler::DecodeReady(const Sequence& s) const {
  if (!s.decoding()) return false;
  if (s.sampling == 0) return true;
  // Ends() after the token in flight, were it no stop token.
  const int64_t generated = static_cast<int64_t>(s.generated.size()) + 1;
  return options_.decode_ahead && s.sampling == 1 && generated < s.request.max_tokens &&
         (context_length_ <= 0 || s.length() + 2 <= context_length_);
}

bool Scheduler::AnyDecodeReady() const {
  return std::any_of(running_.begin(), running_.end(),
                     [&](const SequencePtr& s) { return DecodeReady(*s); });
}

bool Scheduler::DecodersOutside(const std::vector<Item>& items) const {
  return std::any_of(running_.begin(), running_.end(), [&](const SequencePtr& s) {
    return s->decoding() &&
           std::none_of(items.begin(), items.end(), [&](const Item& i) { return i.sequence == s; });
  });
}

int64_t Scheduler::held_tokens() const {
  int64_t tokens = 0;
  for (const SequencePtr& s : running_) tokens += s->started ? s->length() : 0;
  return tokens;
}

std::optional<Step> Scheduler::Schedule(Clock::time_point now,
                                        std::vector<SchedulerEvent>* events) {
  const size_t first_event = events->size();
  std::optional<Step> step = MakeStep(now, events);
  MapCacheEvents(events, first_event);
  return step;
}

std::optional<Step> Scheduler::MakeStep(Clock::time_point now,
                                        std::vector<SchedulerEvent>* events) {
  // Deadlines first: a request past its deadline ends before it costs more.
  std::vector<SequencePtr> live(waiting_.begin(), waiting_.end());
  live.insert(live.end(), running_.begin(), running_.end());
  for (const SequencePtr& s : live) {
    if (s->request.deadline && now >= *s->request.deadline) {
      SchedulerEvent e;
      e.id = s->request.id;
      e.kind = SchedulerEvent::Kind::kFailed;
      e.status = absl::DeadlineExceededError("the request's deadline passed");
      events->push_back(std::move(e));
      Drop(*s);
    }
  }
  // A sequence the replica's MLA cache could never hold fails now, before it
  // starts; the others start in arrival order as places and pages allow.
  if (options_.cache_pages > 0) {
    const std::vector<SequencePtr> queued(waiting_.begin(), waiting_.end());
    for (const SequencePtr& s : queued) {
      if (!NeverFits(*s)) continue;
      const int64_t pages = PagesAlone(*s);
      SchedulerEvent e;
      e.id = s->request.id;
      e.kind = SchedulerEvent::Kind::kFailed;
      e.status = absl::ResourceExhaustedError(
          absl::StrCat("the request needs ", pages, " MLA cache pages of ", kCachePageTokens,
                       " tokens for its prompt and max_tokens, more than the replica's ",
                       options_.cache_pages, " (--kv-cache-tokens)"));
      events->push_back(std::move(e));
      Drop(*s);
    }
  }
  // The next in line may wait for the pages or slots of cache entries, which
  // then go, least recently used first.
  do {
    while (const SequencePtr s = NextToAdmit()) {
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s));
      Admit(s);
    }
  } while (MayEvictToAdmit() && EvictOne());

  Step step;
  step.id = next_step_++;
  step.release = std::move(pending_release_);
  pending_release_.clear();
  InFlight flight;
  flight.step_id = step.id;

  int64_t budget_tokens = options_.step_tokens;
  double budget_s = cost_.Cost(options_.step_tokens, 0);
  auto add = [&](const SequencePtr& s, std::span<const int32_t> tokens, WorkOutput output) {
    const SequenceRequest& r = s->request;
    SequenceWork w;
    w.sequence_id = r.id;
    w.start = !s->started;
    if (!s->started && r.fork_from) {
      w.fork_from = r.fork_from;
      s->base = Find(*r.fork_from)->length();
      ForkDone(*r.fork_from);
    }
    w.tokens.assign(tokens.begin(), tokens.end());
    w.feed_sampled = tokens.empty();
    w.output = output;
    w.sampling = r.sampling;
    w.seed = r.seed;
    w.logprobs = r.logprobs;
    w.top_logprobs = r.top_logprobs;
    if (output == WorkOutput::kScore) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        const size_t next = s->fed + i + 1;
        w.targets.push_back(next < r.prompt.size() ? r.prompt[next] : -1);
      }
    }
    step.work.push_back(std::move(w));
    const StepPiece piece{std::max<int64_t>(static_cast<int64_t>(tokens.size()), 1),
                          s->length() + s->sampling};
    budget_tokens -= piece.tokens;
    budget_s -= cost_.Cost(piece.tokens, piece.prefix);
    flight.items.push_back({s, piece, output});
    if (!s->started) {
      SchedulerEvent e;
      e.id = r.id;
      e.kind = SchedulerEvent::Kind::kStarted;
      events->push_back(std::move(e));
    }
    s->started = true;
    s->last_step = step.id;
    if (output == WorkOutput::kSample) ++s->sampling;
  };

  // Decode: one token for each sequence past its prompt whose last token is
  // known (or, ahead, being sampled), 1/P of them per step, least recently
  // served first.
  std::vector<SequencePtr> decoders, ready;
  for (const SequencePtr& s : running_) {
    if (!s->decoding()) continue;
    decoders.push_back(s);
    if (DecodeReady(*s)) ready.push_back(s);
  }
  const size_t stages = std::max(1, options_.pipeline_stages);
  const size_t per_step = (decoders.size() + stages - 1) / stages;
  std::stable_sort(ready.begin(), ready.end(), [](const SequencePtr& x, const SequencePtr& y) {
    return x->last_step < y->last_step;
  });
  // On a pipeline, a sequence of the last P - 1 steps sits out while others
  // can go. Sent again at once, its step would wait at the first stage for
  // the earlier one's token to come through every stage, and the stages
  // would take turns instead of overlapping; picked only to fill the 1/P,
  // such a sequence used to tie two groups together for good.
  const auto recent = [&](const SequencePtr& s) { return s->last_step + stages > step.id; };
  if (!std::all_of(ready.begin(), ready.end(), recent)) {
    ready.erase(std::remove_if(ready.begin(), ready.end(), recent), ready.end());
  }
  if (ready.size() > per_step) ready.resize(per_step);
  for (const SequencePtr& s : ready) {
    // Ahead: no token; the replica feeds the one the step in flight samples.
    add(s, s->sampling > 0 ? std::span<const int32_t>() : std::span(&s->generated.back(), 1),
        WorkOutput::kSample);
  }

  // Prefill: the oldest prompt keeps a quarter of the budget; the rest goes
  // shortest remaining prompt first; what is left returns to the oldest. At
  // most one step per stage in flight carries prompt chunks (CanSchedule).
  std::vector<SequencePtr> prefills;
  const bool decode_only = PrefillsInFlight() >= std::max(1, options_.pipeline_stages);
  const std::vector<SequencePtr> candidates =
      decode_only ? std::vector<SequencePtr>() : running_;  // ForkReady may drop some
  for (const SequencePtr& s : candidates) {
    if (!s->prompt_left()) continue;
    if (!s->started && s->request.fork_from && !ForkReady(s, step.id, events)) continue;
    prefills.push_back(s);
  }
  auto prefill = [&](const SequencePtr& s, int64_t max_tokens, double max_s) {
    const SequenceRequest& r = s->request;
    const int64_t remaining = static_cast<int64_t>(r.prompt.size() - s->fed);
    int64_t cap = std::min(remaining, std::max<int64_t>(max_tokens, 1));
    if (r.decode_from > 0) {  // prefill up to decode_from, then a token per step
      cap = s->length() < r.decode_from ? std::min(cap, r.decode_from - s->length()) : 1;
    }
    const int64_t n = options_.fixed_chunk > 0
                          ? std::min(cap, options_.fixed_chunk)
                          : cost_.ChunkFor(s->length(), std::max(max_s, 0.0), cap);
    const WorkOutput output = r.kind == SequenceKind::kScore    ? WorkOutput::kScore
                              : r.kind == SequenceKind::kLogits ? WorkOutput::kLogits
                              : r.kind == SequenceKind::kPrefix ? WorkOutput::kNone
                              : n == remaining                  ? WorkOutput::kSample
                                                                : WorkOutput::kNone;
    add(s, std::span(r.prompt).subspan(s->fed, n), output);
    flight.items.back().prompt = true;
    s->fed += n;
    if (!s->prompt_left()) {
      flight.items.back().last_piece = true;
      s->prefilled_step = step.id;
    }
  };
  if (!prefills.empty()) {
    const SequencePtr oldest = prefills.front();
    std::stable_sort(prefills.begin() + 1, prefills.end(),
                     [](const SequencePtr& x, const SequencePtr& y) {
                       return x->request.prompt.size() - x->fed < y->request.prompt.size() - y->fed;
                     });
    const int64_t reserve_tokens = std::max<int64_t>(budget_tokens / 4, 1);
    const double reserve_s = std::max(budget_s / 4, 0.0);
    for (size_t i = 1; i < prefills.size(); ++i) {
      if (budget_tokens - reserve_tokens <= 0 || budget_s - reserve_s <= 0) break;
      prefill(prefills[i], budget_tokens - reserve_tokens, budget_s - reserve_s);
    }
    prefill(oldest, budget_tokens, budget_s);
  }

  if (step.work.empty() && step.release.empty() && !promised_) {
    --next_step_;
    return std::nullopt;
  }
  // Promise a successor when the next step has work that needs nothing from
  // this one: prompt left to prefill, decoding sequences not in this step,
  // or, with decode_ahead, ones that may go again at once.
  promised_ = (options_.pipeline_stages > 1 || options_.decode_ahead) &&
              (PromptLeft() || DecodersOutside(flight.items) ||
               (options_.decode_ahead && AnyDecodeReady()));
  step.more_coming = promised_;
  in_flight_.push_back(std::move(flight));
  return step;
}

std::optional<FinishReason> Scheduler::Ends(const Sequence& s, int32_t token,
                                            std::string* stop) const {
  const auto& ids = s.request.stop_ids;
  if (std::binary_search(ids.begin(), ids.end(), token)) {
    *stop = absl::StrCat("token ", token);
    return FinishReason::kStop;
  }
  if (static_cast<int64_t>(s.generated.size()) >= s.request.max_tokens) {
    return FinishReason::kLength;
  }
  if (context_length_ > 0 && s.length() + 1 > context_length_) return FinishReason::kContext;
  return std::nullopt;
}

double Scheduler::ExpectedSeconds(uint64_t step_id) const {
  for (const InFlight& f : in_flight_) {
    if (f.step_id != step_id) continue;
    std::vector<StepPiece> pieces;
    for (const Item& item : f.items) pieces.push_back(item.piece);
    return cost_.Cost(pieces);
  }
  return 0;
}

Scheduler::Update Scheduler::TakeResult(StepResult result) {
  Update update;
  const bool expected = std::any_of(in_flight_.begin(), in_flight_.end(),
                                    [&](const InFlight& f) { return f.step_id == result.step_id; });
  if (!expected) return update;
  early_[result.step_id] = std::move(result);
  while (!in_flight_.empty() && early_.contains(in_flight_.front().step_id)) {
    auto node = early_.extract(in_flight_.front().step_id);
    InFlight flight = std::move(in_flight_.front());
    in_flight_.pop_front();
    Process(node.mapped(), flight.items, &update);
  }
  MapCacheEvents(&update.events, 0);
  return update;
}

absl::Status Scheduler::CheckResult(const StepResult& result) const {
  auto flight = std::find_if(in_flight_.begin(), in_flight_.end(),
                             [&](const InFlight& f) { return f.step_id == result.step_id; });
  if (flight == in_flight_.end()) return absl::OkStatus();
  std::map<uint64_t, const Item*> expected;
  for (const Item& item : flight->items) {
    if (item.output != WorkOutput::kNone) expected[item.sequence->request.id] = &item;
  }
  std::set<uint64_t> seen;
  for (const SequenceResult& out : result.outputs) {
    const std::string where = absl::StrCat("step ", result.step_id, ", sequence ", out.sequence_id);
    auto it = expected.find(out.sequence_id);
    if (it == expected.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": an output the step did not ask for"));
    }
    if (!seen.insert(out.sequence_id).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a second output"));
    }
    const Item& item = *it->second;
    const SequenceRequest& r = item.sequence->request;
    const auto mismatch = [&](const char* what, size_t got, int64_t want) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", got, " ", what, " where the step asked for ", want));
    };
    const int64_t top = std::min<int64_t>(r.top_logprobs, vocab_size_);
    const bool failed = !out.error.empty();  // a failed sequence's outputs are empty
    if (item.output == WorkOutput::kSample) {
      if (!failed && (out.token < 0 || out.token >= vocab_size_)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": sampled token ", out.token, " outside the vocabulary"));
      }
      const int64_t want_top = failed || !(r.logprobs || r.top_logprobs > 0) ? 0 : top;
      if (static_cast<int64_t>(out.top_ids.size()) != want_top) {
        return mismatch("top ids", out.top_ids.size(), want_top);
      }
      if (!out.target_logprobs.empty()) {
        return mismatch("target log-probs", out.target_logprobs.size(), 0);
      }
    } else if (item.output == WorkOutput::kScore) {
      const int64_t rows = failed ? 0 : item.piece.tokens;
      if (static_cast<int64_t>(out.target_logprobs.size()) != rows) {
        return mismatch("target log-probs", out.target_logprobs.size(), rows);
      }
      if (static_cast<int64_t>(out.top_ids.size()) != rows * top) {
        return mismatch("top ids", out.top_ids.size(), rows * top);
      }
    }
    if (item.output != WorkOutput::kLogits && !out.logits.empty()) {
      return mismatch("logits", out.logits.size(), 0);
    }
  }
  if (result.error.empty()) {
    for (const auto& [id, item] : expected) {
      if (!seen.contains(id)) {
        return absl::InvalidArgumentError(absl::StrCat("step ", result.step_id, ", sequence ", id,
                                                       ": no output where the step asked for one"));
      }
    }
  }
  return absl::OkStatus();
}

void Scheduler::Process(const StepResult& result, const std::vector<Item>& items, Update* update) {
  ++update->steps;
  held_ = {result.live_sequences, result.kda_state_bytes, result.mla_cache_bytes, held_tokens()};
  for (const Item& item : items) {
    if (item.output == WorkOutput::kSample) --item.sequence->sampling;
  }
  auto gone = [&](const Sequence& s) {
    return std::none_of(running_.begin(), running_.end(),
                        [&](const SequencePtr& p) { return p.get() == &s; });
  };
  auto fail = [&](const SequencePtr& s, absl::Status status) {
    SchedulerEvent e;
    e.id = s->request.id;
    e.kind = SchedulerEvent::Kind::kFailed;
    e.status = std::move(status);
    update->events.push_back(std::move(e));
    Drop(*s);
  };
  if (!result.error.empty()) {
    // The replica refused the step and advanced nothing: its sequences end.
    const absl::Status status =
        absl::InternalError(absl::StrCat("the step was refused: ", result.error));
    for (const Item& item : items) {
      if (!gone(*item.sequence)) fail(item.sequence, status);
    }
    return;
  }
  std::vector<StepPiece> pieces;
  int64_t prefill_tokens = 0;
  StepRecord record;
  record.step_id = result.step_id;
  record.wall_s = result.wall_s;
  record.stage_compute_s = result.stage_compute_s;
  for (const Item& item : items) {
    pieces.push_back(item.piece);
    if (item.prompt) {
      prefill_tokens += item.piece.tokens;
      record.prefill.push_back(item.piece);
    } else {
      record.decode_rows += item.piece.tokens;
    }
  }
  update->records.push_back(std::move(record));
  // The cost model learns from the slowest stage's compute time: that is
  // what bounds a step in a pipeline, and it leaves out time a stage spent
  // waiting for its neighbours. The wall time stands in when there is none.
  double stage_s = 0;
  for (double t : result.stage_compute_s) stage_s = std::max(stage_s, t);
  cost_.Observe(pieces, stage_s > 0 ? stage_s : result.wall_s);
  update->prefill_tokens += prefill_tokens;
  update->wall_s += result.wall_s;

  std::map<uint64_t, const SequenceResult*> outputs;
  for (const SequenceResult& out : result.outputs) outputs[out.sequence_id] = &out;
  for (const Item& item : items) {
    const SequencePtr& s = item.sequence;
    if (gone(*s)) continue;  // finished or cancelled while the step ran
    if (item.prompt) {
      s->prefilled += static_cast<size_t>(item.piece.tokens);
      SchedulerEvent e;
      e.id = s->request.id;
      e.kind = SchedulerEvent::Kind::kProgress;
      e.prefilled = static_cast<int64_t>(s->prefilled);
      e.prompt_tokens = static_cast<int64_t>(s->request.prompt.size());
      update->events.push_back(std::move(e));
    }
    if (item.last_piece && s->request.kind == SequenceKind::kPrefix) {
      SchedulerEvent e;
      e.id = s->request.id;
      e.kind = SchedulerEvent::Kind::kPrefilled;
      e.finished = !s->cached && s->forks_left <= 0;
      if (e.finished) Drop(*s);
      update->events.push_back(std::move(e));
    }
    if (item.output == WorkOutput::kNone) continue;
    auto it = outputs.find(s->request.id);
    if (it == outputs.end()) {
      fail(s, absl::InternalError("the worker's step result lacks this sequence"));
      continue;
    }
    if (!it->second->error.empty()) {
      fail(s, absl::InternalError(it->second->error));
      continue;
    }
    SchedulerEvent e;
    e.id = s->request.id;
    e.output = *it->second;
    if (item.output == WorkOutput::kSample) {
      e.kind = SchedulerEvent::Kind::kToken;
      s->generated.push_back(e.output.token);
      if (auto reason = Ends(*s, e.output.token, &e.stop)) {
        e.finished = true;
        e.reason = *reason;
      }
    } else {
      e.kind = SchedulerEvent::Kind::kPiece;
      // Done when every piece's result is in (later pieces may have been
      // sent already, with steps in flight).
      s->scored += static_cast<size_t>(item.piece.tokens);
      e.finished = s->scored == s->request.prompt.size();
    }
    if (e.finished) Drop(*s);
    update->events.push_back(std::move(e));
  }
}

Scheduler::Abandoned Scheduler::Abandon() {
  Abandoned out;
  auto leave = [&](const SequencePtr& s) {
    SequenceRequest& r = s->request;
    if (s->cached) return;  // the cache's own: gone with the replica's state
    const bool started = s->started || s->fed > 0;
    if (!s->full_prompt.empty()) {
      // Served from the cache: the request as given, without the prefix.
      r.prompt = s->full_prompt;
      r.fork_from.reset();
    }
    if (r.kind == SequenceKind::kPrefix || r.fork_from) {
      if (started) {
        out.lost.push_back(r.id);
        return;
      }
    } else if (started && r.kind == SequenceKind::kGenerate) {
      r.prompt.insert(r.prompt.end(), s->generated.begin(), s->generated.end());
      r.max_tokens -= static_cast<int64_t>(s->generated.size());
    }
    if (started) out.started.push_back(r.id);
    out.rerun.push_back(std::move(r));
  };
  for (const SequencePtr& s : running_) leave(s);
  for (const SequencePtr& s : waiting_) leave(s);
  running_.clear();
  waiting_.clear();
  cache_index_.clear();
  cache_stats_.entries = 0;
  cache_stats_.bytes = 0;
  for (auto& [name, account] : account_stats_) account.entries = account.bytes = 0;
  reserved_pages_ = 0;
  pending_release_.clear();
  in_flight_.clear();
  early_.clear();
  promised_ = false;
  return out;
}

}  // namespace deltaserve
