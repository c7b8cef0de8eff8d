// The order a step-3 trainer (the policy, the critic) does its work in: a function of what has
// arrived, never of when it arrived.
//
// Every rank of a trainer's group receives the same rollouts (to score) and experience batches
// (to train on), but not in the same order: with max_staleness >= 1 the rollouts of batch k + 1
// (from the generator) and the experience of batch k (from the experience maker) race. Scoring
// and training both run collectives (an all-gather of the scores; the engine's reductions), so
// two ranks that took them in different orders called different collectives: the run failed
// ("the ranks called different collectives"), or scored batch k + 1 with other weights than in
// another run. The rule here gives every rank the same sequence:
//   - an experience batch is trained on as soon as it is here;
//   - rollouts are scored in the order they came (the generator sends them in order), each only
//     once every earlier training batch this trainer scored has had its experience batch, or
//     the experience maker's empty batch saying it trains nothing (dropped, filtered to nothing,
//     or kept for generation_batches > 1), go through.
// It cannot wait forever: batch k's experience needs only the scores of batch k and earlier.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <utility>

namespace flowrun::actors {

/// Item: what arrived (the node keeps its messages here; a test, names).
template <class Item>
class trainer_order {
 public:
  enum class work { none, train, score };

  /// Rollouts of `iteration` arrived (held-out passes: eval, which never train).
  void rollouts_arrived(int64_t iteration, bool eval, Item item) {
    rollouts_.push_back({iteration, eval, std::move(item)});
  }
  /// An experience batch (or an empty one: nothing to train) ending at `iteration` arrived.
  void experience_arrived(int64_t iteration, Item item) { experience_.push_back({iteration, false, std::move(item)}); }

  /// What to do next: train on the oldest experience batch, score the oldest rollouts, or wait.
  work next() const {
    if (!experience_.empty()) return work::train;
    if (rollouts_.empty()) return work::none;
    return !awaiting_.empty() && *awaiting_.begin() < rollouts_.front().iteration ? work::none : work::score;
  }
  /// The item of the work next() named (train or score), taken out of the queue: that work is done.
  Item take(work w) {
    if (w == work::train) {
      entry e = std::move(experience_.front());
      experience_.pop_front();
      awaiting_.erase(awaiting_.begin(), awaiting_.upper_bound(e.iteration));
      return std::move(e.item);
    }
    entry e = std::move(rollouts_.front());
    rollouts_.pop_front();
    if (!e.eval) awaiting_.insert(e.iteration);
    return std::move(e.item);
  }

 private:
  struct entry {
    int64_t iteration;
    bool eval;
    Item item;
  };
  std::deque<entry> rollouts_, experience_;
  std::set<int64_t> awaiting_;  // training batches scored whose experience (or empty batch) has not come
};

}  // namespace flowrun::actors
