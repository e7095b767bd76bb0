// The checks a pipeline receiver makes on the shapes another process announces
// (pipeline/transfer_meta.h), each with the message it must give. The fuzzer
// (tests/fuzz/transfer_meta_fuzzer.cpp) searches for inputs these miss.
#include "parallax/pipeline/transfer_meta.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "parallax/core/error.h"
#include "proto/pipeline.pb.h"

namespace parallax::pipeline::detail {
namespace {

const std::string kOrigin = "pipeline transfer from stage 1 on group 'pp[tp=0,dp=0]'";

std::string comm_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const CommError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a CommError";
  return "";
}

std::string meta_of(std::initializer_list<std::int64_t> shape, int dtype, bool defined = true) {
  proto::TransferMeta meta;
  proto::TensorMeta* tensor = meta.add_tensors();
  for (std::int64_t size : shape) tensor->add_shape(size);
  tensor->set_dtype(dtype);
  tensor->set_defined(defined);
  tensor->set_requires_grad(true);
  return meta.SerializeAsString();
}

TEST(TransferMeta, DecodesWhatASenderDescribes) {
  proto::TransferMeta meta;
  proto::TensorMeta* activation = meta.add_tensors();
  for (std::int64_t size : {4, 128, 64}) activation->add_shape(size);
  activation->set_dtype(static_cast<int>(c10::ScalarType::BFloat16));
  activation->set_requires_grad(true);
  activation->set_defined(true);
  meta.add_tensors()->set_defined(false);  // a gradient the sender has none for
  const auto tensors = decode_transfer_meta(meta.SerializeAsString(), kOrigin);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].shape, (std::vector<std::int64_t>{4, 128, 64}));
  EXPECT_EQ(tensors[0].dtype, c10::ScalarType::BFloat16);
  EXPECT_TRUE(tensors[0].requires_grad);
  EXPECT_FALSE(tensors[1].defined);
}

TEST(TransferMeta, RefusesWhatNoSenderSends) {
  const int kFloat = static_cast<int>(c10::ScalarType::Float);
  EXPECT_NE(comm_error([] { check_meta_length(-8, kOrigin); }).find("announces shapes of -8 bytes"), std::string::npos);
  EXPECT_NE(comm_error([] { check_meta_length(kMaxMetaBytes + 1, kOrigin); }).find(kOrigin), std::string::npos);
  check_meta_length(0, kOrigin);  // the previous shapes again
  EXPECT_NE(comm_error([] { decode_transfer_meta("\xff\xff", kOrigin); }).find("does not parse"), std::string::npos);
  EXPECT_NE(comm_error([] { decode_transfer_meta("", kOrigin); }).find("announces 0 tensors"), std::string::npos);
  EXPECT_NE(comm_error([&] { decode_transfer_meta(meta_of({4, -1}, kFloat), kOrigin); }).find("negative size -1"),
            std::string::npos);
  EXPECT_NE(comm_error([&] { decode_transfer_meta(meta_of({0, -1}, kFloat), kOrigin); }).find("negative size -1"),
            std::string::npos);  // an empty tensor too: the count is 0 before the -1
  EXPECT_NE(comm_error([&] { decode_transfer_meta(meta_of({1 << 30, 1 << 30, 1 << 30}, kFloat), kOrigin); })
                .find("more bytes than an int64 counts"),
            std::string::npos);
  EXPECT_NE(comm_error([] { decode_transfer_meta(meta_of({2}, 999), kOrigin); }).find("dtype code 999"),
            std::string::npos);
  EXPECT_NE(comm_error([] {
              decode_transfer_meta(meta_of({2}, static_cast<int>(c10::ScalarType::ComplexFloat)), kOrigin);
            }).find("does not carry"),
            std::string::npos);
  // An undefined tensor's fields are not read: nothing follows it.
  EXPECT_FALSE(decode_transfer_meta(meta_of({-5}, 999, /*defined=*/false), kOrigin)[0].defined);
}

}  // namespace
}  // namespace parallax::pipeline::detail
