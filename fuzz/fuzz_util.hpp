// Shared by the libFuzzer harnesses: a byte cursor over the fuzzer's input, and a check that
// aborts (so libFuzzer reports a crash with the input) whatever NDEBUG says.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace nes::fuzz {

/// Abort with `what` when `ok` is false: an invariant the harness asserts.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

/// Reads the input front to back: small integers for choices, then byte strings.
class Cursor {
 public:
  Cursor(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  /// One byte (0 when exhausted).
  std::uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }
  /// A value in 0..n-1.
  unsigned pick(unsigned n) { return n ? byte() % n : 0; }
  /// Up to `max` bytes (length from one byte, scaled), as a view into the input.
  std::string_view bytes(std::size_t max) {
    std::size_t want = std::size_t{byte()} * max / 255;
    if (want > n_ - i_) want = n_ - i_;
    std::string_view v(reinterpret_cast<const char*>(d_ + i_), want);
    i_ += want;
    return v;
  }
  /// Everything left.
  std::string_view rest() {
    std::string_view v(reinterpret_cast<const char*>(d_ + i_), n_ - i_);
    i_ = n_;
    return v;
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t i_ = 0;
};

/// Feed `stream` to `feed(chunk)` in pieces whose sizes cycle through `cuts` (each at least 1
/// byte; 1 when `cuts` is empty): how a reader sees one stream cut differently by the kernel.
template <class Feed>
void feed_in_cuts(std::string_view stream, const std::vector<std::size_t>& cuts, Feed feed) {
  std::size_t pos = 0, k = 0;
  while (pos < stream.size()) {
    std::size_t n = cuts.empty() ? 1 : cuts[k++ % cuts.size()];
    n = std::max<std::size_t>(1, std::min(n, stream.size() - pos));
    feed(stream.substr(pos, n));
    pos += n;
  }
}

}  // namespace nes::fuzz
