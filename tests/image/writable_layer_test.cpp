// The writable layer of an image run (host/image/writable_layer.hpp): `--storage-opt` parsed by
// docker's rules (units.RAMInBytes; keys size and persistent), bad values named; the persistent
// layer's disk made sparse with an empty ext4 (e2fsck, debugfs), kept when it exists.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "tests/support/shell_output.hpp"
#include "tests/support/temp_dir.hpp"

#include "host/image/writable_layer.hpp"

using namespace nes::image;
namespace fs = std::filesystem;

namespace {

using nes::test::TempDir;  // tests/support/temp_dir.hpp

using sh_fn = std::string (*)(const std::string&);
constexpr sh_fn sh = nes::test::shell_output;  // tests/support/shell_output.hpp

std::optional<std::uint64_t> size_of(std::string_view v) {
  StorageOpts o;
  if (!apply_storage_opt(fmt::format("size={}", v), o)) return std::nullopt;
  return o.size;
}

}  // namespace

TEST_CASE("--storage-opt: docker's sizes and the persistent key") {
  CHECK(size_of("10G") == 10ull << 30);
  CHECK(size_of("10g") == 10ull << 30);
  CHECK(size_of("10GB") == 10ull << 30);
  CHECK(size_of("10GiB") == 10ull << 30);
  CHECK(size_of("64m") == 64ull << 20);
  CHECK(size_of("1.5g") == 3ull << 29);
  CHECK(size_of("20971520") == 20ull << 20);
  CHECK(size_of("16777216b") == 16ull << 20);
  StorageOpts o;
  REQUIRE(apply_storage_opt("persistent=true", o));
  CHECK(o.persistent);
  REQUIRE(apply_storage_opt("size=1g", o));
  CHECK(o == StorageOpts{1ull << 30, true});
  REQUIRE(apply_storage_opt("persistent=0", o));
  CHECK(!o.persistent);

  for (const char* bad : {"size=", "size=10Q", "size=g", "size=1.2.3g", "size=-5m", "size=1k", "size=17t",
                          "size=99999999999999999999999p"}) {
    StorageOpts x;
    auto s = apply_storage_opt(bad, x);
    REQUIRE_MESSAGE(!s, bad);
    CHECK(s.error().message.find(fmt::format("--storage-opt '{}': size", bad)) == 0);
    CHECK(x == StorageOpts{});
  }
  StorageOpts x;
  auto s = apply_storage_opt("persistent=yes", x);
  REQUIRE(!s);
  CHECK(s.error().message.find("persistent: expected true or false") != std::string::npos);
  s = apply_storage_opt("dm.basesize=10G", x);
  REQUIRE(!s);
  CHECK(s.error().message.find("unknown key 'dm.basesize'") != std::string::npos);
  s = apply_storage_opt("size", x);
  REQUIRE(!s);
  CHECK(s.error().message.find("expected KEY=VALUE") != std::string::npos);
}

TEST_CASE("the persistent layer: a sparse empty ext4, kept once made") {
  TempDir t;
  fs::path disk = t.path / "upper.ext4";
  auto made = ensure_upper_disk(disk, 1ull << 30);
  REQUIRE_MESSAGE(made, (made ? "" : made.error().message));
  CHECK(*made);
  struct stat st;
  REQUIRE(::stat(disk.c_str(), &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_size) == 1ull << 30);
  CHECK(static_cast<std::uint64_t>(st.st_blocks) * 512 < (64ull << 20));  // sparse: a 1 GiB disk costs < 64 MiB
  CHECK(sh(fmt::format("e2fsck -fn {} >/dev/null 2>&1 && echo ok", disk.string())) == "ok\n");
  std::string root = sh(fmt::format("debugfs -R 'stat /' {} 2>/dev/null", disk.string()));
  CHECK(root.find("User:     0   Group:     0") != std::string::npos);
  CHECK(sh(fmt::format("debugfs -R 'ls -p /' {} 2>/dev/null", disk.string())).find("/lost+found/") != std::string::npos);

  // Made already: kept as it is (the VM's layer from its earlier run).
  ino_t ino = st.st_ino;
  auto again = ensure_upper_disk(disk, 2ull << 30);
  REQUIRE(again);
  CHECK(!*again);
  REQUIRE(::stat(disk.c_str(), &st) == 0);
  CHECK(st.st_ino == ino);
  CHECK(static_cast<std::uint64_t>(st.st_size) == 1ull << 30);

  auto small = ensure_upper_disk(t.path / "small.ext4", 1 << 20);
  REQUIRE(!small);
  CHECK(small.error().message.find("outside 16 MiB") != std::string::npos);
  auto nodir = ensure_upper_disk(t.path / "no/such/dir/upper.ext4", 1ull << 30);
  REQUIRE(!nodir);
  CHECK(nodir.error().message.find("no/such/dir") != std::string::npos);
  for (auto& e : fs::directory_iterator(t.path)) CHECK(e.path().filename() == "upper.ext4");
}
