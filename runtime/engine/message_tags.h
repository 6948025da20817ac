// Every tag of the messages between the ranks of a replica, in one list so
// that no two kinds of message can share one. kActivation travels on the
// stage data communicator, the others on the control communicator
// (runtime/comm/rank_communicators.h).
#pragma once

namespace deltaserve::message_tags {

// Stage p -> stage p + 1 (same TP rank): one forward's activation packet.
inline constexpr int kActivation = 1;
// Leader -> every other rank: a step (its size, then its bytes; size 0: stop).
inline constexpr int kStep = 10;
// Output rank -> leader: a step's sampled tokens, log-probs and logits.
inline constexpr int kResults = 11;
// Every rank -> leader: what it holds and its compute time after a step.
inline constexpr int kReport = 12;

}  // namespace deltaserve::message_tags
