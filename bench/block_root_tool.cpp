// block_root_tool STATE CONFIG erofs|ext4: ensure_block_root (host/image/block_root.hpp) of the
// unpacked root STATE/.images/roots/CONFIG/rootfs, then prints one line
// "PATH DIGEST SIZE SECONDS". Exit 0, or 125 with the error on stderr. bench/p19_block_root.py's
// way in (the build as `neshost run IMAGE` makes it: mkfs, fsync, hash, rename, record).
#include <chrono>
#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include "host/image/block_root.hpp"

int main(int argc, char** argv) {
  using namespace nes::image;
  if (argc != 4 || (std::string_view(argv[3]) != "erofs" && std::string_view(argv[3]) != "ext4")) {
    std::fputs("usage: block_root_tool STATE CONFIG erofs|ext4\n", stderr);
    return 2;
  }
  auto store = Store::open(argv[1]);
  if (!store) {
    fmt::print(stderr, "block_root_tool: {}\n", store.error().message);
    return 125;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto r = ensure_block_root(*store, argv[2], std::string_view(argv[3]) == "ext4" ? BlockFs::ext4 : BlockFs::erofs);
  if (!r) {
    fmt::print(stderr, "block_root_tool: {}\n", r.error().message);
    return 125;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} {} {} {:.6f}\n", r->path.string(), r->digest, r->size, s);
  return 0;
}
