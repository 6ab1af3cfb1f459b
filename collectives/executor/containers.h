// The executor's small containers, which keep their storage from one operation to the next: the
// ranks an operation talks to (PeerSet) and a peer's control messages in order (FifoQueue). Not a
// public header: the executor's files include it through internal.h.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

namespace kizuna::collectives::executor_internal {

// A sorted set of ranks that keeps its first kInline in place: an operation talks to a few peers
// (a ring's two neighbours, a tree's parent and children, log2 p partners), and it fills several
// such sets on every call. As std::set<int> they were a third of the allocations of an 8-byte
// AllReduce between two hosts (about 8 of 30 per call). Hand-written for want of a small-set type
// among the project's libraries (the standard's flat_set is C++23 and allocates anyway).
class PeerSet {
 public:
  static constexpr size_t kInline = 8;

  PeerSet() = default;
  PeerSet(const PeerSet& o) { *this = o; }
  PeerSet& operator=(const PeerSet& o) {
    if (this == &o) return *this;
    size_ = o.size_;
    spilled_ = o.spilled_;
    if (spilled_)
      spill_ = o.spill_;
    else
      std::copy(o.begin(), o.end(), inline_.begin());
    return *this;
  }

  // Adds `rank`; false when it was there already.
  bool insert(int rank) {
    int* first = data();
    int* at = std::lower_bound(first, first + size_, rank);
    if (at != first + size_ && *at == rank) return false;
    const size_t pos = static_cast<size_t>(at - first);
    if (!spilled_ && size_ == kInline) {
      spill_.assign(inline_.begin(), inline_.end());
      spilled_ = true;
    }
    if (spilled_) {
      spill_.insert(spill_.begin() + static_cast<std::ptrdiff_t>(pos), rank);
    } else {
      std::copy_backward(inline_.begin() + pos, inline_.begin() + size_, inline_.begin() + size_ + 1);
      inline_[pos] = rank;
    }
    ++size_;
    return true;
  }
  template <typename It>
  void insert(It from, It to) {
    for (; from != to; ++from) insert(*from);
  }
  size_t count(int rank) const { return std::binary_search(begin(), end(), rank) ? 1 : 0; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const int* begin() const { return spilled_ ? spill_.data() : inline_.data(); }
  const int* end() const { return begin() + size_; }

 private:
  int* data() { return spilled_ ? spill_.data() : inline_.data(); }

  std::array<int, kInline> inline_{};
  size_t size_ = 0;
  bool spilled_ = false;
  std::vector<int> spill_;  // every element once more than kInline came
};

// First in, first out, over a vector whose storage stays: a std::deque of the executor's 512-byte
// control messages allocated and freed a block for each message. The consumed front is dropped
// when the queue runs empty, or once kMaxConsumed have piled up before a queue that never does (a
// peer always a message ahead).
template <typename T>
class FifoQueue {
 public:
  static constexpr size_t kMaxConsumed = 64;

  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  const T& front() const { return items_[head_]; }
  void push_back(const T& item) { items_.push_back(item); }
  void pop_front() {
    if (++head_ == items_.size()) {
      items_.clear();
      head_ = 0;
    } else if (head_ == kMaxConsumed) {
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  typename std::vector<T>::const_iterator begin() const { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  typename std::vector<T>::const_iterator end() const { return items_.end(); }
  // What the storage holds, consumed entries included (for the tests).
  size_t held() const { return items_.size(); }

 private:
  std::vector<T> items_;
  size_t head_ = 0;
};

}  // namespace kizuna::collectives::executor_internal
