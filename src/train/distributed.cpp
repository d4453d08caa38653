#include "train/distributed.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "quiver/error.h"
#include "train/checkpoint.h"

namespace quiver::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::vector<Range> shard_ranges(int64_t num_params, int world, int64_t align) {
  QV_CHECK(world >= 1, "shard_ranges: world must be ≥ 1, got {}", world);
  QV_CHECK(align >= 1, "shard_ranges: align must be ≥ 1, got {}", align);
  QV_CHECK(num_params >= 0, "shard_ranges: num_params must be ≥ 0, got {}", num_params);
  // Whole aligned units dealt out as evenly as possible; the last rank also takes the tail.
  const int64_t units = num_params / align;
  std::vector<Range> out(static_cast<size_t>(world));
  int64_t at = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t mine = units / world + (r < units % world ? 1 : 0);
    out[r].begin = at;
    at += mine * align;
    out[r].end = r + 1 == world ? num_params : at;
  }
  return out;
}

std::vector<Bucket> bucket_plan(const std::vector<model::ParamInfo>& table, int64_t cap_bytes) {
  QV_CHECK(cap_bytes >= 1, "bucket_plan: the bucket size must be ≥ 1 byte, got {}", cap_bytes);
  std::vector<Bucket> out;
  for (size_t k = table.size(); k-- > 0;) {
    const model::ParamInfo& p = table[k];
    const int64_t bytes = p.numel * static_cast<int64_t>(sizeof(float));
    const bool fits = !out.empty() && (out.back().range.size() * static_cast<int64_t>(sizeof(float)) + bytes) <= cap_bytes;
    if (!fits) out.push_back(Bucket{Range{p.offset, p.offset + p.numel}, {}});
    Bucket& b = out.back();
    QV_CHECK(p.offset + p.numel <= b.range.begin || b.params.empty(),
             "bucket_plan: parameter '{}' overlaps the next one in the flat buffer", p.name);
    b.range.begin = p.offset;
    b.params.push_back(k);
  }
  return out;
}

size_t buckets_complete(const std::vector<Bucket>& plan, size_t first_final) {
  size_t complete = 0;
  while (complete < plan.size() && plan[complete].params.back() >= first_final) ++complete;
  return complete;
}

OptimizerShard optimizer_shard(std::vector<ParamSegment> segments, int64_t num_params, int rank, int world) {
  QV_CHECK(world >= 1 && rank >= 0 && rank < world, "optimizer shard: rank {} of {} is not a valid rank", rank,
           world);
  OptimizerShard out;
  out.shards = shard_ranges(num_params, world, model::kParamAlign);
  out.range = out.shards[static_cast<size_t>(rank)];
  for (const ParamSegment& s : sorted_segments(std::move(segments), num_params, "optimizer shard")) {
    const int64_t begin = std::max(s.offset, out.range.begin), end = std::min(s.offset + s.numel, out.range.end);
    if (begin < end) out.segments.push_back({begin - out.range.begin, end - begin, s.decay, s.trainable});
  }
  return out;
}

std::vector<Range> split_by_shards(Range range, const std::vector<Range>& shards) {
  QV_CHECK(range.begin <= range.end, "split_by_shards: the range [{}, {}) is reversed", range.begin, range.end);
  std::vector<Range> parts;
  for (const Range& s : shards) parts.push_back({std::clamp(range.begin, s.begin, s.end), std::clamp(range.end, s.begin, s.end)});
  return parts;
}

Range rank_rows(int64_t global_batch, int rank, int world) {
  QV_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of {} is not a valid rank", rank, world);
  QV_CHECK(global_batch % world == 0,
           "the global micro-batch of {} sequences does not divide among {} GPUs; give a multiple of {}",
           global_batch, world, world);
  const int64_t per = global_batch / world;
  return {rank * per, (rank + 1) * per};
}

std::string rendezvous_file(const std::string& path, int rank, const std::string& payload,
                            std::chrono::milliseconds timeout) {
  if (rank == 0) {
    write_text_atomic(path, payload);
    return payload;
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!fs::exists(path)) {
    QV_CHECK(Clock::now() < deadline, "rendezvous: rank {} waited {} ms for rank 0 to write '{}'", rank,
             timeout.count(), path);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in.good(), "rendezvous: cannot read '{}'", path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

namespace {

// A socket closed on scope exit.
struct Socket {
  int fd = -1;
  explicit Socket(int f) : fd(f) {}
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
};

sockaddr_in address_of(const std::string& host, int port) {
  QV_CHECK(port > 0 && port < 65536, "rendezvous: port {} is outside [1, 65535]", port);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  QV_CHECK(::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1, "rendezvous: '{}' is not an IPv4 address", host);
  return a;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Sends or receives exactly n bytes before the deadline.
void transfer(int fd, char* data, size_t n, bool send, Clock::time_point deadline, const std::string& where) {
  size_t done = 0;
  while (done < n) {
    pollfd p{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    QV_CHECK(ready > 0, "rendezvous at {}: timed out while {} the payload", where, send ? "sending" : "receiving");
    const ssize_t k = send ? ::send(fd, data + done, n - done, MSG_NOSIGNAL) : ::recv(fd, data + done, n - done, 0);
    QV_CHECK(k > 0, "rendezvous at {}: the connection closed early ({})", where, k < 0 ? std::strerror(errno) : "EOF");
    done += static_cast<size_t>(k);
  }
}

}  // namespace

std::string rendezvous_tcp(const std::string& host, int port, int rank, int world, const std::string& payload,
                           std::chrono::milliseconds timeout) {
  QV_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of {} is not a valid rank", rank, world);
  const std::string where = host + ":" + std::to_string(port);
  const sockaddr_in addr = address_of(host, port);
  const Clock::time_point deadline = Clock::now() + timeout;
  if (rank == 0) {
    Socket server(::socket(AF_INET, SOCK_STREAM, 0));
    QV_CHECK(server.fd >= 0, "rendezvous: socket: {}", std::strerror(errno));
    const int one = 1;
    ::setsockopt(server.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    QV_CHECK(::bind(server.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0,
             "rendezvous: cannot listen on {}: {}", where, std::strerror(errno));
    QV_CHECK(::listen(server.fd, world) == 0, "rendezvous: listen on {}: {}", where, std::strerror(errno));
    uint32_t size = htonl(static_cast<uint32_t>(payload.size()));
    for (int served = 1; served < world; ++served) {
      pollfd p{server.fd, POLLIN, 0};
      QV_CHECK(::poll(&p, 1, remaining_ms(deadline)) > 0,
               "rendezvous: rank 0 waited {} ms on {} and {} of {} ranks connected", timeout.count(), where,
               served - 1, world - 1);
      Socket peer(::accept(server.fd, nullptr, nullptr));
      QV_CHECK(peer.fd >= 0, "rendezvous: accept on {}: {}", where, std::strerror(errno));
      transfer(peer.fd, reinterpret_cast<char*>(&size), sizeof(size), true, deadline, where);
      transfer(peer.fd, const_cast<char*>(payload.data()), payload.size(), true, deadline, where);
    }
    return payload;
  }
  while (true) {
    Socket client(::socket(AF_INET, SOCK_STREAM, 0));
    QV_CHECK(client.fd >= 0, "rendezvous: socket: {}", std::strerror(errno));
    if (::connect(client.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      uint32_t size = 0;
      transfer(client.fd, reinterpret_cast<char*>(&size), sizeof(size), false, deadline, where);
      std::string out(ntohl(size), '\0');
      transfer(client.fd, out.data(), out.size(), false, deadline, where);
      return out;
    }
    QV_CHECK(Clock::now() < deadline, "rendezvous: rank {} could not reach rank 0 at {} within {} ms ({})", rank,
             where, timeout.count(), std::strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RendezvousSpec parse_rendezvous(const std::string& spec) {
  RendezvousSpec r;
  constexpr std::string_view kTcp = "tcp://";
  if (spec.rfind(kTcp, 0) != 0) {
    QV_CHECK(!spec.empty(), "rendezvous: the description is empty (a file path or tcp://ADDRESS:PORT)");
    r.path = spec;
    return r;
  }
  const std::string rest = spec.substr(kTcp.size());
  const size_t colon = rest.rfind(':');
  QV_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < rest.size(),
           "rendezvous: '{}' is not tcp://ADDRESS:PORT", spec);
  r.tcp = true;
  r.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const long p = std::strtol(port.c_str(), &end, 10);
  QV_CHECK(errno == 0 && *end == '\0' && p > 0 && p < 65536, "rendezvous: '{}': the port '{}' is not in [1, 65535]",
           spec, port);
  r.port = static_cast<int>(p);
  address_of(r.host, r.port);  // an IPv4 address, or an error naming it
  return r;
}

std::string rendezvous(const std::string& spec, int rank, int world, const std::string& payload,
                       std::chrono::milliseconds timeout) {
  const RendezvousSpec r = parse_rendezvous(spec);
  if (r.tcp) return rendezvous_tcp(r.host, r.port, rank, world, payload, timeout);
  return rendezvous_file(r.path, rank, payload, timeout);
}

}  // namespace quiver::train
