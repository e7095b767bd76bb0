#include "synthetic_description.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "parallax/core/error.h"

namespace parallax::detail {
namespace {

// A synthetic node larger than any real one (a DGX H100 has 224 PUs, an 8-socket server
// under 2,000) is a typo, and hwloc would spend minutes and gigabytes building it. Its
// time grows with the square of a level's width: 4,096 cores under one parent take
// about 9 s, 1,024 a quarter of a second (a real level: at most 192 cores a package).
constexpr long long kMaxSyntheticPus = 1 << 14;
constexpr long long kMaxSyntheticArity = 1 << 10;
// Within those, wide levels over many PUs still cost hwloc seconds: "core:1024 pu:16" is
// 2^28 words of cpuset compared, 4.4 s under AddressSanitizer; 2^26 stays near a second
// there (and "pack:4 core:64 pu:64", 16,384 PUs, costs 2^22).
constexpr long long kMaxSiblingWork = 1 << 26;
constexpr unsigned long long kMaxBytes = 1ULL << 50;

const char* const kExample = "e.g. \"pack:2 numa:1 core:8 pu:2\"";

bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// Splits "pack:2 numa:2 core:8 pu:2 gpu:4" into hwloc's part (its items joined by one
// space) and the GPU count.
std::string strip_gpu_token(const std::string& description, int& gpus) {
  std::istringstream in(description);
  std::string token;
  std::string rest;
  bool have_gpus = false;
  gpus = 0;
  while (in >> token) {
    if (token.rfind("gpu:", 0) == 0) {
      const std::string count = token.substr(4);
      char* end = nullptr;
      long value = std::strtol(count.c_str(), &end, 10);
      PARALLAX_CHECK(!have_gpus && !count.empty() && *end == '\0' && value >= 0 && value <= 4096, TopologyError,
                     "bad synthetic topology '", description, "': '", token,
                     have_gpus ? "' repeats the GPU count" : "' should be gpu:N with N >= 0");
      gpus = static_cast<int>(value);
      have_gpus = true;
      continue;
    }
    rest += rest.empty() ? token : " " + token;
  }
  return rest;
}

// What is wrong with the attributes inside one "(...)" (hwloc 2.9: size= for caches,
// memory= for the others, indexes=; one space apart), or "". hwloc reads each number as
// it comes: an index makes it allocate a bitmap up to that index, a size shifted past 64
// bits wraps, and a malformed list is ignored without a word. Here every size is a
// decimal count of bytes (or kB, MB, GB, TB) of at most 1 PiB, and every index or step a
// decimal below kMaxSyntheticPus.
std::string bad_attributes(const std::string& inside) {
  std::istringstream attributes(inside);
  std::string attribute;
  bool any = false;
  while (attributes >> attribute) {
    any = true;
    const std::size_t equals = attribute.find('=');
    const std::string key = attribute.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : attribute.substr(equals + 1);
    if (key == "size" || key == "memory") {
      std::size_t digits = 0;
      unsigned long long bytes = 0;
      for (; digits < value.size() && is_digit(value[digits]); ++digits) {
        bytes = std::min(bytes * 10 + static_cast<unsigned long long>(value[digits] - '0'), kMaxBytes + 1);
      }
      std::string unit = value.substr(digits);
      std::transform(unit.begin(), unit.end(), unit.begin(), [](char c) { return static_cast<char>(std::toupper(c)); });
      const int shift = unit.empty() ? 0 : unit == "KB" ? 10 : unit == "MB" ? 20 : unit == "GB" ? 30 : unit == "TB" ? 40 : -1;
      if (digits == 0 || shift < 0 || (digits > 1 && value[0] == '0')) {
        return "'" + attribute + "': expected a decimal number of bytes, optionally followed by kB, MB, GB or TB";
      }
      if (bytes > (kMaxBytes >> shift)) return "'" + attribute + "': more than 1 PiB";
    } else if (key == "indexes") {
      // Level names ("pu:core"), steps ("2*4:1*2") or a list ("0,2,4,6"), as hwloc 2.9 reads them.
      const bool names = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
        return is_alpha(c) || c == ':';
      });
      if (names) continue;
      const bool steps = value.find('*') != std::string::npos;
      std::istringstream list(value);
      std::string item;
      bool empty = true;
      while (std::getline(list, item, steps ? ':' : ',')) {
        empty = false;
        const std::size_t star = steps ? item.find('*') : std::string::npos;
        for (const std::string& number : steps && star != std::string::npos
                                             ? std::vector<std::string>{item.substr(0, star), item.substr(star + 1)}
                                             : std::vector<std::string>{item}) {
          if (number.empty() || !std::all_of(number.begin(), number.end(), is_digit) ||
              (steps && star == std::string::npos)) {
            return "'" + attribute +
                   "': expected OS indexes as decimals separated by commas (e.g. indexes=0,2,4,6), an interleaving "
                   "of level names (indexes=pu:core) or of steps (indexes=2*4:1*2)";
          }
          if (number.size() > 5 || std::stoll(number) >= kMaxSyntheticPus) {
            return "'" + attribute + "': " + number + " is " + std::to_string(kMaxSyntheticPus) +
                   " or more (hwloc would allocate up to it)";
          }
        }
      }
      if (empty) return "'" + attribute + "': no indexes";
    } else {
      return "'" + attribute + "': expected size= (caches), memory= or indexes=";
    }
  }
  return any ? "" : "'()': no attributes";
}

// Reads hwloc's part by the grammar in the header; returns each level's count, outermost
// first. `fail` throws with the item at fault.
class LevelReader {
 public:
  LevelReader(const std::string& description, const std::string& text) : description_(description), text_(text) {}

  // What is wrong with the first attributes out of bounds, or "" (checked after the
  // levels' sizes, which the message of a description too large names first).
  const std::string& bad_attribute() const { return bad_attribute_; }

  std::vector<long long> levels() {
    std::vector<long long> counts;
    while (pos_ < text_.size()) {
      if (text_[pos_] == ' ') {
        ++pos_;
        continue;
      }
      start_ = pos_;
      if (text_[pos_] == '[') {
        memory_level();
      } else {
        counts.push_back(level());
      }
      if (pos_ < text_.size() && (is_alnum(text_[pos_]) || text_[pos_] == '[')) {
        fail("runs two levels together (separate levels with spaces, " + std::string(kExample) + ")");
      }
      if (pos_ < text_.size() && text_[pos_] != ' ') {
        fail("has '" + std::string(1, text_[pos_]) + "' where a space or the end was expected (" + kExample + ")");
      }
    }
    return counts;
  }

 private:
  // The item being read, up to the next space (or its attributes' ')').
  std::string item() const {
    const std::size_t close = text_.find(')', start_);
    std::size_t end = text_.find(' ', start_);
    const std::size_t open = text_.find('(', start_);
    if (open < end && close != std::string::npos) end = text_.find(' ', close);
    return text_.substr(start_, end == std::string::npos ? std::string::npos : end - start_);
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw TopologyError(detail::concat("bad synthetic topology '", description_, "': '", item(), "' ", what));
  }

  std::string type_name() {
    const std::size_t begin = pos_;
    if (pos_ < text_.size() && is_alpha(text_[pos_])) {
      while (pos_ < text_.size() && is_alnum(text_[pos_])) ++pos_;
    }
    return text_.substr(begin, pos_ - begin);
  }

  void attributes() {
    if (pos_ >= text_.size() || text_[pos_] != '(') return;
    const std::size_t close = text_.find(')', pos_);
    if (close == std::string::npos) fail("has '(' without ')'");
    if (bad_attribute_.empty()) bad_attribute_ = bad_attributes(text_.substr(pos_ + 1, close - pos_ - 1));
    pos_ = close + 1;
  }

  void memory_level() {
    ++pos_;
    if (type_name().empty()) fail("needs a memory level's type after '[' (e.g. \"[numa(memory=64GB)]\")");
    attributes();
    if (pos_ >= text_.size() || text_[pos_] != ']') fail("needs ']' right after the memory level's type or attributes");
    ++pos_;
  }

  long long level() {
    if (!type_name().empty()) {
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        fail("needs ':' and a count of objects right after its type (e.g. \"core:8\")");
      }
      ++pos_;
    }
    const std::size_t digits = pos_;
    long long count = 0;
    for (; pos_ < text_.size() && is_digit(text_[pos_]); ++pos_) {
      count = std::min(count * 10 + (text_[pos_] - '0'), kMaxSyntheticPus + 1);
    }
    // hwloc reads a count with strtoul and base 0: "+88601", "0x100" and "010" are
    // counts to it (88,601, 256 and 8). Only plain decimals are counted here.
    const bool more_letters = pos_ < text_.size() && is_alpha(text_[pos_]);
    const bool next_level = more_letters && text_.find(':', pos_) < text_.find(' ', pos_);
    if (pos_ == digits || (pos_ - digits > 1 && text_[digits] == '0') || (more_letters && !next_level)) {
      fail("needs a count of objects in plain decimal digits (e.g. \"pu:2\")");
    }
    attributes();
    return count;
  }

  const std::string& description_;
  const std::string& text_;
  std::size_t pos_ = 0;
  std::size_t start_ = 0;
  std::string bad_attribute_;
};

}  // namespace

SyntheticDescription check_synthetic_description(const std::string& description) {
  // hwloc reads a C string: a NUL would silently cut the description short. The
  // message cannot quote such a description (what() would end at the NUL), so it
  // names the offending byte instead.
  const auto unprintable = std::find_if(description.begin(), description.end(), [](char c) {
    return !std::isprint(static_cast<unsigned char>(c)) && !std::isspace(static_cast<unsigned char>(c));
  });
  PARALLAX_CHECK(unprintable == description.end(), TopologyError, "bad synthetic topology: byte ",
                 unprintable - description.begin(), " (code ", static_cast<int>(static_cast<unsigned char>(*unprintable)),
                 ") is neither printable ASCII nor white space");
  SyntheticDescription result;
  result.hwloc_part = strip_gpu_token(description, result.gpus);
  PARALLAX_CHECK(!result.hwloc_part.empty(), TopologyError, "bad synthetic topology '", description,
                 "': no hwloc levels (expected ", kExample, ")");
  LevelReader reader(description, result.hwloc_part);
  const std::vector<long long> levels = reader.levels();

  long long pus = 1;
  long long widest = 1;
  for (long long count : levels) {
    pus = std::min(pus * count, kMaxSyntheticPus + 1);
    widest = std::max(widest, count);
  }
  PARALLAX_CHECK(pus <= kMaxSyntheticPus, TopologyError, "bad synthetic topology '", description,
                 "': its levels multiply to more than ", kMaxSyntheticPus, " PUs (expected one node, ", kExample, ")");
  PARALLAX_CHECK(widest <= kMaxSyntheticArity, TopologyError, "bad synthetic topology '", description, "': a level of ",
                 widest, " objects under one parent, more than ", kMaxSyntheticArity, " (expected one node's levels, ",
                 kExample, ")");
  // hwloc inserts each object among its siblings comparing cpusets of the node's PUs:
  // each level above the PUs costs its objects x its width x the cpuset's words.
  long long objects = 1;
  long long sibling_work = 0;
  for (std::size_t level = 0; level + 1 < levels.size(); ++level) {
    objects = std::min(objects * levels[level], kMaxSyntheticPus + 1);
    sibling_work = std::min(sibling_work + objects * levels[level] * ((pus + 63) / 64), kMaxSiblingWork + 1);
  }
  PARALLAX_CHECK(sibling_work <= kMaxSiblingWork, TopologyError, "bad synthetic topology '", description,
                 "': its levels are too wide for this many PUs (hwloc would compare more than ", kMaxSiblingWork,
                 " words of cpusets to build it: each level's objects x its width x the PUs / 64; expected one "
                 "node's levels, ",
                 kExample, ")");
  PARALLAX_CHECK(reader.bad_attribute().empty(), TopologyError, "bad synthetic topology '", description,
                 "': a level's attribute ", reader.bad_attribute());
  return result;
}

}  // namespace parallax::detail
