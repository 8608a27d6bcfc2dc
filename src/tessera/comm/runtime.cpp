// MPI backend and the runtime. mpi.h stays inside this file.
#include "tessera/comm/runtime.hpp"

#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "tessera/comm/local_communicator.hpp"
#include "tessera/core/bf16.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

namespace {

int to_int(std::size_t n) {
  TESSERA_CHECK(n <= static_cast<std::size_t>(INT_MAX),
                "message of {} elements exceeds MPI's int counts", n);
  return static_cast<int>(n);
}

class MpiCommunicator;

// A non-blocking MPI operation; records its end in the log when it completes.
class MpiRequest final : public Request::Impl {
 public:
  MpiRequest(MPI_Request r, CollectiveLog* log, std::uint64_t seq, std::vector<int> keep1 = {},
             std::vector<int> keep2 = {})
      : req_(r), log_(log), seq_(seq), keep1_(std::move(keep1)), keep2_(std::move(keep2)) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL) wait();
  }
  bool test() override {
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (done) log_->end(seq_);
    return done != 0;
  }
  void wait() override {
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
    log_->end(seq_);
  }

 private:
  MPI_Request req_;
  CollectiveLog* log_;
  std::uint64_t seq_;
  std::vector<int> keep1_, keep2_;  // counts/displacements must outlive the operation
};

// MPI's user reduction: inout[i] = bf16(in[i] + inout[i]).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = fp32_to_bf16(bf16_to_fp32(a[i]) + bf16_to_fp32(b[i]));
}
MPI_Op make_bf16_sum() {
  MPI_Op op;
  MPI_Op_create(&bf16_sum, 1, &op);  // commutative
  return op;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, CollectiveLog* log, bool owned)
      : comm_(comm), name_(std::move(name)), log_(log), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&bf16_sum_);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  struct Scope {
    CollectiveLog* log;
    std::uint64_t seq;
    ~Scope() { log->end(seq); }
  };
  Scope scope(const char* op, std::size_t bytes) {
    return {log_, log_->begin(op, name_, size_, bytes)};
  }

  void all_reduce_sum(float* buf, std::size_t n) override {
    auto s = scope("all_reduce", n * 4);
    MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n), MPI_FLOAT, MPI_SUM, comm_);
  }
  void all_reduce_sum(double* buf, std::size_t n) override {
    auto s = scope("all_reduce", n * 8);
    MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n), MPI_DOUBLE, MPI_SUM, comm_);
  }
  void all_reduce_max(double* buf, std::size_t n) override {
    auto s = scope("all_reduce_max", n * 8);
    MPI_Allreduce(MPI_IN_PLACE, buf, to_int(n), MPI_DOUBLE, MPI_MAX, comm_);
  }
  void reduce_scatter_sum(const float* in, float* out, std::size_t n) override {
    auto s = scope("reduce_scatter", n * 4 * size_);
    MPI_Reduce_scatter_block(in, out, to_int(n), MPI_FLOAT, MPI_SUM, comm_);
  }
  void all_gather(const float* in, float* out, std::size_t n) override {
    auto s = scope("all_gather", n * 4 * size_);
    const void* send = in == out + n * rank_ ? MPI_IN_PLACE : in;
    MPI_Allgather(send, to_int(n), MPI_FLOAT, out, to_int(n), MPI_FLOAT, comm_);
  }
  void all_gather(const std::uint16_t* in, std::uint16_t* out, std::size_t n) override {
    auto s = scope("all_gather_bf16", n * 2 * size_);
    const void* send = in == out + n * rank_ ? MPI_IN_PLACE : in;
    MPI_Allgather(send, to_int(n), MPI_UINT16_T, out, to_int(n), MPI_UINT16_T, comm_);
  }
  void broadcast(float* buf, std::size_t n, int root) override {
    auto s = scope("broadcast", n * 4);
    MPI_Bcast(buf, to_int(n), MPI_FLOAT, root, comm_);
  }
  void broadcast_bytes(void* buf, std::size_t n, int root) override {
    auto s = scope("broadcast", n);
    MPI_Bcast(buf, to_int(n), MPI_BYTE, root, comm_);
  }
  void send(const float* buf, std::size_t n, int dst, int tag) override {
    auto s = scope("send", n * 4);
    MPI_Send(buf, to_int(n), MPI_FLOAT, dst, tag, comm_);
  }
  void recv(float* buf, std::size_t n, int src, int tag) override {
    auto s = scope("recv", n * 4);
    MPI_Recv(buf, to_int(n), MPI_FLOAT, src, tag, comm_, MPI_STATUS_IGNORE);
  }
  void barrier() override {
    auto s = scope("barrier", 0);
    MPI_Barrier(comm_);
  }

  Request iall_reduce_sum(float* buf, std::size_t n) override {
    auto seq = log_->begin("all_reduce", name_, size_, n * 4);
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n), MPI_FLOAT, MPI_SUM, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }
  Request ireduce_scatter_sum(const float* in, float* out,
                              const std::vector<std::size_t>& counts) override {
    TESSERA_CHECK(static_cast<int>(counts.size()) == size_);
    std::vector<int> c(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) c[i] = to_int(counts[i]), total += counts[i];
    auto seq = log_->begin("reduce_scatter", name_, size_, total * 4);
    MPI_Request r;
    // in == out: MPI_IN_PLACE, the input is the whole of `out` and the result lands at out[0..).
    const void* send = in == out ? MPI_IN_PLACE : in;
    MPI_Ireduce_scatter(send, out, c.data(), MPI_FLOAT, MPI_SUM, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq, std::move(c)));
  }
  Request iall_reduce_sum_bf16(std::uint16_t* buf, std::size_t n) override {
    auto seq = log_->begin("all_reduce_bf16", name_, size_, n * 2);
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(n), MPI_UINT16_T, bf16_sum_, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }
  Request ireduce_scatter_sum_bf16(const std::uint16_t* in, std::uint16_t* out,
                                   const std::vector<std::size_t>& counts) override {
    TESSERA_CHECK(static_cast<int>(counts.size()) == size_);
    std::vector<int> c(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) c[i] = to_int(counts[i]), total += counts[i];
    auto seq = log_->begin("reduce_scatter_bf16", name_, size_, total * 2);
    MPI_Request r;
    const void* send = in == out ? MPI_IN_PLACE : in;
    MPI_Ireduce_scatter(send, out, c.data(), MPI_UINT16_T, bf16_sum_, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq, std::move(c)));
  }
  Request iall_gather(const float* in, float* out,
                      const std::vector<std::size_t>& counts) override {
    TESSERA_CHECK(static_cast<int>(counts.size()) == size_);
    std::vector<int> c(counts.size()), d(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i)
      c[i] = to_int(counts[i]), d[i] = to_int(total), total += counts[i];
    auto seq = log_->begin("all_gather", name_, size_, total * 4);
    MPI_Request r;
    const void* send = in == out + d[rank_] ? MPI_IN_PLACE : in;
    MPI_Iallgatherv(send, c[rank_], MPI_FLOAT, out, c.data(), d.data(), MPI_FLOAT, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq, std::move(c), std::move(d)));
  }
  Request isend(const float* buf, std::size_t n, int dst, int tag) override {
    auto seq = log_->begin("send", name_, size_, n * 4);
    MPI_Request r;
    MPI_Isend(buf, to_int(n), MPI_FLOAT, dst, tag, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }
  Request irecv(float* buf, std::size_t n, int src, int tag) override {
    auto seq = log_->begin("recv", name_, size_, n * 4);
    MPI_Request r;
    MPI_Irecv(buf, to_int(n), MPI_FLOAT, src, tag, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }
  Request isend(const std::uint16_t* buf, std::size_t n, int dst, int tag) override {
    auto seq = log_->begin("send_bf16", name_, size_, n * 2);
    MPI_Request r;
    MPI_Isend(buf, to_int(n), MPI_UINT16_T, dst, tag, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }
  Request irecv(std::uint16_t* buf, std::size_t n, int src, int tag) override {
    auto seq = log_->begin("recv_bf16", name_, size_, n * 2);
    MPI_Request r;
    MPI_Irecv(buf, to_int(n), MPI_UINT16_T, src, tag, comm_, &r);
    return Request(std::make_unique<MpiRequest>(r, log_, seq));
  }

  MPI_Comm handle() const { return comm_; }

 private:
  MPI_Comm comm_;
  MPI_Op bf16_sum_ = make_bf16_sum();  // freed with the communicator
  std::string name_;
  CollectiveLog* log_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

bool launched_by_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  const char* nt = std::getenv("SLURM_NTASKS");
  return std::getenv("SLURM_PROCID") && nt && std::atoi(nt) > 1;
}

}  // namespace

std::unique_ptr<Runtime> Runtime::create(const RuntimeOptions& opt) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->log_ = std::make_unique<CollectiveLog>();
  if (opt.force_mpi || launched_by_mpi_launcher()) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    rt->mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rt->world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &rt->world_size_);
    MPI_Comm node = MPI_COMM_NULL;  // the ranks sharing this machine's memory
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &rt->local_rank_);
    MPI_Comm_free(&node);
    rt->world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", rt->log_.get(), false);
    rt->timeout_s_ = opt.collective_timeout_s;
    if (rt->world_size_ > 1) rt->start_watchdog();
  } else {
    rt->world_ = std::make_unique<LocalCommunicator>("world");
  }
  return rt;
}

Runtime::~Runtime() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  groups_.clear();
  world_.reset();
  if (mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

Communicator& Runtime::world() {
  return *world_;
}

Communicator& Runtime::group(const Topology& topo, AxisSet axes) {
  std::string key = topo.shape().describe() + "/" + axes.name();
  auto it = groups_.find(key);
  if (it != groups_.end()) return *it->second;
  std::string name = axes.name().empty() ? "self" : axes.name();
  std::unique_ptr<Communicator> c;
  if (!mpi_ || topo.group_size(axes) == 1) {
    // Every rank still takes part in the split below when under MPI, so that the calls stay
    // collective; a group of one needs no communicator of its own.
    if (mpi_) {
      MPI_Comm dummy;
      MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, 0, &dummy);
    }
    c = std::make_unique<LocalCommunicator>(name);
  } else {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, topo.group_color(axes), topo.group_rank(axes), &comm);
    c = std::make_unique<MpiCommunicator>(comm, name, log_.get(), true);
  }
  auto& ref = *c;
  groups_.emplace(key, std::move(c));
  return ref;
}

void Runtime::abort(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Runtime::start_watchdog() {
  watchdog_ = std::thread([this] {
    while (!stop_) {
      for (int i = 0; i < 5 && !stop_; ++i) ::usleep(100000);
      if (stop_) return;
      const double timeout_s = timeout_s_;
      CollectiveRecord r;
      if (timeout_s > 0 && log_->oldest_in_flight(r) && log_->now() - r.start > timeout_s) {
        std::fprintf(
            stderr,
            "error: rank %d: collective #%llu %s over group '%s' (%d ranks, %zu bytes) has not "
            "completed "
            "after %.0f s: a peer rank died or is stuck (hint: see the other ranks' messages; the "
            "timeout is parallel.timeout_s)\nrank %d collective log (newest last):\n%s",
            world_rank_, static_cast<unsigned long long>(r.seq), r.op.c_str(), r.group.c_str(),
            r.group_size, r.bytes, timeout_s, world_rank_, log_->dump().c_str());
        std::fflush(stderr);
        // The main thread is blocked inside MPI (FUNNELED): leave without MPI; the launcher sees a
        // rank exit with an error and ends the others.
        std::_Exit(3);
      }
    }
  });
}

}  // namespace tessera::comm
