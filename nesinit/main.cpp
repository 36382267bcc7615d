// nesinit: PID 1 for microVMs. (Skeleton: --version/--help only; the init proper is issue 3.)
#include <unistd.h>

#include <cstring>
#include <fmt/format.h>

#include "protocol/protocol.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    fmt::print("nesinit {} (protocol {})\n", NESINIT_VERSION, nes::proto::kProtocolVersion);
    return 0;
  }
  fmt::print(stderr, "usage: nesinit [--version|--help]\n");
  return 2;
}
