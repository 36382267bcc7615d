// What the shim says of itself: `-v` (containerd's shims print their version so) and `-info`
// (containerd 2.x's shim flag: a serialized containerd.types.RuntimeInfo on stdout), each naming
// the containerd releases this shim was qualified against (tests/shim `shim-qualify`, tests/cri;
// docs/containerd.md "Qualified against"), as the a3s seed's compat record does.
#pragma once

#include <string>
#include <string_view>

namespace nes::shim {

/// The containerd releases the shim's qualification ran against, one per line:
/// "containerd 1.6.20 (Debian 12)", "containerd 1.7.24 (Debian 13)".
inline constexpr std::string_view kQualifiedAgainst[] = {
    "containerd 1.6.20 (Debian 12: shim-qualify passes 1-2, tests/cri)",
    "containerd 1.7.24 (Debian 13: tests/cri cri-nesinit-multi-c17)",
};

/// `-v`'s text: "containerd-shim-nesinit-v2:\n  Version: V\n  Qualified against:\n    ...\n".
std::string version_text(std::string_view version);

/// `-info`'s bytes: containerd.types.RuntimeInfo (containerd 2.x api/types/runtime.proto)
/// encoded by hand: name (1) "io.containerd.nesinit.v2", version (2) {version (1) `version`},
/// and one annotation (5) "io.nesinit.qualified-against" = kQualifiedAgainst joined by "; ".
std::string runtime_info(std::string_view version);

}  // namespace nes::shim
