// Shared by the cache tests: an error check whose expected parts may be built
// strings (page ids and node handles are only known at run time).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "tree/builder_test_util.hpp"

// Expects `stmt` to throw treeattn::Error whose message contains every part.
#define EXPECT_ERROR_HAS(stmt, ...)                                                            \
  do {                                                                                         \
    const std::string msg_ = treeattn_test::error_message([&] { (void)(stmt); });              \
    for (const std::string& part_ : std::initializer_list<std::string>{__VA_ARGS__})           \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "expected '" << part_ << "' in: " << msg_; \
  } while (0)
