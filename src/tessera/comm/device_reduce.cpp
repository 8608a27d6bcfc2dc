#include "tessera/comm/device_reduce.hpp"

#include "tessera/core/error.hpp"

#ifndef TESSERA_WITH_CUDA

namespace tessera::comm {
std::unique_ptr<DeviceReducer> make_device_reducer(Communicator&, DeviceReduce) {
  throw Error("summing GPU buffers over ranks needs the CUDA backend; this build has none",
              "build with the CUDA toolkit (scripts/setup --with-cuda, then make)");
}
}  // namespace tessera::comm

#else

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tessera/kernels/cuda/check.hpp"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define TESSERA_HAVE_NCCL_HEADER 1
#endif

namespace tessera::comm {

namespace {

// Which GPU this rank drives, as one 64-bit value: FNV-1a of the host name and the device's PCI
// bus id, so that two ranks on one device (of one host) give the same value.
std::uint64_t device_identity() {
  int dev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&dev));
  char bus[64] = {};
  TESSERA_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, dev));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::uint64_t h = 1469598103934665603ull;
  for (const char* s : {static_cast<const char*>(host), "/", static_cast<const char*>(bus)})
    for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

// The first two ranks of the group that drive the same GPU, or {-1, -1}.
std::array<int, 2> ranks_sharing_a_gpu(Communicator& group) {
  const std::uint64_t id = device_identity();
  std::array<std::uint16_t, 4> mine{};
  std::memcpy(mine.data(), &id, sizeof id);
  std::vector<std::uint16_t> all(4 * static_cast<std::size_t>(group.size()));
  group.all_gather(mine.data(), all.data(), 4);
  for (int i = 0; i < group.size(); ++i)
    for (int j = i + 1; j < group.size(); ++j)
      if (std::memcmp(&all[4 * i], &all[4 * j], 4 * sizeof(std::uint16_t)) == 0) return {i, j};
  return {-1, -1};
}

// ---- host-staged ----

class HostStagedReducer final : public DeviceReducer {
 public:
  HostStagedReducer(Communicator& group, std::string why)
      : group_(group), describe_("host-staged through MPI (" + std::move(why) + ")") {}
  ~HostStagedReducer() override {
    if (host_) cudaFreeHost(host_);
  }
  void all_reduce_sum(float* device_buf, std::size_t n, void* stream) override {
    auto st = static_cast<cudaStream_t>(stream);
    if (n > capacity_) {
      if (host_) TESSERA_CUDA_CHECK(cudaFreeHost(host_));
      host_ = nullptr;
      TESSERA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), n * sizeof(float)));
      capacity_ = n;
    }
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(host_, device_buf, n * sizeof(float), cudaMemcpyDeviceToHost, st));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(st));
    group_.all_reduce_sum(host_, n);
    TESSERA_CUDA_CHECK(
        cudaMemcpyAsync(device_buf, host_, n * sizeof(float), cudaMemcpyHostToDevice, st));
    // The host buffer is read by the copy just queued; the next call's copy into it is queued
    // on the same stream behind it, and it waits for that stream before the host sum.
  }
  const std::string& describe() const override { return describe_; }

 private:
  Communicator& group_;
  std::string describe_;
  float* host_ = nullptr;  // pinned
  std::size_t capacity_ = 0;
};

// ---- NCCL, loaded at run time ----

#ifdef TESSERA_HAVE_NCCL_HEADER
struct NcclApi {
  void* lib = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  int version = 0;
  std::string error;  // why NCCL cannot be used ("" when it can)
};

// The NCCL library of this machine, loaded once per process.
const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    a.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a.lib) {
      const char* e = dlerror();
      a.error = fmt::format("libnccl.so.2 could not be loaded ({})", e ? e : "not found");
      return a;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)> >(dlsym(a.lib, name));
      if (!fn && a.error.empty()) a.error = fmt::format("libnccl.so.2 has no {}", name);
    };
    sym(a.get_version, "ncclGetVersion");
    sym(a.get_unique_id, "ncclGetUniqueId");
    sym(a.comm_init_rank, "ncclCommInitRank");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.async_error, "ncclCommGetAsyncError");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.error_string, "ncclGetErrorString");
    if (a.error.empty()) a.get_version(&a.version);
    return a;
  }();
  return api;
}

void nccl_check(const NcclApi& api, ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  throw Error(fmt::format("NCCL call failed: {}: {}", call, api.error_string(r)),
              "run with NCCL_DEBUG=WARN for NCCL's own account");
}

class NcclReducer final : public DeviceReducer {
 public:
  explicit NcclReducer(Communicator& group) : api_(nccl_api()) {
    ncclUniqueId id{};
    if (group.rank() == 0) nccl_check(api_, api_.get_unique_id(&id), "ncclGetUniqueId");
    group.broadcast_bytes(&id, sizeof id, 0);
    nccl_check(api_, api_.comm_init_rank(&comm_, group.size(), id, group.rank()),
               "ncclCommInitRank");
    describe_ = fmt::format("NCCL {}.{}.{}", api_.version / 10000, api_.version / 100 % 100,
                            api_.version % 100);
  }
  ~NcclReducer() override {
    if (comm_) api_.comm_destroy(comm_);
  }
  void all_reduce_sum(float* device_buf, std::size_t n, void* stream) override {
    nccl_check(api_,
               api_.all_reduce(device_buf, device_buf, n, ncclFloat32, ncclSum, comm_,
                               static_cast<cudaStream_t>(stream)),
               "ncclAllReduce");
    ncclResult_t async = ncclSuccess;
    nccl_check(api_, api_.async_error(comm_, &async), "ncclCommGetAsyncError");
    nccl_check(api_, async, "ncclAllReduce (asynchronous error)");
  }
  const std::string& describe() const override { return describe_; }

 private:
  const NcclApi& api_;
  ncclComm_t comm_ = nullptr;
  std::string describe_;
};

std::string nccl_unavailable_reason() {
  return nccl_api().error;
}
#else
std::string nccl_unavailable_reason() {
  return "built without nccl.h";
}
#endif

}  // namespace

std::unique_ptr<DeviceReducer> make_device_reducer(Communicator& group, DeviceReduce how) {
  if (how == DeviceReduce::Host)
    return std::make_unique<HostStagedReducer>(group, "chosen by the run's configuration");
  // Every rank must make the same choice: the reasons are gathered before anyone decides.
  const auto shared = ranks_sharing_a_gpu(group);
  const std::string missing = nccl_unavailable_reason();
  double no_nccl_somewhere = missing.empty() ? 0.0 : 1.0;
  group.all_reduce_max(&no_nccl_somewhere, 1);
  std::string why;
  if (shared[0] >= 0)
    why = fmt::format("ranks {} and {} share a GPU, which NCCL refuses", shared[0], shared[1]);
  else if (no_nccl_somewhere > 0)
    why = missing.empty() ? "NCCL is missing on another rank's machine" : missing;
  if (why.empty()) {
#ifdef TESSERA_HAVE_NCCL_HEADER
    return std::make_unique<NcclReducer>(group);
#endif
  }
  if (how == DeviceReduce::Nccl)
    throw Error("NCCL cannot sum the gradients: " + why,
                "give each rank its own GPU (as many ranks per node as GPUs), or let tessera "
                "stage the sums through the host");
  return std::make_unique<HostStagedReducer>(group, why);
}

}  // namespace tessera::comm

#endif
