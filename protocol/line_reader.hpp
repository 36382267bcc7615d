// Framing: newline-delimited lines from any byte source, with a hard cap.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "messages.hpp"

namespace nes::proto {

/// One framed line. kind == too_long: a line over the cap was dropped without being buffered
/// whole (`text` empty, `length` = bytes seen, counting those dropped); the reader resynchronises
/// at the next '\n'.
struct Line {
  enum class Kind { text, too_long };
  Kind kind = Kind::text;
  std::string text;     // without '\n' and without a trailing '\r'
  std::size_t length = 0;
  bool operator==(const Line&) const = default;
};

/// Sans-I/O line reader: feed() bytes as they arrive (any split), then drain next().
/// Memory: at most `cap` bytes of an unfinished line plus the complete lines not yet drained.
class LineReader {
 public:
  /// `cap`: longest accepted line in bytes, excluding '\n' (and a trailing '\r').
  explicit LineReader(std::size_t cap = kDefaultLineCap);
  /// Append received bytes.
  void feed(std::string_view bytes);
  /// The next complete line (or too_long notice), if any.
  std::optional<Line> next();
  /// True if bytes of an unfinished line are pending (EOF now would cut a line in half).
  bool partial() const;
  /// Bytes of the unfinished line held in memory: at most cap + 1 (room for a trailing '\r'),
  /// and 0 while an over-long line is being dropped. Lets callers and tests check the bound.
  std::size_t buffered() const { return cur_.size(); }
  /// The cap this reader enforces, in bytes.
  std::size_t cap() const { return cap_; }
  /// Bytes of the unfinished line seen so far, dropped ones included (0 between lines): what an
  /// EOF now would cut short.
  std::size_t pending() const { return cur_len_; }
  /// The unfinished line has passed the cap (more than cap + 1 bytes: room for a trailing '\r')
  /// and is being dropped: a caller that must not wait for a '\n' that may never come (an endless
  /// line) can judge it now.
  bool dropping() const { return skipping_; }

 private:
  std::size_t cap_;
  std::string cur_;
  std::size_t cur_len_ = 0;   // bytes of the current line seen, including dropped ones
  bool skipping_ = false;     // current line exceeded the cap; dropping until '\n'
  std::deque<Line> ready_;
};

}  // namespace nes::proto
