// The model's forward and backward (both families, model/config.hpp) over explicit buffers (the
// llm.c model): parameters, gradients and
// activations each live in one contiguous buffer; the functions below take them as arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessera/core/buffer.hpp"
#include "tessera/core/team_barrier.hpp"
#include "tessera/kernels/cpu/bf16.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/kernels/profile.hpp"
#include "tessera/model/layout.hpp"

namespace tessera::model {

// GPT-2 initialization (both families): weights ~ N(0, 0.02), residual projections (attn.c_proj,
// mlp.c_proj; llama's o_proj, down_proj) scaled by 1/sqrt(2L), biases 0, norm weights 1, padded
// vocabulary rows 0. Deterministic for
// a seed whatever the thread count (each 64K-element chunk has its own stream).
void init_params(const ParamLayout& layout, float* params, std::uint64_t seed);

// Activations of one micro-batch (B, T), one buffer carved by offsets, plus backward scratch.
struct Activations {
  struct Layer {
    std::size_t ln1, ln1_mean, ln1_rstd;  // (B,T,C), (B,T), (B,T)
    std::size_t qkv;                      // (B,T,qkv_rows)
    std::size_t atty;                     // (B,T,C) attention output before projection
    std::size_t att_lse;                  // (B,NH,T)
    std::size_t res2;                     // (B,T,C) residual after attention
    std::size_t ln2, ln2_mean, ln2_rstd;  // (B,T,C), (B,T), (B,T)
    std::size_t fch, fch_gelu;            // (B,T,fc_rows), (B,T,ffn)
    std::size_t res3;                     // (B,T,C) layer output
  };
  int B = 0, T = 0;
  std::size_t encoded = 0;  // (B,T,C)
  std::vector<Layer> layers;
  std::size_t lnf = 0, lnf_mean = 0, lnf_rstd = 0;  // (B,T,C), (B,T), (B,T)
  std::size_t logits = 0;  // (B,T,Vp); holds dlogits after a training forward
  std::size_t losses = 0;  // (B,T)
  // backward scratch, reused by every layer
  std::size_t d_res = 0, d_ln = 0, d_atty = 0;  // (B,T,C)
  std::size_t d_qkv = 0;                        // (B,T,qkv_rows)
  std::size_t d_fch = 0;                        // (B,T,fc_rows)
  std::size_t d_act = 0;                        // (B,T,ffn), llama only
  Buffer<float> buf;
  // bf16 mixed precision: the GEMM operands rounded to bf16 (grown by the first pass)
  kernels::cpu::Bf16Scratch bf16;

  // (Re)allocates for a micro-batch shape; a no-op when the shape is unchanged.
  void allocate(const ModelConfig& cfg, int B, int T);
  float* at(std::size_t off) { return buf.data() + off; }
  const float* at(std::size_t off) const { return buf.data() + off; }
};

struct ForwardOptions {
  kernels::GemmLibrary gemm = kernels::GemmLibrary::OneDnn;
  // Training: the cross-entropy is fused with its backward and the logits buffer is
  // overwritten by dloss * dlogits, ready for backward(). Evaluation keeps the logits.
  bool training = false;
  float dloss = 0.0f;  // d(total loss)/d(per-position loss), e.g. 1 / (B*T*grad_accum)
  kernels::Profile* profile = nullptr;  // time per op family, if set
  // bf16 mixed precision (CpuBf16Ops): the bf16 copy of the whole flat parameter buffer (the
  // layout's offsets), which every GEMM reads instead of the fp32 parameters; null: fp32.
  const std::uint16_t* bf16_params = nullptr;
};

// ---- where the parameters and gradients are: blocks and stores ----
// The flat buffer is cut into blocks: 0 = embeddings (wte, wpe), 1..L = the layers, L+1 = the
// final LayerNorm. Blocks tile [0, layout.total()).
int num_blocks(const ParamLayout& layout);
std::size_t block_begin(const ParamLayout& layout, int block);
std::size_t block_end(const ParamLayout& layout, int block);

// forward/backward ask a store for each block's parameters and gradient buffer just before use,
// and tell it when they are done with them. A store can be one flat buffer (FlatStore), or
// shards gathered on demand with prefetch (ZeRO-3), or per-block gradient buffers that are
// reduce-scattered as soon as they are final (ZeRO-2).
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual void begin_forward() {}
  virtual void begin_backward() {}
  // The block's parameters, laid out as in the flat buffer from block_begin(block); valid until
  // release(block).
  virtual const float* params(int block) = 0;
  // Where backward ACCUMULATES the block's gradients (same layout).
  virtual float* grads(int block) = 0;
  virtual void release(int block) {}
  virtual void grads_done(int block) {}  // backward has finished the block's gradients
  virtual void progress() {}             // called between ops: drive non-blocking communication
};

// Hooks for data parallelism over a flat buffer: backward says when a range of the gradient
// buffer is final, in the order it completes them (ln_f, layers L-1 .. 0, then the embeddings;
// the ranges tile the whole buffer), and calls progress() between ops.
struct BackwardHooks {
  std::function<void(std::size_t begin, std::size_t end)> grads_ready;
  std::function<void()> progress;
};

class FlatStore final : public ParamStore {
 public:
  FlatStore(const ParamLayout& layout, const float* params, float* grads,
            const BackwardHooks* hooks = nullptr)
      : layout_(layout), params_(params), grads_(grads), hooks_(hooks) {}
  const float* params(int block) override;
  float* grads(int block) override;
  void grads_done(int block) override;
  void progress() override;

 private:
  const ParamLayout& layout_;
  const float* params_;
  float* grads_;
  const BackwardHooks* hooks_;
};

// inputs, targets: (B,T) token ids. targets may be null (logits only; returns 0).
// Returns the mean loss over positions whose target is >= 0.
float forward(const ParamLayout& layout, ParamStore& store, Activations& acts,
              const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
              const ForwardOptions& opt);
// bf16_params: as ForwardOptions' (the same as the forward's).
void backward(const ParamLayout& layout, ParamStore& store, Activations& acts,
              const std::int32_t* inputs, int B, int T, kernels::GemmLibrary gemm,
              kernels::Profile* profile = nullptr, const std::uint16_t* bf16_params = nullptr);
// The same over one flat parameter (and gradient) buffer.
float forward(const ParamLayout& layout, const float* params, Activations& acts,
              const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
              const ForwardOptions& opt);

// Gradients ACCUMULATE into grads (same layout as params). Requires a training forward() of the
// same micro-batch just before.
void backward(const ParamLayout& layout, const float* params, float* grads, Activations& acts,
              const std::int32_t* inputs, int B, int T, kernels::GemmLibrary gemm,
              kernels::Profile* profile = nullptr, const BackwardHooks* hooks = nullptr,
              const std::uint16_t* bf16_params = nullptr);

// ---- incremental decoding with a KV cache (sampling) ----
// A decoding step runs as one OpenMP parallel region: every thread of the team goes through the
// layers together, each computing its share of every product and of the attention, with a
// barrier where one needs what all computed (5 per layer for llama, 6 for GPT-2, instead of a
// fork and a join per operation, which cost ~1 us each on a 2-core machine against ~3-20 us of
// work).

// The share [begin, end) of n items that the calling thread of the current OpenMP team takes:
// contiguous runs whose sizes differ by at most one, in thread order; all of them for a thread
// outside a parallel region.
struct TeamShare {
  int begin, end;
};
TeamShare team_share(int n);

// The rows of a decoder product that the calling thread computes: whole groups of k_team_rows
// rows (the packed kernels' tile) in one run, `first`, shared as team_share shares the groups;
// or, for llama's gate_up (F gate rows, then F up rows; F a multiple of k_team_rows), the same
// share of the gate rows (`first`) and of the up rows (`second`), so that the thread's SwiGLU of
// the rows `first` needs only what it computed itself: the product then ends without a barrier
// (`barrier` false). One barrier fewer per layer (on SmolLM2's W4 decode on 2 vCPUs, steps
// alternated in one process: 0.985x), and SwiGLU reads no row the other thread wrote.
inline constexpr int k_team_rows = 8;
struct TeamRows {
  TeamShare first, second;  // second empty unless paired
  bool barrier;
};
TeamRows team_rows(int rows);                                       // one run; a barrier after it
TeamRows linear_rows(const ModelConfig& cfg, int which, int rows);  // `which` as DecoderLinear's

// out = W in (IC) + bias (may be null), or out += that when accumulate; W (rows, IC) fp32, by
// `lib` on the calling thread's `rows` (every thread of a team calls it; the caller then waits
// for the team where rows.barrier says so).
void team_linear(kernels::GemmLibrary lib, float* out, const float* in, const float* weight,
                 const float* bias, int IC, bool accumulate, const TeamRows& rows);

// A block linear of the decoder computed by someone else (a quantized model's packed weights):
// out (OC) = W in (IC) + bias (OC, may be null), or out += that when accumulate. `which` is the
// linear of `layer`: 0 qkv, 1 attention projection, 2 fc (gate_up), 3 fc projection (down).
// Called by every thread of the step's team with the same arguments except `in` (each thread's
// own copy of the same values); each computes the rows linear_rows gives it for the model and
// returns (the decoder waits for the team where those say so). It must not throw.
using DecoderLinear = std::function<void(int layer, int which, float* out, const float* in,
                                         const float* bias, bool accumulate)>;

// The same linears over N rows at once, numbered alike (0 qkv .. 3 fc projection): out (N, rows)
// = x (N, cols) W^T + bias (may be null), for `layer`, in place of the fp32 weights. Called
// outside any parallel region (it may use threads of its own).
using BlockLinear = std::function<void(int layer, int site, float* out, const float* x,
                                       const float* bias, std::int64_t N)>;

// Bytes that a thread is about to read.
struct ByteSpan {
  const void* data;
  std::size_t bytes;
};

// The products of a step in the order the decoder runs them, as DecoderLinear numbers them
// (0 qkv .. 3 fc projection) and the head after the last layer's.
inline constexpr int k_head_product = 4;
inline constexpr int k_share_spans = 6;  // at most, for one thread's share of one product

// The bytes of weight the calling thread reads in its rows of product `which` of `layer` (as
// linear_rows shares them; the head's as team_rows does), written to out (at most
// k_share_spans); returns how many.
using ProductShare = std::function<int(int layer, int which, ByteSpan* out)>;
// The same for the fp32 weights of params.
int fp32_share(const ParamLayout& layout, const float* params, int layer, int which, ByteSpan* out);

// The decoder's weights computed by someone else (a quantized model's packed weights); each
// empty member means the fp32 parameters, and each set one means they are not read. head is
// called as linear is (by the whole team, which the decoder then waits for); embed by one
// thread, before. share says what linear and head read, so that a thread that waits for the
// team fetches its next share meanwhile (empty: fp32_share where linear is empty, else nothing).
struct DecoderKernels {
  DecoderLinear linear;  // the block linears
  BlockLinear matmul;  // the same over a prompt's rows (prefill); empty with `linear`: step by step
  std::function<void(float* logits, const float* x)> head;  // logits (padded vocab) = head x (C)
  std::function<void(std::int32_t token, float* x)> embed;  // x (C) = the token's embedding
  ProductShare share;
};

// The element type of the decoder's KV cache. F32: the decoder equals the full forward up to
// summation order. F16: keys (after rotation) and values are stored rounded to the nearest fp16
// (a relative change of at most 2^-11 each, for values inside fp16's range), which halves the
// cache's memory and the bytes a step reads from it (llama.cpp's default); at long contexts
// those reads are a large part of a step.
enum class KvCache { F32, F16 };
const char* kv_cache_name(KvCache kv);         // "f32" | "f16"
KvCache parse_kv_cache(const std::string& s);  // throws tessera::Error (with a hint) if unknown

class Decoder {
 public:
  // Throws tessera::Error where max_T exceeds the model's context, or for KvCache::F16 in a
  // build without the F16C conversions (an -march below x86-64-v3).
  Decoder(const ParamLayout& layout, const float* params, int max_T, kernels::GemmLibrary gemm,
          DecoderKernels kernels = {}, KvCache kv = KvCache::F32);
  // Feeds one token at the next position; returns logits (Vp) for the following token, or
  // nullptr without computing them when `logits` is false (prompt tokens before the last: the
  // LM head is the largest product of a step).
  const float* step(std::int32_t token, bool logits = true);
  // Feeds n tokens at the next positions at once (a prompt; n <= capacity() - position()): the
  // block forward over them in chunks of up to k_prefill_rows (GEMMs over the chunk's rows, its
  // attention over the cache), each layer's keys and values kept in the cache as n step()s would
  // leave them, up to the order of fp32 sums (with packed kernels: DecoderKernels::matmul's
  // products; without one, step by step). Returns the logits of the last token, or nullptr when
  // `logits` is false or n is 0. ~10x faster than step() per token on fp32 weights.
  const float* prefill(const std::int32_t* tokens, int n, bool logits = true);
  static constexpr int k_prefill_rows = 512;
  int position() const { return pos_; }
  int capacity() const { return max_T_; }
  void reset() { pos_ = 0; }
  KvCache kv_cache() const { return kv_; }
  std::size_t kv_cache_bytes() const;  // of the keys and values for capacity() positions

 private:
  const ParamLayout& layout_;
  const float* params_;
  int max_T_;
  int pos_ = 0;
  kernels::GemmLibrary gemm_;
  DecoderKernels kernels_;
  KvCache kv_;
  void check_token(std::int32_t token) const;
  void embed(std::int32_t token, int t, float* x) const;  // x (C): the input of position t
  void size_team_buffers();  // for the largest team a parallel region may have
  // The parts of a step, each run by every thread of the team.
  void layer(int l, int t);
  void logits_of_x();  // logits_ of the residual stream x_ (the final norm and the head)
  void keep_kv(int l, int t, const float* kv);
  void attend_chunk(int l, int p, float* out, float* lse, const float* qkv, int m);
  void linear(int layer, int which, float* out, const float* in, const float* weight,
              const float* bias, int IC, int OC, bool accumulate);
  const float* query_and_cache(int l, int t);
  template <typename T>
  void attend(const float* q, const T* kc, const T* vc, int t);
  template <int HS, typename T>
  void attend_share(const float* q, const T* kc, const T* vc, int t);
  void attend_combine(float* out) const;
  // The team's barrier before product `which` of `layer` (k_head_product: the head), each thread
  // that waits fetching its share of it meanwhile; before the attention of layer l at position t.
  void wait_for_team(int layer, int which);
  void wait_for_attention(int l, int t);
  template <typename Plan>
  void wait_fetching(int key, Plan&& plan);
  int share(int layer, int which, ByteSpan* out) const;
  int cache_share(int l, int t, ByteSpan* out) const;

  // (L, max_T, n_kv_head * head_dim): fp32 or fp16 bits, the other pair empty
  Buffer<float> k_cache_, v_cache_;
  Buffer<std::uint16_t> k_half_, v_half_;
  Buffer<float> x_, qkv_, fch_, act_, logits_;
  // Per thread of the team (sized for the largest team so far): the normed input and the attention
  // output (C each) and the rotated query (n_head * head_dim), which every thread computes whole
  // from shared values, and its attention partials over its positions (per head: max score, sum of
  // exp, then head_dim weighted values), and a block's scores (n_head rows of a block) with each
  // head's rescaling factor.
  Buffer<float> ln_, att_, q_, part_, block_;
  std::vector<double> inv_freq_;  // llama's rotary inverse frequencies (head_dim / 2)
  std::vector<float> cos_, sin_;  // the rotation of the step's position (head_dim / 2)
  // The team's barrier and, per thread, what it reads next, which it fetches while it waits
  // there: the threads' shares of a product differ in time (the memory serves them unevenly),
  // and the bytes a thread fetches before the product starts are bytes it need not wait for.
  TeamBarrier team_{TeamBarrier::openmp_spin()};  // sleeping where OpenMP's threads would
  struct alignas(64) Lookahead {
    int key = -1;  // what the spans are: layer * 8 + product (k_head_product + 1: attention, o)
    int spans = 0, span = 0;
    std::size_t at = 0;                   // bytes of span_of[span] fetched
    ByteSpan span_of[2 + k_share_spans];  // (the attention's keys and values, then a product)
    bool fetch_line();                    // the next 64 bytes into L1; false when none are left
  };
  std::vector<Lookahead> ahead_;
};

}  // namespace tessera::model
