// The skinny kernel without a GPU: the plan of a call, and the call itself on the CPU emulation
// (skinny_emu.h), through the same plan_call and w4::launch as the extension. Built and driven by
// tests/support/skinny_emulator.py; not part of the extension.
//
//   skinny_emulate --plan    reads requests from stdin, one a line, and prints one line each:
//                            "plan" and the kPlanFields values of plan_values, or "error" and why
//   skinny_emulate IN OUT    runs one call (not in the plan-only build, -DW4_PLAN_ONLY=1)
//
// A request line: m n k group_size symmetric engine kernel split, the DeviceLimits fields
// (num_sms warp_size max_shared smem_per_sm compute_capability), then the kPolicyFields policy
// values. IN: a request line, a line "bf16 has_bias stride_xm scale_offset", then little-endian
// arrays: x (m * stride_xm u16), qweight (n * k / 8 u32), scales (n * k / group_size u16), zeros
// (n / 8 * k / group_size u32, asymmetric only), bias (n u16, if any). scale_offset > 0 places the
// scales that many elements into their buffer (a view only 2-byte aligned). OUT: y (m * n u16);
// stderr ends with the plan line of the call. Exit status 2: bad input; 3: the launch deadlocked or
// did not finish in time; 4: the plan refused the request (stderr: the error line).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "skinny_plan.h"

#if !defined(W4_PLAN_ONLY)
#include <chrono>
#include <future>
#include <vector>
#endif

namespace {

struct Request {
  w4::PlanRequest call;
  w4::DeviceLimits limits{};
  w4::SkinnyPolicy policy{};
};

// Parses a request line into `out`; returns "" or what is wrong with it.
std::string parse_request(const std::string& line, Request& out) {
  std::istringstream in(line);
  int symmetric = 0;
  int64_t limits[w4::kDeviceLimitFields];
  double policy[w4::kPolicyFields];
  in >> out.call.m >> out.call.n >> out.call.k >> out.call.group_size >> symmetric >> out.call.engine >>
      out.call.kernel >> out.call.split;
  for (int64_t& v : limits) in >> v;
  for (double& v : policy) in >> v;
  if (!in) return "a request line holds m n k group_size symmetric engine kernel split, 5 device limits and " +
                  std::to_string(w4::kPolicyFields) + " policy values, got '" + line + "'";
  out.call.symmetric = symmetric != 0;
  std::string error = w4::parse_device_limits(limits, w4::kDeviceLimitFields, out.limits);
  if (error.empty()) error = w4::parse_policy(policy, w4::kPolicyFields, out.policy);
  return error;
}

std::string plan_line(const w4::SkinnyPlan& plan) {
  if (!plan.error.empty()) return "error " + plan.error;
  int64_t values[w4::kPlanFields];
  w4::plan_values(plan, values);
  std::string line = "plan";
  for (int64_t v : values) line += " " + std::to_string(v);
  return line;
}

int plan_mode() {
  char buffer[4096];
  while (std::fgets(buffer, sizeof(buffer), stdin) != nullptr) {
    std::string line(buffer);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.empty()) continue;
    Request r;
    const std::string error = parse_request(line, r);
    const std::string out = error.empty() ? plan_line(w4::plan_call(r.call, r.policy, r.limits)) : "error " + error;
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

#if !defined(W4_PLAN_ONLY)
// An exact-size heap buffer (so that AddressSanitizer sees every overrun), 16-byte aligned.
void* alloc_exact(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 16, bytes == 0 ? 16 : bytes) != 0) std::abort();
  return p;
}

bool read_into(std::FILE* f, void* dst, size_t bytes) { return std::fread(dst, 1, bytes, f) == bytes; }

bool read_line(std::FILE* f, std::string& line) {
  line.clear();
  for (int c = std::fgetc(f); c != EOF && c != '\n'; c = std::fgetc(f)) line += static_cast<char>(c);
  return !line.empty();
}

int call_mode(const char* in_path, const char* out_path) {
  std::FILE* in = std::fopen(in_path, "rb");
  if (in == nullptr) return 2;
  std::string request_line, layout_line;
  Request r;
  if (!read_line(in, request_line) || !read_line(in, layout_line)) return 2;
  const std::string error = parse_request(request_line, r);
  if (!error.empty()) {
    std::fprintf(stderr, "error %s\n", error.c_str());
    return 2;
  }
  int64_t bf16_flag = 0, has_bias_flag = 0, stride = 0, scale_offset = 0;
  if (std::sscanf(layout_line.c_str(), "%lld %lld %lld %lld", reinterpret_cast<long long*>(&bf16_flag),
                  reinterpret_cast<long long*>(&has_bias_flag), reinterpret_cast<long long*>(&stride),
                  reinterpret_cast<long long*>(&scale_offset)) != 4) {
    return 2;
  }
  const w4::SkinnyPlan plan = w4::plan_call(r.call, r.policy, r.limits);
  if (!plan.error.empty()) {
    std::fprintf(stderr, "%s\n", plan_line(plan).c_str());
    return 4;
  }
  const int64_t m = r.call.m, n = r.call.n, k = r.call.k, g = r.call.group_size;
  const bool bf16 = bf16_flag != 0, sym = r.call.symmetric, has_bias = has_bias_flag != 0;
  const size_t x_bytes = static_cast<size_t>(m * stride * 2), q_bytes = static_cast<size_t>(n * k / 2);
  const size_t s_count = static_cast<size_t>(n * (k / g)), z_bytes = sym ? 0 : static_cast<size_t>(n / 8 * (k / g) * 4);
  void* x = alloc_exact(x_bytes);
  void* q = alloc_exact(q_bytes);
  auto* s_buf = static_cast<unsigned short*>(alloc_exact((s_count + static_cast<size_t>(scale_offset)) * 2));
  void* z = sym ? nullptr : alloc_exact(z_bytes);
  void* bias = has_bias ? alloc_exact(static_cast<size_t>(n) * 2) : nullptr;
  void* y = alloc_exact(static_cast<size_t>(m * n * 2));
  bool ok = read_into(in, x, x_bytes) && read_into(in, q, q_bytes) && read_into(in, s_buf + scale_offset, s_count * 2);
  if (!sym) ok = ok && read_into(in, z, z_bytes);
  if (has_bias) ok = ok && read_into(in, bias, static_cast<size_t>(n) * 2);
  std::fclose(in);
  if (!ok) {
    std::fprintf(stderr, "short input file\n");
    return 2;
  }

  w4::SkinnyParams p{};
  p.x = x;
  p.qweight = static_cast<const uint32_t*>(q);
  p.scales = s_buf + scale_offset;
  p.zeros = static_cast<const uint32_t*>(z);
  p.bias = bias;
  p.y = y;
  p.stride_xm = stride;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.group_size = static_cast<int>(g);
  std::vector<float> partials(static_cast<size_t>(plan.workspace_floats));
  p.partials = partials.empty() ? nullptr : partials.data();

  if (n > 0) {
    auto run = std::async(std::launch::async, [&] { w4::launch(p, plan, bf16, nullptr); });
    if (run.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      std::fprintf(stderr, "the emulated launch did not finish in 120 s\n");
      std::fflush(stderr);
      std::_Exit(3);
    }
    run.get();
  }

  std::FILE* out = std::fopen(out_path, "wb");
  const size_t y_bytes = static_cast<size_t>(m * n * 2);
  if (out == nullptr || std::fwrite(y, 1, y_bytes, out) != y_bytes) return 2;
  std::fclose(out);
  std::fprintf(stderr, "%s\n", plan_line(plan).c_str());
  std::free(x);
  std::free(q);
  std::free(s_buf);
  std::free(z);
  std::free(bias);
  std::free(y);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--plan") == 0) return plan_mode();
#if !defined(W4_PLAN_ONLY)
  if (argc == 3) return call_mode(argv[1], argv[2]);
  std::fprintf(stderr, "usage: %s --plan < requests, or %s IN OUT\n", argv[0], argv[0]);
#else
  std::fprintf(stderr, "usage: %s --plan < requests (this build plans only)\n", argv[0]);
#endif
  return 2;
}
