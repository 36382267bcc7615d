// Size: the C++ runtime's default terminate handler names an uncaught exception's type with
// __cxa_demangle, which links libc++abi's whole demangler (~96 KiB, a fifth of the init). The
// init is built with -fno-exceptions and never throws, so that message can never be printed;
// this definition keeps the demangler's archive member out of the link. It follows the
// Itanium C++ ABI's contract for the failure case (status -2: "not a valid mangled name"), so a
// caller that did reach it would print the mangled name instead.
#include <cstddef>

extern "C" char* __cxa_demangle(const char*, char*, std::size_t*, int* status) {
  if (status) *status = -2;
  return nullptr;
}
