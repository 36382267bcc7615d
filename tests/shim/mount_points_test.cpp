// A read-only root's mount points (host/shim/mount_points.hpp), made in a real directory: what
// the guest's init mounts over appears, what is there stays, and a symlink in the root (an image
// can carry any) never leads a creation out of it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>

#include "host/shim/mount_points.hpp"
#include "tests/support/temp_dir.hpp"

using namespace nes;
namespace fs = std::filesystem;

TEST_CASE("a root of /pause alone gets /dev /proc /sys /run /tmp /etc, the /etc files and each volume's target") {
  test::TempDir tmp{"mountpts"};
  const fs::path root = tmp.path / "root";
  fs::create_directories(root);
  std::ofstream(root / "pause") << "x";
  fs::create_directories(tmp.path / "vol");
  std::ofstream(tmp.path / "file") << "f";
  std::vector<shim::Volume> v{{tmp.path / "vol", "/data/sub", false}, {tmp.path / "file", "/etc/app.conf", true}};
  REQUIRE(shim::make_mount_points(root, v));
  for (const char* d : {"dev", "proc", "sys", "run", "tmp", "etc", "data/sub"}) CHECK(fs::is_directory(root / d));
  for (const char* f : {"etc/hosts", "etc/resolv.conf", "etc/hostname", "etc/app.conf"}) {
    CHECK(fs::is_regular_file(root / f));
    CHECK(fs::file_size(root / f) == 0);
  }
  // Again: nothing changes, and a file that was there keeps its bytes.
  std::ofstream(root / "etc" / "hosts") << "127.0.0.1 localhost\n";
  REQUIRE(shim::make_mount_points(root, v));
  CHECK(fs::file_size(root / "etc" / "hosts") == 20);
}

TEST_CASE("a symlink in the root is never followed: nothing is made outside it") {
  test::TempDir tmp{"mountpts"};
  const fs::path root = tmp.path / "root", outside = tmp.path / "outside";
  fs::create_directories(root);
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, root / "etc");    // /etc -> a host directory
  fs::create_directory_symlink("/../outside", root / "run");  // and a relative escape
  std::vector<shim::Volume> v{{tmp.path, "/etc/x/y", false}, {tmp.path, "/../outside/z", false}};
  REQUIRE(shim::make_mount_points(root, v));
  CHECK(fs::is_empty(outside));
  CHECK(fs::is_symlink(root / "etc"));
  CHECK(fs::is_directory(root / "dev"));
}

TEST_CASE("a root that cannot be written: the error names the mount point") {
  test::TempDir tmp{"mountpts"};
  const fs::path root = tmp.path / "root";
  fs::create_directories(root);
  std::ofstream(root / "dev") << "a file where /dev should be";  // left alone, not an error
  fs::permissions(root, fs::perms::owner_read | fs::perms::owner_exec);
  auto s = shim::make_mount_points(root, {});
  fs::permissions(root, fs::perms::owner_all);
  if (::geteuid() == 0) {  // root writes anyway (CAP_DAC_OVERRIDE): the file stays a file
    CHECK(s);
    CHECK(fs::is_regular_file(root / "dev"));
  } else {
    REQUIRE(!s);
    CHECK(s.error().message == "root mount point /proc: Permission denied");
  }
}
