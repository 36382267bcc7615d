#include "stdio_mux.hpp"

#include <algorithm>

namespace nes::init {

StdioMux::StdioMux(const proto::Stdio& workload) : workload_(workload, 0) {}

StdioCore* StdioMux::ring(std::size_t i) {
  if (i == 0) return &workload_;
  Slot* s = slots_[i - 1].get();
  return s ? &s->core : nullptr;
}

StdioMux::Slot* StdioMux::slot_of(std::uint16_t proc) const {
  for (auto& s : slots_)
    if (s && s->proc == proc) return s.get();
  return nullptr;
}

StdioCore* StdioMux::open(std::uint16_t proc, const proto::Stdio& st) {
  // A number still held is refused: two cores of one number would make its frames ambiguous.
  if (proc == 0 || slot_of(proc)) return nullptr;
  auto free = std::find(slots_.begin(), slots_.end(), nullptr);
  if (free == slots_.end() && slots_.size() >= kSlots) return nullptr;
  if (!workload_.open_process(proc, st)) return nullptr;
  if (free == slots_.end()) free = slots_.emplace(slots_.end());
  *free = std::make_unique<Slot>(st, proc);
  StdioCore& c = (*free)->core;
  c.direct_unsupported();
  if (!workload_.channel_open()) c.channel_closed();
  // No frame can come for it any more: its stdin ends at once (the loop closes the pipe, a
  // terminal gets ^D), as every open stdin did when the channel ended, not never.
  if (rx_ended_) c.on_rx_eof();
  return &c;
}

StdioCore* StdioMux::core(std::uint16_t proc) {
  if (proc == 0) return &workload_;
  Slot* s = slot_of(proc);
  return s && !s->closed ? &s->core : nullptr;
}

void StdioMux::on_rx_eof() {
  rx_ended_ = true;
  workload_.on_rx_eof();
  if (!workload_.rx_error().empty()) return;
  for (auto& s : slots_)
    if (s && !s->closed) s->core.on_rx_eof();
}

bool StdioMux::holds(std::uint16_t proc) const { return proc == 0 || slot_of(proc); }

void StdioMux::close(std::uint16_t proc) {
  if (proc == 0) return;
  workload_.close_process(proc);
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i] || slots_[i]->proc != proc) continue;
    if (turn_ == i + 1) slots_[i]->closed = true;  // its half-written batch goes out first, then the core
    else slots_[i].reset();
  }
}

bool StdioMux::take_outputs_done(std::uint16_t proc) {
  bool* reported = &outputs_reported_;
  if (proc != 0) {
    Slot* s = slot_of(proc);
    if (!s || s->closed) return false;
    reported = &s->outputs_reported;
  }
  if (*reported || !core(proc)->outputs_done() || !core(proc)->delivered()) return false;
  // An exec'd process is closed (its core and what it holds discarded) once reported, and its
  // account calls every byte read sent: its frames, eofs included, are written first.
  if (proc != 0) {
    const StdioCore& c = *core(proc);
    const bool eofs = c.eof_framed(proto::Stream::out) && (c.terminal() || c.eof_framed(proto::Stream::err));
    if (c.channel_open() && (c.buffered() > 0 || !eofs)) return false;
  }
  *reported = true;
  return true;
}

void StdioMux::end_turn() {
  const std::size_t i = *turn_;
  turn_.reset();
  next_ = (i + 1) % (slots_.size() + 1);  // the one after it goes first next time
  if (i > 0 && slots_[i - 1]->closed) slots_[i - 1].reset();
}

std::optional<StdioMux::Tx> StdioMux::tx() {
  auto offer = [&](std::size_t i) -> std::optional<Tx> {
    StdioCore& c = *ring(i);
    Tx t;
    t.proc = c.proc();
    t.bytes = c.tx();
    if (t.bytes.empty()) t.direct = c.direct_pending();
    if (t.bytes.empty() && !t.direct) return std::nullopt;
    return t;
  };
  if (workload_.resume() && !workload_.linked()) {
    // A connection's handshake goes first, and nothing of any process before it is over.
    if (workload_.suspended()) return std::nullopt;
    turn_ = 0;
    if (auto t = offer(0)) return t;
    turn_.reset();
    return std::nullopt;
  }
  if (turn_) {
    // The turn under way goes on until its batch or direct frame is out in full.
    if (ring(*turn_)->tx_unfinished())
      if (auto t = offer(*turn_)) return t;
    end_turn();
  }
  const std::size_t n = slots_.size() + 1;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = (next_ + k) % n;
    StdioCore* c = ring(i);
    if (!c || (i > 0 && slots_[i - 1]->closed) || !c->tx_pending()) continue;
    if (auto t = offer(i)) {
      turn_ = i;
      return t;
    }
  }
  return std::nullopt;
}

void StdioMux::sent(std::size_t n) {
  if (!turn_) return;
  StdioCore& c = *ring(*turn_);
  c.sent(n);
  if (!c.tx_unfinished()) end_turn();
}

bool StdioMux::tx_pending() {
  for (std::size_t i = 0; i <= slots_.size(); ++i)
    if (StdioCore* c = ring(i); c && c->tx_pending()) return true;
  return false;
}

std::size_t StdioMux::rx_room() const {
  std::size_t room = workload_.rx_room();
  for (const auto& s : slots_)
    if (s && !s->closed) room = std::min(room, s->core.rx_room());
  return room;
}

void StdioMux::on_rx(std::string_view bytes) {
  workload_.on_rx(bytes);
  // The decoder skips frames of closed processes itself; a closed core gets nothing either way.
  for (const proto::Frame& f : workload_.take_foreign())
    if (StdioCore* c = f.proc != 0 ? core(f.proc) : nullptr) c->on_frame(f);
}

void StdioMux::channel_lost() {
  if (!workload_.resume()) return channel_closed();
  turn_.reset();
  workload_.channel_lost();
  // Processes exec started are not resumed: their clients ended with the host that served them.
  for (auto& s : slots_) {
    if (!s) continue;
    s->core.channel_closed();
    s->core.in_closed();
  }
  for (auto& s : slots_)
    if (s && s->closed) s.reset();
}

void StdioMux::channel_resumed() {
  rx_ended_ = false;
  turn_.reset();
  workload_.channel_resumed();
}

void StdioMux::channel_closed() {
  turn_.reset();
  rx_ended_ = true;
  for (std::size_t i = 0; i <= slots_.size(); ++i) {
    StdioCore* c = ring(i);
    if (!c) continue;
    c->channel_closed();
    // Nothing more can arrive for stdin: each process reads EOF instead of waiting for good.
    c->in_closed();
  }
  for (auto& s : slots_)
    if (s && s->closed) s.reset();
}

}  // namespace nes::init
