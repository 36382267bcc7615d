// Size: the pieces of the C++ runtime the init needs, defined here so that no member of libc++ or
// libc++abi is linked at all. Any one of them drags in the exception runtime (__cxa_throw, the
// personality routine, libunwind, the default terminate handler: ~50 KiB of a ~370 KiB init):
// they are built with exceptions, and the linker keeps the personality routine of every member it
// extracts alive through that member's unwind tables, even when nothing calls into it. The init is
// built with -fno-exceptions and catches nothing, so everything that could throw already ended in
// std::terminate (abort); here each ends in abort directly, after one line on stderr.
// - the global allocation functions: the replaceable forms of [new.delete.single] and
//   [new.delete.array] (C++20 [replacement.functions]); the nothrow forms return nullptr on
//   failure, as the standard's do (libc++abi's throw std::bad_alloc);
// - std::nothrow, the tag simdjson allocates with (otherwise libc++'s new.o);
// - __cxa_pure_virtual, which a vtable's pure slot calls (Itanium C++ ABI 3.2.6; otherwise
//   libc++abi's cxa_virtual.o);
// - std::string's members (below).
// Should another part of libc++ ever be needed, std::nothrow is defined twice and the link fails:
// loudly, at build time.
#include <unistd.h>

#include <cstdlib>
#include <new>
#include <string>

namespace {

[[noreturn]] void out_of_memory() {
  static const char msg[] = "nesinit: out of memory (operator new failed)\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
  std::abort();
}

void* allocate(std::size_t n) noexcept { return std::malloc(n ? n : 1); }

}  // namespace

namespace std {
const nothrow_t nothrow{};
}  // namespace std

extern "C" [[noreturn]] void __cxa_pure_virtual() {
  static const char msg[] = "nesinit: pure virtual function called\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
  std::abort();
}

void* operator new(std::size_t n) {
  if (void* p = allocate(n)) return p;
  out_of_memory();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n)) return p;
  out_of_memory();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

// libc++ declares std::string's members `extern template` and instantiates them in libc++.a's
// string.o, compiled with exceptions (length_error): instantiated here instead, without them (a
// string over max_size() aborts).
template class std::basic_string<char>;
template std::string std::operator+<char, std::char_traits<char>, std::allocator<char>>(const char*,
                                                                                    const std::string&);
