// A test's own temp directory: created fresh, removed with everything in it on destruction, so it
// goes on every path out of a test, failed assertions included.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace nes::test {

/// A fresh directory $TMPDIR/PREFIX-XXXXXX (mkdtemp(3); $TMPDIR defaults to /tmp). Keep the
/// prefix short: a Unix socket inside it must fit sun_path (108 bytes). Aborts the test binary
/// if the directory cannot be made (nothing can run without it). Move-only in spirit: not copied.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(std::string_view prefix = "nes-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace nes::test
