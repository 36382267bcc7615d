// unpack_tool STATE REF: unpacks image REF of the store under STATE (host/image/unpack.hpp) and
// prints the root's path, then one line "entries N bytes N whiteouts N seconds S" on stderr.
// Exit 0, or 125 with the error on stderr. The unpack test's way in (tests/image/unpack_test.py).
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "host/image/unpack.hpp"

int main(int argc, char** argv) {
  using namespace nes::image;
  if (argc != 3) {
    std::fputs("usage: unpack_tool STATE REF\n", stderr);
    return 2;
  }
  auto store = Store::open(argv[1]);
  if (!store) {
    fmt::print(stderr, "unpack_tool: {}\n", store.error().message);
    return 125;
  }
  auto m = resolve_manifest(*store, argv[2]);
  if (!m) {
    fmt::print(stderr, "unpack_tool: {}\n", m.error().message);
    return 125;
  }
  auto t0 = std::chrono::steady_clock::now();
  UnpackStats st;
  auto root = unpack_image(*store, *m, &st);
  if (!root) {
    fmt::print(stderr, "unpack_tool: {}\n", root.error().message);
    return 125;
  }
  std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  fmt::print("{}\n", root->string());
  fmt::print(stderr, "entries {} bytes {} whiteouts {} seconds {:.3f}\n", st.entries, st.bytes, st.whiteouts, dt.count());
  return 0;
}
