// Internal to parallax_topology: the check of an hwloc synthetic description before hwloc
// sees it. A description comes from the user (topology.emulate_node, the planner's
// cluster) and hwloc trusts it: it reads counts with strtoul (signs, hexadecimal, octal),
// looks for a level's ':' or a memory level's ']' anywhere further on, allocates a bitmap
// up to any index it is given, and takes time growing with the square of a level's width.
// So the description is parsed here by a grammar of our own, strict enough that what it
// accepts means the same to hwloc, and bounded so that hwloc builds it in about a second:
//
//   description := item (' ' item)*            items apart by white space
//   item        := level | '[' type attrs? ']'  a memory level ("[numa(memory=1GB)]")
//   level       := (type ':')? count attrs?     "core:8", or a count alone ("8")
//   type        := a letter, then letters and digits ("pack", "l2", "group0")
//   count       := decimal digits, no leading zero
//   attrs       := '(' attribute (' ' attribute)* ')'
//   attribute   := size=BYTES | memory=BYTES | indexes=LIST
//
// plus "gpu:N", anywhere, which is ours: N GPUs spread over the NUMA nodes.
#pragma once

#include <string>

namespace parallax::detail {

struct SyntheticDescription {
  std::string hwloc_part;  // the levels, for hwloc_topology_set_synthetic
  int gpus = 0;
};

// The description's levels and GPU count. Throws TopologyError naming the description,
// the part at fault and what is expected: a byte that is not printable ASCII or white
// space, an item outside the grammar, levels that multiply to more than 16,384 PUs, a
// level wider than 1,024, levels too wide for their PUs, or an attribute out of bounds.
SyntheticDescription check_synthetic_description(const std::string& description);

}  // namespace parallax::detail
