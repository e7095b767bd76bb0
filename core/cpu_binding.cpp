#include "parallax/core/cpu_binding.h"

#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "parallax/core/error.h"
#include "parallax/core/hwloc_support.h"

namespace parallax {
namespace {

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* bitmap) const { hwloc_bitmap_free(bitmap); }
};
using Bitmap = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

Bitmap new_bitmap() {
  Bitmap bitmap(hwloc_bitmap_alloc());
  PARALLAX_CHECK(bitmap != nullptr, TopologyError, "hwloc_bitmap_alloc failed");
  return bitmap;
}

}  // namespace

CoreShare core_share(int local_rank, int local_size, int cores) {
  const int n = std::max(1, cores);
  if (local_size > n) return {local_rank % n, 1};
  const long begin = static_cast<long>(local_rank) * n / local_size;
  const long end = (local_rank + 1L) * n / local_size;
  return {static_cast<int>(begin), static_cast<int>(end - begin)};
}

RankCpus rank_cpus(int local_rank, int local_size, const std::string& near) {
  PARALLAX_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, UsageError, "local rank ", local_rank,
                 " of ", local_size, ": expected 0 <= local rank < local size");
  detail::HwlocTopology topology("this machine");
  topology.load();
  hwloc_topology_t topo = topology.get();
  RankCpus result;
  Bitmap allowed = new_bitmap();
  if (hwloc_get_cpubind(topo, allowed.get(), HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(allowed.get())) {
    hwloc_bitmap_copy(allowed.get(), hwloc_topology_get_allowed_cpuset(topo));
  }
  result.process_bound = !hwloc_bitmap_isincluded(hwloc_topology_get_allowed_cpuset(topo), allowed.get());
  if (!near.empty()) {
    Bitmap near_set = new_bitmap();
    if (hwloc_bitmap_list_sscanf(near_set.get(), near.c_str()) == 0 &&
        hwloc_bitmap_intersects(near_set.get(), allowed.get())) {
      hwloc_bitmap_and(allowed.get(), allowed.get(), near_set.get());
    }
  }
  // The first allowed PU of every core that has one, in core order.
  std::vector<int> first_pu_of_core;
  const int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (int c = 0; c < cores; ++c) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(c));
    Bitmap usable = new_bitmap();
    hwloc_bitmap_and(usable.get(), core->cpuset, allowed.get());
    const int pu = hwloc_bitmap_first(usable.get());
    if (pu >= 0) first_pu_of_core.push_back(pu);
  }
  if (first_pu_of_core.empty()) {  // no core objects (some VMs): plain PUs
    for (int pu = hwloc_bitmap_first(allowed.get()); pu >= 0; pu = hwloc_bitmap_next(allowed.get(), pu)) {
      first_pu_of_core.push_back(pu);
    }
  }
  PARALLAX_CHECK(!first_pu_of_core.empty(), TopologyError, "this process may run on no PU (",
                 detail::cpuset_string(allowed.get()), ")");
  result.usable_cores = static_cast<int>(first_pu_of_core.size());
  const CoreShare share = core_share(local_rank, local_size, result.usable_cores);
  result.pus.assign(first_pu_of_core.begin() + share.first, first_pu_of_core.begin() + share.first + share.count);
  return result;
}

std::vector<int> rank_cpu_share(int local_rank, int local_size, const std::string& near) {
  return rank_cpus(local_rank, local_size, near).pus;
}

void bind_calling_thread(int os_index) {
  detail::HwlocTopology topology("this machine");
  topology.load();
  Bitmap set = new_bitmap();
  hwloc_bitmap_only(set.get(), static_cast<unsigned>(os_index));
  PARALLAX_CHECK(hwloc_set_cpubind(topology.get(), set.get(), HWLOC_CPUBIND_THREAD) == 0, TopologyError,
                 "binding a thread to PU ", os_index, " failed: ", std::strerror(errno));
}

void bind_process(const std::vector<int>& os_indexes) {
  detail::HwlocTopology topology("this machine");
  topology.load();
  Bitmap set = new_bitmap();
  for (int pu : os_indexes) hwloc_bitmap_set(set.get(), static_cast<unsigned>(pu));
  PARALLAX_CHECK(hwloc_set_cpubind(topology.get(), set.get(), HWLOC_CPUBIND_PROCESS) == 0, TopologyError,
                 "binding this process to PU(s) ", detail::cpuset_string(set.get()), " failed: ", std::strerror(errno));
}

std::string calling_thread_binding() {
  detail::HwlocTopology topology("this machine");
  topology.load();
  Bitmap set = new_bitmap();
  PARALLAX_CHECK(hwloc_get_cpubind(topology.get(), set.get(), HWLOC_CPUBIND_THREAD) == 0, TopologyError,
                 "reading the calling thread's binding failed: ", std::strerror(errno));
  return detail::cpuset_string(set.get());
}

std::string process_binding() {
  detail::HwlocTopology topology("this machine");
  topology.load();
  hwloc_topology_t topo = topology.get();
  Bitmap bound = new_bitmap();
  if (hwloc_get_cpubind(topo, bound.get(), HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(bound.get()) ||
      hwloc_bitmap_isincluded(hwloc_topology_get_allowed_cpuset(topo), bound.get())) {
    return "";
  }
  return detail::cpuset_string(bound.get());
}

bool bound_apart(const std::vector<std::string>& bindings) {
  if (bindings.size() < 2) return false;
  std::vector<Bitmap> sets;
  for (const std::string& list : bindings) {
    if (list.empty()) return false;
    Bitmap set = new_bitmap();
    if (hwloc_bitmap_list_sscanf(set.get(), list.c_str()) != 0 || hwloc_bitmap_iszero(set.get())) return false;
    for (const Bitmap& other : sets) {
      if (hwloc_bitmap_intersects(set.get(), other.get())) return false;
    }
    sets.push_back(std::move(set));
  }
  return true;
}

}  // namespace parallax
