// Stand-ins for FlashInfer 0.7.2.post1's cub_topk.cu (FLASHINFER_TOPK_ALGO=cub), whose nvcc
// build outran a ~390 s call (peers_prebuild_job.sh, 2026-11-28): the default radix top-k never
// calls them. The topk module was linked here from that call's other three objects
// (flashinfer_partial.tar.xz) and this (x86-64, no GPU needed):
//   c++ -std=c++17 -fPIC -O1 -I.fi072/site/tvm_ffi/include -c benchmarks/flashinfer_cub_topk_stub.cc
//   c++ csrc_topk.cuda.o csrc_flashinfer_topk_binding.cuda.o \
//       csrc_flashinfer_fast_topk_clusters_binding.cuda.o flashinfer_cub_topk_stub.o -shared \
//       -L/usr/local/cuda/lib64 -lcudart -o .fi072/aot/topk/topk.so
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>
#include <stdexcept>
using tvm::ffi::Optional;
using tvm::ffi::TensorView;
[[noreturn]] static void missing() { throw std::runtime_error("cub_topk.cu not built"); }
long cub_topk_workspace_size(TensorView, long, long) { missing(); }
void cub_topk_ragged_transform(TensorView, TensorView, TensorView, TensorView, Optional<TensorView>, long, long, Optional<TensorView>) { missing(); }
void cub_topk_page_table_transform(TensorView, TensorView, TensorView, TensorView, Optional<TensorView>, Optional<TensorView>, long, long, long, Optional<TensorView>, Optional<TensorView>, Optional<TensorView>) { missing(); }
long cub_topk_ragged_transform_workspace_size(TensorView, TensorView, long, long, bool) { missing(); }
long cub_topk_page_table_transform_workspace_size(TensorView, TensorView, long, long, bool, bool) { missing(); }
void cub_topk(TensorView, TensorView, TensorView, Optional<TensorView>, long, long) { missing(); }
