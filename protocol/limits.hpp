// Values both ends must agree on that are not messages: the host builds a descriptor or binds a
// socket the init must accept, with the same numbers. Header-only, std only.
#pragma once

#include <cstddef>

namespace nes::proto {

/// Longest path of a `unix:PATH` channel or of any Unix socket either end binds or dials: bytes
/// (sockaddr_un's sun_path holds 108 on Linux, its terminating NUL included).
inline constexpr std::size_t kUnixPathMax = 107;

/// PATH used to resolve argv[0] when exec.env has none, and the one the host gives a workload
/// whose user named none (the usual root PATH of Debian's /etc/profile and of Docker's default
/// environment).
inline constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

}  // namespace nes::proto
