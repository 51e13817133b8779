#include "io/json.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "mpt/error.hpp"

namespace mpt::io::json {

Value::Value() = default;
Value::Value(const Value&) = default;
Value::Value(Value&&) noexcept = default;
Value& Value::operator=(const Value&) = default;
Value& Value::operator=(Value&&) noexcept = default;
Value::~Value() = default;


namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(std::string_view s, const std::string& what) : s_(s), what_(what) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (pos_ != s_.size()) error("unexpected text after the value");
    return v;
  }

 private:
  [[noreturn]] void error(const char* msg) const { fail(what_, ": malformed JSON at offset ", pos_, ": ", msg); }

  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  bool consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  void expect(char c) {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != c) error(c == ':' ? "expected ':'" : "expected a delimiter");
    ++pos_;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) error("nesting too deep");
    skip_space();
    if (pos_ >= s_.size()) error("unexpected end of text");
    Value v;
    const char c = s_[pos_];
    if (c == '{') {
      v.kind = Value::Kind::Object;
      ++pos_;
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, v;
      for (;;) {
        skip_space();
        if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a member name");
        std::string key = string();
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Value::Kind::Array;
      ++pos_;
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, v;
      for (;;) {
        v.items.push_back(value(depth + 1));
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Value::Kind::String;
      v.text = string();
      return v;
    }
    if (consume("true")) { v.kind = Value::Kind::Bool, v.boolean = true; return v; }
    if (consume("false")) { v.kind = Value::Kind::Bool; return v; }
    if (consume("null")) return v;
    // Python's json writes these for non-finite floats.
    for (const char* w : {"NaN", "Infinity", "-Infinity"})
      if (consume(w)) { v.kind = Value::Kind::Number, v.text = w; return v; }
    v.kind = Value::Kind::Number;
    v.text = number_text();
    return v;
  }

  std::string number_text() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (!digits()) error("expected a value");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) error("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) error("expected an exponent");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) error("short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else error("bad \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) error("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) error("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: error("bad escape");
      }
    }
  }

  std::string_view s_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

}  // namespace

const Value* Value::find(const std::string& key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const Value& Value::at(const std::string& key, const std::string& where) const {
  const Value* v = find(key);
  MPT_CHECK(v != nullptr, where, ": missing '", key, "'");
  return *v;
}

const std::string& Value::as_string(const std::string& where) const {
  MPT_CHECK(kind == Kind::String, where, ": expected a string, found ", dump(*this));
  return text;
}

double Value::as_double(const std::string& where) const {
  MPT_CHECK(kind == Kind::Number, where, ": expected a number, found ", dump(*this));
  if (text == "NaN") return NAN;
  if (text == "Infinity") return INFINITY;
  if (text == "-Infinity") return -INFINITY;
  return std::strtod(text.c_str(), nullptr);
}

std::int64_t Value::as_int(const std::string& where) const {
  MPT_CHECK(kind == Kind::Number, where, ": expected an integer, found ", dump(*this));
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  MPT_CHECK(errno == 0 && end && *end == '\0', where, ": expected an integer, found ", text);
  return v;
}

std::uint64_t Value::as_uint(const std::string& where) const {
  MPT_CHECK(kind == Kind::Number && !text.empty() && text[0] != '-', where,
            ": expected a non-negative integer, found ", dump(*this));
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  MPT_CHECK(errno == 0 && end && *end == '\0', where, ": expected a non-negative integer, found ", text);
  return v;
}

bool Value::as_bool(const std::string& where) const {
  MPT_CHECK(kind == Kind::Bool, where, ": expected true or false, found ", dump(*this));
  return boolean;
}

const std::vector<Value>& Value::as_array(const std::string& where) const {
  MPT_CHECK(kind == Kind::Array, where, ": expected a list, found ", dump(*this));
  return items;
}

Value parse(std::string_view text, const std::string& what) { return Parser(text, what).document(); }

bool is_json(std::string_view text) {
  try {
    parse(text, "");
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string dump(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return v.boolean ? "true" : "false";
    case Value::Kind::Number: return v.text;
    case Value::Kind::String: return quote(v.text);
    case Value::Kind::Array: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + dump(v.items[i]);
      return out + "]";
    }
    case Value::Kind::Object: {
      std::string out = "{";
      for (std::size_t i = 0; i < v.members.size(); ++i)
        out += (i ? ", " : "") + quote(v.members[i].first) + ": " + dump(v.members[i].second);
      return out + "}";
    }
  }
  return "null";
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  // Keep floats recognisable as floats (Python reads "1" as an int).
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
std::string number(std::int64_t v) { return std::to_string(v); }
std::string number(std::uint64_t v) { return std::to_string(v); }

ObjectWriter& ObjectWriter::raw(const std::string& key, const std::string& json_text) {
  body_ += (body_.empty() ? "" : ", ") + quote(key) + ": " + json_text;
  return *this;
}

}  // namespace mpt::io::json
