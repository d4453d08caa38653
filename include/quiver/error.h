// Errors that name the problem. Every failed check throws quiver::Error with a
// message that says what was expected and what was found.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace quiver {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace quiver

// QV_CHECK(cond, "format", args...): throws quiver::Error with the formatted message.
#define QV_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::quiver::fail(__VA_ARGS__); \
  } while (0)
