// PeerSet: the ranks an operation talks to, in rank order. Not a public header: the executor's
// files include it through internal.h.
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

}  // namespace kizuna::collectives::executor_internal
