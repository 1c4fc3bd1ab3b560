// read_ceiling.cu — how fast can any kernel read S bytes cold from HBM on this GPU, timed as `qmm bench` times a
// product: a CUDA graph of one step per copy, copies rotating past 2 × L2 (> 256 MB in all), replayed, events, median
// of 7 replays ÷ steps. Two readers: (a) 16-byte loads, U in flight per thread, grid-stride (__ldcs); (b) TMA 1D bulk
// copies (PTX ISA "cp.async.bulk") into a ring of shared-memory stages, one thread per block issuing. Prints
// µs, GB/s and the time ÷ (S ÷ copy bandwidth), the copy bandwidth measured as qmm bench does (1 GiB device to device,
// read + write bytes, best of 10) — i.e. how close to `qmm bench`'s floor a kernel that only reads can come at the
// sizes of the seed shapes' 4-bit weights (9.4, 14.7, 41.3, 79.6 MB). A probe, not part of the build:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o read_ceiling bench/probes/read_ceiling.cu && ./read_ceiling
// (sm_90a: the bulk copies need Hopper). Results: bench/results/read-ceiling-cuda-h200-2026-12-02-s19.txt, docs/PERF.md
// (nineteenth session).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s line %d\n", #x, cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

template <int U>
__global__ void read_ldg(const uint4 *__restrict__ p, size_t n16, unsigned *sink) {
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x12345679u) sink[0] = acc;
}

// Each block reads a contiguous range [begin, end) of CHUNK-byte pieces through STAGES stages.
template <int CHUNK, int STAGES>
__global__ void read_bulk(const char *__restrict__ p, size_t chunks, unsigned *sink) {
    extern __shared__ __align__(128) char smem[];
    __shared__ __align__(8) uint64_t full[STAGES];
    const size_t per = (chunks + gridDim.x - 1) / gridDim.x;
    const size_t begin = blockIdx.x * per, end = min(chunks, begin + per);
    if (threadIdx.x != 0 || begin >= end) return;
    for (int s = 0; s < STAGES; s++) {
        unsigned a = (unsigned)__cvta_generic_to_shared(&full[s]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;");
    auto issue = [&](size_t c, int s) {
        unsigned bar = (unsigned)__cvta_generic_to_shared(&full[s]);
        unsigned dst = (unsigned)__cvta_generic_to_shared(smem + (size_t)s * CHUNK);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(CHUNK));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(dst), "l"(p + c * CHUNK), "r"(CHUNK), "r"(bar) : "memory");
    };
    for (int s = 0; s < STAGES && begin + s < end; s++) issue(begin + s, s);
    uint32_t acc = 0;
    for (size_t c = begin; c < end; c++) {
        const int s = (int)((c - begin) % STAGES);
        const unsigned parity = (unsigned)(((c - begin) / STAGES) & 1);
        unsigned bar = (unsigned)__cvta_generic_to_shared(&full[s]);
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        acc ^= *reinterpret_cast<volatile unsigned *>(smem + (size_t)s * CHUNK);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (c + STAGES < end) issue(c + STAGES, s);
    }
    if (acc == 0x12345679u) sink[0] = acc;
}

static float time_graph(cudaGraphExec_t exec, cudaStream_t st, int steps) {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(exec, st)); CK(cudaStreamSynchronize(st));
    std::vector<float> t;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(a, st)); CK(cudaGraphLaunch(exec, st)); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.0f / steps);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a); cudaEventDestroy(b);
    return t[3];
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // copy bandwidth as qmm bench: 1 GiB device to device, read + write bytes, best of 10
    size_t big = (size_t)1 << 30; char *s0, *s1; CK(cudaMalloc(&s0, big)); CK(cudaMalloc(&s1, big));
    CK(cudaMemset(s0, 1, big)); CK(cudaMemset(s1, 2, big));
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 10; r++) {
        CK(cudaEventRecord(a, st)); CK(cudaMemcpyAsync(s1, s0, big, cudaMemcpyDeviceToDevice, st)); CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); best = std::min(best, ms);
    }
    const double copy_gbs = 2.0 * big / (best * 1e-3) / 1e9;
    printf("copy %.1f GB/s (read + write), %d SMs\n", copy_gbs, sms);
    unsigned *sink; CK(cudaMalloc(&sink, 64));
    const double sizes_mb[] = {9.4, 14.7, 41.3, 79.6};
    for (double mb : sizes_mb) {
        size_t bytes = ((size_t)(mb * 1e6) + 16383) & ~(size_t)16383;
        int copies = (int)std::max<size_t>(2, (256ull << 20) / bytes + 1);
        if ((size_t)copies * bytes > big) copies = (int)(big / bytes);
        const double floor_us = bytes / (copy_gbs * 1e3);
        printf("\nS = %.1f MB (%zu bytes), %d copies rotating, floor %.2f us\n", mb, bytes, copies, floor_us);
        auto run = [&](const char *name, auto launch) {
            cudaGraph_t g; cudaGraphExec_t e;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int c = 0; c < copies; c++) launch(s0 + (size_t)c * bytes);
            CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&e, g, 0));
            float us = time_graph(e, st, copies);
            printf("  %-34s %8.2f us  %7.1f GB/s  x%.2f floor\n", name, us, bytes / (us * 1e3), us / floor_us);
            cudaGraphExecDestroy(e); cudaGraphDestroy(g);
        };
        char nm[96];
        for (int bps : {1, 2, 4, 8}) for (int thr : {256, 512, 1024}) {
            if (bps * thr > 2048) continue;
            snprintf(nm, sizeof nm, "ldg U4 %d blk/SM x %d thr", bps, thr);
            run(nm, [&](char *p) { read_ldg<4><<<sms * bps, thr, 0, st>>>((const uint4 *)p, bytes / 16, sink); });
            snprintf(nm, sizeof nm, "ldg U8 %d blk/SM x %d thr", bps, thr);
            run(nm, [&](char *p) { read_ldg<8><<<sms * bps, thr, 0, st>>>((const uint4 *)p, bytes / 16, sink); });
        }
        CK(cudaFuncSetAttribute(read_bulk<16384, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384 * 8));
        CK(cudaFuncSetAttribute(read_bulk<8192, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192 * 8));
        CK(cudaFuncSetAttribute(read_bulk<4096, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096 * 16));
        for (int bps : {1, 2, 3}) {
            snprintf(nm, sizeof nm, "bulk 16K x8 %d blk/SM", bps);
            if (bps == 1) run(nm, [&](char *p) { read_bulk<16384, 8><<<sms * bps, 32, 16384 * 8, st>>>(p, bytes / 16384, sink); });
            snprintf(nm, sizeof nm, "bulk 8K x8 %d blk/SM", bps);
            run(nm, [&](char *p) { read_bulk<8192, 8><<<sms * bps, 32, 8192 * 8, st>>>(p, bytes / 8192, sink); });
            snprintf(nm, sizeof nm, "bulk 4K x16 %d blk/SM", bps);
            run(nm, [&](char *p) { read_bulk<4096, 16><<<sms * bps, 32, 4096 * 16, st>>>(p, bytes / 4096, sink); });
        }
        // a tiny step: the fixed cost of a graph step
        run("empty-ish step (ldg of 16 KB)", [&](char *p) { read_ldg<4><<<1, 256, 0, st>>>((const uint4 *)p, 1024, sink); });
    }
    return 0;
}
