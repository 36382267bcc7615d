// Size: the global allocation functions, defined by the init so that libc++abi's (which throw
// std::bad_alloc) stay out of the link, and with them the exception runtime they need
// (__cxa_throw, the personality routine, libunwind: ~40 KiB of a ~380 KiB init). The init is built
// with -fno-exceptions and catches nothing, so a failed allocation already ended in
// std::terminate (abort); here it ends in abort directly, after one line on stderr. These are the
// replaceable forms of [new.delete.single] and [new.delete.array] (C++20 [replacement.functions]);
// the nothrow forms return nullptr on failure, as the standard's do.
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
// string over max_size() aborts), so string.o and the exception runtime stay out.
template class std::basic_string<char>;
template std::string std::operator+<char, std::char_traits<char>, std::allocator<char>>(const char*,
                                                                                    const std::string&);
