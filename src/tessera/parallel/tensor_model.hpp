// The model (either family) on the tx x ty x tz tensor grid (AxoNN's 3D tensor parallelism):
//
//   embedding (vocab_parallel.hpp) -> L x the one block of model/gpt_block.hpp, run through the
//   grid's op table (tensor_ops.hpp) -> final norm (tensor_layernorm.hpp: LayerNorm or RMSNorm)
//   -> LM head (tied to the embedding, or llama's own) with the vocabulary-parallel cross-entropy
//   (vocab_parallel.hpp).
//
// In a block, qkv and fc are NORMAL 3D linears (in over tx, out over ty) and attproj and fcproj
// TRANSPOSED ones, so the residual stream keeps the layout (rows / tz, C / tx) from the embedding
// to the LM head, and attention, GELU or SwiGLU run on the rank's heads and columns (over ty),
// replicated over tx. The fused rows of qkv ([q | k | v]) and of llama's fc ([gate | up]) are
// held in ty-grouped order (tensor_attention.hpp, grouped_source_row): ty rank j holds its query
// heads with their kv heads, and matching gate and up slices.
//
// Parameters. Each rank holds its slices of every tensor in ONE flat buffer described by a local
// model::ParamLayout (same tensors, order and blocks as the whole model, local sizes), so data
// parallelism and ZeRO (parallel/data_parallel.hpp) shard and reduce it exactly as they do a whole
// model, over the dp group. Each local element is a copy of one global element: global_index()
// maps it (padding between tensors: -1; the row permutations of the fused matrices are in it, so
// checkpoints keep the global Hugging Face order; llama's k_proj, v_proj and up_proj have no local
// elements: the rank's block of the fused matrix lies at q_proj, gate_proj). Replicated elements
// (norm parameters and wpe over ty and tz; biases over their linear's input axis and tz) are
// "owned" by the rank with coordinate 0 on the replicating axes; every global element has exactly
// one owner in the tensor group. The owner mask is what the global gradient norm counts, and what
// gather_full() assembles.
//
// Batch. Every rank of a tensor group is given the same global micro-batch (B, T) of ids; the
// rank computes the sequences [cz*B/tz, (cz+1)*B/tz) (B % tz == 0). Losses are the mean over the
// whole micro-batch, the same on every rank of the group, as in the single-process model.
//
// Store protocol: forward/backward ask the ParamStore for blocks (0 = embeddings, 1..L = layers,
// L+1 = ln_f) exactly as model::forward/backward do, with local block offsets.
//
// Sequence parallelism (options.sequence_parallel, 1D mode tx only; in tensor_ops.hpp). With ty =
// tz = 1 the normal linears (qkv, fc) split their input channels over tx and produce full-width
// partial outputs, and the transposed ones (proj, fcproj) need full-width inputs: the attention
// core and the GELU run on (n, 3C) / (n, 4C) activations replicated on every tx rank. Sequence
// parallelism splits those regions by rows instead (whole sequences: rows [cx*n/tx, +n/tx)):
// the forward all-reduce of a normal linear becomes a reduce-scatter over rows, and a transposed
// linear all-gathers its input rows first; in the backward, the transposed linear's input-gradient
// all-reduce becomes a reduce-scatter and the normal linear all-gathers its output gradient. A
// reduce-scatter plus an all-gather moves what one all-reduce does; the attention and GELU
// compute and their stored activations shrink tx-fold. The inputs all-gathered for the
// weight-gradient GEMMs are gathered again in the backward rather than kept (as in Megatron-LM).
//
// Overlap (options.overlap_dx / defer_dw / prefetch). The layers alternate between two sets of
// linear workspaces (by layer parity), so that while layer l computes, layer l+1's (forward) or
// l-1's (backward) weight blocks are being all-gathered over tz into the other set, and layer
// l+1's weight-gradient reduce-scatters (backward) are still in flight from it. A block still in
// its workspace is not gathered again (AxoNN's "unless cached"): the last two layers of the
// forward serve the first two of the backward, and a recomputed layer's blocks serve its
// backward. Layer l+1's gradients are final (grads_done) once its reductions complete, after
// layer l's backward.
//
// Pipeline stages (options.chunks, parallel/pipeline.hpp). A rank may hold only some chunks of
// consecutive layers; its local layout then has no elements for the other tensors. Activations
// of one micro-batch through one chunk live in a slot from its forward_chunk (or chunk_input)
// to its backward_chunk, so a schedule can keep several micro-batches in flight; forward() and
// backward() are the one-chunk, one-micro-batch case. The head's chunk keeps its (d)logits in the
// slot between the two. activation_stats() measures the slots in flight.
//
// Recomputation (options.recompute): the forward keeps only each layer's input; the backward
// re-runs the layer's forward (re-issuing its weight gathers and all-reduces) just before its
// backward. Same numbers, L-fold fewer activations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/runtime.hpp"
#include "tessera/comm/topology.hpp"
#include "tessera/kernels/gemm.hpp"
#include "tessera/model/gpt.hpp"
#include "tessera/model/gpt_block.hpp"
#include "tessera/model/layout.hpp"
#include "tessera/parallel/tensor_attention.hpp"
#include "tessera/parallel/tensor_linear.hpp"
#include "tessera/parallel/tensor_ops.hpp"
#include "tessera/parallel/vocab_parallel.hpp"

namespace tessera::parallel {

// A run of consecutive layers that a rank holds (pipeline parallelism, parallel/pipeline.hpp):
// the model's first chunk also holds the token and position embeddings, its last chunk the final
// norm and the LM head (tied to the token embedding, so both ends hold a copy of wte; an untied
// head lives on the last chunk alone).
struct ModelChunk {
  int first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer); may be empty
  bool embedding = false;              // first_layer == 0 and the embeddings live here
  bool head = false;                   // end_layer == n_layer and ln_f + the LM head live here
  bool operator==(const ModelChunk&) const = default;
};

struct TensorModelOptions {
  // The layers this rank holds, as local chunks in model order (pipeline stage s, chunk c is the
  // model's chunk c*pp + s). Empty: the whole model, one chunk.
  std::vector<ModelChunk> chunks;
  bool recompute = false;  // per-layer activation recomputation
  // 1D mode only (tx > 1, ty = tz = 1): sequence parallelism in the regions that tensor
  // parallelism replicates (see below). Needs the micro-batch divisible by tx.
  bool sequence_parallel = false;
  // Overlaps of the 3D algorithm (each can be switched off, to measure it):
  bool overlap_dx = true;  // input-gradient all-reduce during the weight-gradient GEMM
  bool defer_dw = true;    // weight-gradient reduce-scatter during the previous layer's backward
  bool prefetch = true;    // next layer's tz weight gather during this layer (forward, backward)
  // GEMM layout tuning of the linears (kernels/gemm_tuner.hpp), cached per process; with a file,
  // choices are loaded from it when it exists and saved to it by save_gemm_choices().
  bool tune_gemm = false;
  std::string gemm_tuning_file;
  // bf16 mixed precision: the linears' and the LM head's GEMMs read bf16 operands (activations
  // and gradients rounded as they enter a GEMM, the weights' bf16 copy) and accumulate in fp32;
  // everything else (parameters, gradients, norms, attention, the loss, every collective) is
  // fp32. A weight's bf16 copy is made once per step where the rank holds its block whole (tz =
  // 1), after the gather otherwise. The tuner (tune_gemm) tunes fp32 GEMMs only.
  bool bf16 = false;
  // The activations and their gradients that the tensor axes sum or gather travel in bf16
  // (rounded, sums rounded at every addition, widened back): the linears' partial-sum
  // all-reduces and sequence parallelism's reduce-scatters and all-gathers (any precision).
  bool bf16_tensor_wire = false;
};

class TensorModel {
 public:
  // Collective over the world (creates the tensor-axis communicators through rt.group). Throws
  // tessera::Error if the model does not split over the grid.
  TensorModel(const model::ModelConfig& cfg, const comm::Topology& topo, comm::Runtime& rt,
              const TensorModelOptions& opt = {});
  ~TensorModel();
  TensorModel(const TensorModel&) = delete;
  TensorModel& operator=(const TensorModel&) = delete;

  const model::ParamLayout& global_layout() const { return global_; }
  const model::ParamLayout& local_layout() const { return local_; }
  const TensorModelOptions& options() const { return opt_; }
  int tensor_size() const { return tensor_size_; }
  // The rank holds the whole model in the whole model's layout (one process, no pipeline):
  // extract() and gather_full() are copies, and the layers run unsplit, issuing no collective.
  bool whole() const { return identity_; }

  const std::vector<ModelChunk>& chunks() const { return opt_.chunks; }

  // local element -> global flat index (-1: alignment padding); owner mask (1 = counts once).
  // Under pipeline parallelism a rank's layout holds only its chunks' tensors (the others have
  // no local elements); the copy of wte on the head's stage is not an owner (the embedding's is).
  // (global_index() builds the map, 8 bytes per local element: call it once, keep the result.)
  std::vector<std::int64_t> global_index() const;
  // Empty when whole(): the rank owns every element.
  const std::vector<std::uint8_t>& owner_mask() const { return owner_; }

  // local (local_layout().total()) <- this rank's slices of global (global_layout().total()).
  void extract(const float* global, float* local) const;
  // global <- the whole model assembled from every rank's owned local elements (collective over
  // the model group, pp x tx x ty x tz; every rank gets it).
  void gather_full(const float* local, float* global);

  // Mean loss over the micro-batch's targets >= 0 (same on every rank of the tensor group).
  // training: dloss per position as in model::ForwardOptions; the cross-entropy's backward is
  // fused and backward() must follow. inputs, targets: the global micro-batch (B, T).
  float forward(model::ParamStore& store, const std::int32_t* inputs, const std::int32_t* targets,
                int B, int T, const model::ForwardOptions& opt);
  void backward(model::ParamStore& store, const std::int32_t* inputs, int B, int T,
                kernels::GemmLibrary gemm);

  // ---- one micro-batch through one local chunk (the pipeline executor's interface) ----
  // Activations live in one slot per (chunk, micro-batch) in flight: taken by chunk_input() or
  // forward_chunk(), returned to a pool by backward_chunk(). Activations passed between chunks
  // (the residual stream) are this rank's (rows / tz, C / tx) block: boundary_numel() floats.
  //
  // Starts a step of micro-batches of (B, T): (re)allocates on a new shape and drops the cached
  // weight blocks (the parameters changed). Throws unless B % tz == 0 (and B % tx == 0 with
  // sequence parallelism).
  void begin_step(int B, int T);
  std::size_t boundary_numel() const;
  // Where the input activation of (chunk, mb) goes (a chunk without the embedding): receive here.
  float* chunk_input(int chunk, int mb);
  // Forward of micro-batch `mb` through local chunk `chunk`. inputs (B, T): read on the
  // embedding's chunk; targets (B, T): on the head's chunk, where the mean loss over the targets
  // >= 0 is returned (0 elsewhere; with training, backward_chunk must follow). The output
  // activation is chunk_output(chunk, mb) until backward_chunk(chunk, mb).
  float forward_chunk(model::ParamStore& store, int chunk, int mb, const std::int32_t* inputs,
                      const std::int32_t* targets, const model::ForwardOptions& opt);
  const float* chunk_output(int chunk, int mb) const;
  // Backward of (chunk, mb). dy: the gradient of its output (boundary_numel), null on the head's
  // chunk. Gradients accumulate into the store. Then input_grad() holds the gradient of the
  // chunk's input until the next backward_chunk, and the slot goes back to the pool.
  void backward_chunk(model::ParamStore& store, int chunk, int mb, const float* dy,
                      kernels::GemmLibrary gemm);
  const float* input_grad() const;
  // An evaluation forward of (chunk, mb) (no backward follows): its slot goes back to the pool.
  void end_forward(int chunk, int mb) { release_slot(chunk, mb); }
  // The smallest micro-batch the grid splits: tz (whole sequences per tz rank), a multiple of tx
  // too with sequence parallelism.
  int min_batch() const;
  // On the rank holding the LM head, after an evaluation forward whose slot has ended: the logits
  // (vocab_size real entries) of global row `row` (sequence row / T, position row % T) of that
  // micro-batch, on every rank of the tensor group (collective over it: each entry is computed on
  // one rank, the others add zeros, so every rank gets the same bits).
  void logits_row(std::int64_t row, float* out);

  // Activation memory of the slots (what the pipeline schedule keeps in flight), measured from
  // the buffers themselves; the shared workspaces are not counted.
  struct ActivationStats {
    int live = 0, peak_live = 0;  // slots in flight now / at most (in chunk units)
    std::size_t live_bytes = 0, peak_bytes = 0;
    std::size_t slot_bytes_max = 0;  // the largest single slot
  };
  const ActivationStats& activation_stats() const;
  void reset_activation_stats();

  // The GEMM tuner's choices (tune_gemm), written to options().gemm_tuning_file if set.
  void save_gemm_choices() const;
  const kernels::GemmTuner* gemm_tuner() const { return tuner_.get(); }

  // Bytes of the activation buffers held now (slots in flight and shared buffers), per rank.
  std::size_t activation_bytes() const;

 private:
  struct Layer;
  struct Slot;
  struct State;
  bool holds(const model::ParamTensor& t) const;  // this rank's chunks hold the tensor
  void build_maps(std::vector<std::int64_t>& index, std::vector<std::uint8_t>& owner) const;
  std::size_t local_numel(const model::ParamTensor& t) const;  // local_'s size of t
  void check_batch(int B, int T) const;
  void make_workspace_sets(State& s);
  void prepare(int B, int T);
  void invalidate_weights();
  Slot& acquire(int chunk, int mb);
  Slot& live_slot(int chunk, int mb) const;
  void release_slot(int chunk, int mb);
  void init_layer(Layer& a, int B, int T) const;
  // bf16 without sequence parallelism: the GEMM-only activations are kept in bf16 (Layer)
  bool keeps_bf16() const { return opt_.bf16 && !opt_.sequence_parallel; }
  TensorBlockWorkspace& ws_of(int layer);
  void prefetch_layer(int layer, const float* blk);
  void progress_all(model::ParamStore& store);
  // A layer is model::block_forward / block_backward through TensorOps (tensor_ops.hpp).
  model::BlockShape local_shape(int B, int T) const;
  model::BlockActs<float> block_acts(Layer& a, float* y);
  void layer_forward(kernels::GemmLibrary lib, int l, const float* blk, const float* x, float* y,
                     int B, int T, Layer& acts);
  void layer_backward(kernels::GemmLibrary lib, int l, const float* blk, float* gblk,
                      const float* x, int B, int T, Layer& acts, model::ParamStore& store);
  void final_norm_forward(Slot& sl, const float* w, const float* b);
  void embed_forward(Slot& sl, const float* E, const std::int32_t* inputs);
  float head_forward(model::ParamStore& store, Slot& sl, const float* E,
                     const std::int32_t* targets, const model::ForwardOptions& opt);
  void final_norm_backward(Slot& sl, const float* w, float* dw, float* db);
  void head_backward(model::ParamStore& store, Slot& sl, float* GE, kernels::GemmLibrary lib);
  void layers_backward(model::ParamStore& store, const ModelChunk& ch, Slot& sl,
                       kernels::GemmLibrary lib);

  model::ModelConfig cfg_;
  TensorModelOptions opt_;
  model::ParamLayout global_;
  TensorBlockGrid grid_;  // the block's linears and the norms' communicators
  VocabParallelLayout vocab_;
  model::ParamLayout local_;
  int tensor_size_ = 1;
  // The local layout is the whole model's, element for element (one process, one stage): the
  // conversions to and from whole-model buffers are copies.
  bool identity_ = false;
  int tx_ = 1, ty_ = 1, tz_ = 1, ty_index_ = 0, tz_index_ = 0;
  int c_offset_ = 0;  // the rank's residual-stream channels [c_offset_, +C/tx)
  std::vector<std::uint8_t> owner_;
  VocabParallelComms vocab_comms_;
  comm::Communicator* tensor_group_ = nullptr;  // {tx, ty, tz}
  comm::Communicator* model_group_ = nullptr;   // {pp, tx, ty, tz}
  std::unique_ptr<State> st_;
  std::unique_ptr<kernels::GemmTuner> tuner_;
};

}  // namespace tessera::parallel
