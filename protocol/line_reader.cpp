#include "line_reader.hpp"

namespace nes::proto {

LineReader::LineReader(std::size_t cap) : cap_(cap) {}

void LineReader::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    auto nl = bytes.find('\n');
    std::string_view piece = nl == std::string_view::npos ? bytes : bytes.substr(0, nl);
    cur_len_ += piece.size();
    if (!skipping_) {
      // Keep at most cap+1 bytes: one more than the cap so a trailing '\r' can still be dropped.
      if (cur_.size() + piece.size() > cap_ + 1) {
        skipping_ = true;
        cur_.clear();
        cur_.shrink_to_fit();
      } else {
        cur_.append(piece);
      }
    }
    if (nl == std::string_view::npos) break;
    // End of a line.
    if (!skipping_ && !cur_.empty() && cur_.back() == '\r') cur_.pop_back();
    if (!skipping_ && cur_.size() > cap_) skipping_ = true;
    if (skipping_) {
      ready_.push_back(Line{Line::Kind::too_long, {}, cur_len_});
    } else {
      std::size_t len = cur_.size();
      ready_.push_back(Line{Line::Kind::text, std::move(cur_), len});
    }
    cur_.clear();
    cur_len_ = 0;
    skipping_ = false;
    bytes.remove_prefix(nl + 1);
  }
}

std::optional<Line> LineReader::next() {
  if (ready_.empty()) return std::nullopt;
  Line l = std::move(ready_.front());
  ready_.pop_front();
  return l;
}

bool LineReader::partial() const { return cur_len_ > 0; }

}  // namespace nes::proto
