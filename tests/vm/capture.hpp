// The bytes a vm::ByteSink received (host/vm/process.hpp), for the host/vm unit tests
// (tests/vm/launcher_test.cpp, tests/vm/vmm_test.cpp): a drain thread writes, the test reads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>

#include "host/vm/process.hpp"

namespace nes::test {

/// Collects bytes from a drain thread: sink() appends under a lock and wakes wait_for_text().
struct Capture {
  std::mutex mu;
  std::condition_variable cv;
  std::string data;
  /// A sink appending to `data`; `this` must outlive every call.
  nes::vm::ByteSink sink() {
    return [this](std::string_view b) {
      std::lock_guard lk(mu);
      data.append(b);
      cv.notify_all();
    };
  }
  /// Waits (at most `bound`) until `s` has arrived; false if it has not by then.
  bool wait_for_text(std::string_view s, std::chrono::milliseconds bound) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, bound, [&] { return data.find(s) != std::string::npos; });
  }
  /// A copy of everything received so far.
  std::string get() {
    std::lock_guard lk(mu);
    return data;
  }
};

}  // namespace nes::test
