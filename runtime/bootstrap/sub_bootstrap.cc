#include "runtime/bootstrap/sub_bootstrap.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "runtime/core/wire.h"

namespace kizuna::bootstrap {
namespace {

constexpr uint32_t kGatherTag = 0;    // member -> first member: its AllGather bytes
constexpr uint32_t kScatterTag = 1;   // first member -> member: the whole table
constexpr uint32_t kUserTagBase = 3;  // Send/Recv tags start here
constexpr uint32_t kMaxUserTag = 1u << 16;

class SubBootstrap : public Bootstrap {
 public:
  SubBootstrap(std::shared_ptr<Bootstrap> parent, std::vector<int> members, int rank, uint32_t tag_base)
      : Bootstrap(rank, static_cast<int>(members.size())),
        parent_(std::move(parent)),
        members_(std::move(members)),
        tag_base_(tag_base) {}

  std::string_view kind() const override { return "split"; }
  const UniqueId* job() const override { return parent_->job(); }

 protected:
  Result<std::vector<Bytes>> DoAllGather(std::span<const uint8_t> mine, Deadline deadline) override {
    const int n = size();
    if (rank() != 0) {
      KZ_RETURN_IF_ERROR(parent_->Send(members_[0], tag_base_ + kGatherTag, mine, deadline));
      KZ_ASSIGN_OR_RETURN(Bytes table, parent_->Recv(members_[0], tag_base_ + kScatterTag, deadline));
      return Decode(table, n);
    }
    std::vector<Bytes> all(static_cast<size_t>(n));
    all[0].assign(mine.begin(), mine.end());
    for (int r = 1; r < n; ++r) {
      KZ_ASSIGN_OR_RETURN(all[static_cast<size_t>(r)], parent_->Recv(members_[static_cast<size_t>(r)],
                                                                     tag_base_ + kGatherTag, deadline));
    }
    Bytes table;
    // Each contribution is at most kMaxMessageBytes (the parent's Send limit): a u32 length holds it.
    for (const Bytes& b : all) wire::PutBytes(table, b);
    for (int r = 1; r < n; ++r)
      KZ_RETURN_IF_ERROR(parent_->Send(members_[static_cast<size_t>(r)], tag_base_ + kScatterTag, table, deadline));
    return all;
  }

  Status DoBarrier(Deadline deadline) override { return DoAllGather({}, deadline).status(); }

  Status DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) override {
    if (tag >= kMaxUserTag) return InvalidArgument(fmt::format("split bootstrap: tag {} (below {})", tag, kMaxUserTag));
    return parent_->Send(members_[static_cast<size_t>(peer)], tag_base_ + kUserTagBase + tag, bytes, deadline);
  }

  Result<Bytes> DoRecv(int peer, uint32_t tag, Deadline deadline) override {
    if (tag >= kMaxUserTag) return InvalidArgument(fmt::format("split bootstrap: tag {} (below {})", tag, kMaxUserTag));
    return parent_->Recv(members_[static_cast<size_t>(peer)], tag_base_ + kUserTagBase + tag, deadline);
  }

 private:
  static Result<std::vector<Bytes>> Decode(const Bytes& table, int n) {
    std::vector<Bytes> all;
    wire::Reader in(table);
    for (int r = 0; r < n; ++r) {
      const std::span<const uint8_t> part = in.Bytes();
      if (!in.ok()) return Internal(fmt::format("split bootstrap: malformed allgather table at entry {}", r));
      all.emplace_back(part.begin(), part.end());
    }
    if (!in.AtEnd()) return Internal("split bootstrap: trailing bytes in the allgather table");
    return all;
  }

  std::shared_ptr<Bootstrap> parent_;
  std::vector<int> members_;
  uint32_t tag_base_;
};

}  // namespace

Result<std::unique_ptr<Bootstrap>> CreateSubBootstrap(std::shared_ptr<Bootstrap> parent, std::vector<int> members,
                                                      uint32_t tag_base) {
  if (!parent) return InvalidArgument("split bootstrap: no parent");
  if (members.empty()) return InvalidArgument("split bootstrap: no members");
  std::set<int> seen;
  int me = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= parent->size())
      return InvalidArgument(fmt::format("split bootstrap: member {} is not a rank of the parent ({} ranks)", m,
                                         parent->size()));
    if (!seen.insert(m).second) return InvalidArgument(fmt::format("split bootstrap: member {} listed twice", m));
    if (m == parent->rank()) me = static_cast<int>(i);
  }
  if (me < 0) return InvalidArgument(fmt::format("split bootstrap: rank {} is not a member", parent->rank()));
  if (tag_base > UINT32_MAX - (kMaxUserTag + kUserTagBase))
    return InvalidArgument(fmt::format("split bootstrap: tag base {} leaves no room for its tags", tag_base));
  return std::unique_ptr<Bootstrap>(new SubBootstrap(std::move(parent), std::move(members), me, tag_base));
}

}  // namespace kizuna::bootstrap
