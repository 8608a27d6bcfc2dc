// Aligned, owning buffers. One buffer per tensor family (parameters, gradients, moments,
// activations); tensors are views carved from it by offsets.
#pragma once

#include <sys/mman.h>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace tessera {

inline constexpr std::size_t k_buffer_alignment = 64;

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        mapped_(std::exchange(o.mapped_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_ = std::exchange(o.mapped_, 0);
    }
    return *this;
  }
  ~Buffer() { release(); }

  // Whether a mapped buffer's pages are backed by memory only where written (Lazy) or all at
  // once (Resident).
  enum class Pages { Lazy, Resident };

  // Resizes to n elements, zero-filled (contents are not preserved). Buffers of 1 MiB or more
  // are anonymous memory maps: the system's zero pages, backed by memory only where written, so
  // a model whose packed weights replace most of its fp32 parameters never holds those. With
  // Pages::Resident every page is backed at once instead (MAP_POPULATE): for a buffer that is
  // filled a little at a time inside a timed loop, such as a decoder's KV cache, where each
  // first write to a page would otherwise stop that loop for a page fault.
  void resize(std::size_t n, Pages pages = Pages::Lazy) {
    release();
    if (n == 0) return;
    std::size_t bytes =
        (n * sizeof(T) + k_buffer_alignment - 1) / k_buffer_alignment * k_buffer_alignment;
    if (bytes >= k_map_bytes) {
      const int populate = pages == Pages::Resident ? MAP_POPULATE : 0;
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate,
                     -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<T*>(p);
      mapped_ = bytes;
    } else {
      data_ = static_cast<T*>(std::aligned_alloc(k_buffer_alignment, bytes));
      if (!data_) throw std::bad_alloc();
      std::memset(static_cast<void*>(data_), 0, bytes);
    }
    size_ = n;
  }
  void zero() {
    if (data_) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(T));
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  static constexpr std::size_t k_map_bytes = std::size_t(1) << 20;
  void release() {
    if (mapped_)
      munmap(static_cast<void*>(data_), mapped_);
    else
      std::free(data_);
    data_ = nullptr;
    size_ = 0;
    mapped_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;  // bytes of the memory map holding data_, or 0 (aligned_alloc)
};

}  // namespace tessera
