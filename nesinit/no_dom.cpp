// Size: simdjson's DOM stage 2 (the tape builder, ~21 KiB of the fallback kernel's code) left out
// of the init. The codec parses with On Demand, which runs stage 1 only, through the kernel's
// dom_parser_implementation; that class's vtable also names stage2 and stage2_next, which kept
// them linked. protocol/meson.build makes those two weak in the compiled amalgamation, and these
// strong definitions, one abort each, replace them, so the linker drops the real ones
// (--gc-sections). Nothing in the init reaches them (no dom::parser); if something ever did, it
// would end here, with a line on stderr, never parse silently wrong. The names are the Itanium
// C++ ABI manglings of simdjson 3.0.1's `error_code
// simdjson::fallback::dom_parser_implementation::stage2{,_next}(dom::document&) noexcept`
// (protocol/meson.build lists the same two); the class is private to simdjson.cpp, so they are
// defined by their symbol names.
#include <unistd.h>

#include <cstdlib>

namespace {
[[noreturn]] void no_dom() {
  static const char msg[] = "nesinit: simdjson DOM stage 2 called (not linked in the init)\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
  std::abort();
}
}  // namespace

extern "C" int _ZN8simdjson8fallback25dom_parser_implementation6stage2ERNS_3dom8documentE(void*, void*) {
  no_dom();
}
extern "C" int _ZN8simdjson8fallback25dom_parser_implementation11stage2_nextERNS_3dom8documentE(void*, void*) {
  no_dom();
}
