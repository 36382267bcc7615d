// Length-framed SHA-256 names (host/shim/identity.hpp), hashed with vm::Sha256 (libcrypto).
#include "host/shim/identity.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "host/vm/sha256.hpp"

namespace nes::shim {

std::string framed_sha256(std::initializer_list<std::string_view> fields) {
  vm::Sha256 sha;
  // No context only when libcrypto's allocation failed: an empty digest would give every
  // container the one VM id "ctr-" (and the one socket), so stop here instead.
  if (!sha.ok()) {
    std::fputs("containerd-shim-nesinit-v2: libcrypto: no SHA-256 context\n", stderr);
    std::abort();
  }
  for (auto f : fields) {
    std::array<char, 8> len{};
    std::uint64_t n = f.size();
    for (int i = 7; i >= 0; --i, n >>= 8) len[static_cast<std::size_t>(i)] = static_cast<char>(n & 0xff);
    sha.update(std::string_view(len.data(), len.size()));
    sha.update(f);
  }
  return sha.hex();
}

std::string vm_id(std::string_view ns, std::string_view id) { return "ctr-" + framed_sha256({ns, id}).substr(0, 24); }

std::string new_incarnation() {
  unsigned char b[8] = {};
  std::size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // No randomness (it cannot happen for 8 bytes after boot): the time and pid, still unique
      // per Create on this machine.
      const auto t = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
                     (static_cast<std::uint64_t>(::getpid()) << 48);
      return fmt::format("{:016x}", t);
    }
    got += static_cast<std::size_t>(n);
  }
  std::string hex;
  for (unsigned char c : b) hex += fmt::format("{:02x}", c);
  return hex;
}

std::string incarnation_vm_id(std::string_view ns, std::string_view id, std::string_view incarnation) {
  return fmt::format("{}-{}", vm_id(ns, id), incarnation);
}

std::filesystem::path socket_path(std::string_view containerd_address, std::string_view ns, std::string_view id) {
  std::string_view a = containerd_address;
  if (a.starts_with("unix://")) a.remove_prefix(7);
  std::filesystem::path dir = std::filesystem::path(a).parent_path();
  if (dir.empty()) dir = "/run/containerd";
  return dir / "s" / framed_sha256({containerd_address, ns, id});
}

}  // namespace nes::shim
