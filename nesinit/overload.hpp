// The visitor of std::visit over the session's events and actions: one lambda per alternative.
#pragma once

namespace nes::init {

/// Overload{[](const A&) {...}, [](const B&) {...}}: a callable with every lambda's operator().
template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;

}  // namespace nes::init
