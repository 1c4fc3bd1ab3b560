// wgmma_decoder.cu — a microbenchmark (forty-sixth session; not built by the project): does a separate decoding
// warpgroup let the wgmma tile's integer work overlap the tensor cores?
//
// The wgmma tile (src/cuda/kernels_wgmma.cu, docs/kernels.md §9.6) decodes each k16 step's weights in the consumer
// warpgroups into A fragments in registers (RS wgmma). The twenty-first and twenty-fourth sessions' microbenchmarks
// (bench/results/wgmma-microbench-s23.cu.txt) found that integer work before the issue roughly doubles the cycles per
// wgmma m64n128k16 (RS: 100 → 187 with ≈ 48 integer instructions a thread and k16 step), and that the consumers
// storing their decode to shared memory for SS wgmmas costs more still; a separate decoding warpgroup was not
// measured. Here: warpgroup 2 decodes (a stand-in: ALU rounds of shift + byte permute + xor on each 32-bit A word,
// after loading a code word from shared memory) into a 4-stage ring of A tiles in shared memory, handing each stage to
// the two consumer warpgroups through an mbarrier (and getting it back through another); the consumers issue SS
// wgmmas in chains of CHAIN k16 steps into a segment accumulator, then fold it into the main accumulator with one
// FMA per element (the tile's `acc = fma(s, Σq·x, acc)`), with one or two segment accumulators (two: a stage is two
// chains, the second issued before the first one's wait and FMAs, wgmma.wait_group 1, as the 64-token tile does; with a
// wgmma still in flight at the loop's back edge ptxas serialises them, C7514). Reported: cycles per wgmma per SM
// (ideal 64 at the H100/H200's dense f16 rate) — what the consumers' loop costs when the decode is someone else's work.
//
// Modes: 0 = RS, the consumers decode (the tile's form; ALU rounds in the consumers), one segment accumulator;
//        1 = RS, two segment accumulators (the 64-token tile's form);
//        2 = decoder warpgroup + SS, one segment accumulator; 3 = decoder warpgroup + SS, two segment accumulators.
// Values are finite f16 in [0.5, 1) (the tensor cores run faster on zeros). Layouts are not the real ones (the
// descriptors' addresses are valid and 1024-aligned; what lands where does not matter for the timing).
// Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a wgmma_decoder.cu -o wgmma_decoder
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
#define D32(d)                                                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),        \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),          \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define D64(d)                                                                                                         \
    D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),   \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),         \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),         \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define R32 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define R64 R32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

__device__ __forceinline__ void wg_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" R64 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : D64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wg_ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" R64 "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
                 : D64(d)
                 : "l"(a), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int n> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory"); }
__device__ __forceinline__ void keep(float &r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ void bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred done;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}

constexpr int STAGES = 4;
/* The 128-byte-swizzled K-major layout wgmma reads (descriptor_sw128: 8-row groups 1024 bytes apart): an m64 A operand
 * spans 8 KB from its start address, 64 rows × 64 halves of K (4 k16 steps, each 32 bytes further along the row);
 * x, the B operand of both consumers (as in the tile), 128 tokens × 64 halves = 16 KB a 64-k atom. */
constexpr uint32_t A_ATOM = 8192, B_ATOM = 16384;
constexpr uint32_t B_OFFSET = 0;               /* x: 2 atoms (CHAIN ≤ 8), shared by the consumers */
constexpr uint32_t A_OFFSET = 32768;           /* the ring: STAGES × CHAIN × 2 warpgroups × 2 KB */
constexpr uint32_t SMEM = 32768 + STAGES * 2 * 2 * A_ATOM + 4096 + 1024; /* + raw codes + barriers */
/* A stage of the ring: per consumer warpgroup CHAIN / 4 atoms; the address of k16 step c of warpgroup w's A. */
template <int CHAIN> __device__ __forceinline__ uint32_t a_tile(uint32_t stage, int w, int c) {
    return stage + ((uint32_t)w * (CHAIN / 4) + (uint32_t)(c / 4)) * A_ATOM + 32u * (uint32_t)(c % 4);
}
template <int CHAIN> __device__ __forceinline__ uint32_t stage_at(uint32_t base, int s) {
    return base + A_OFFSET + (uint32_t)s * 2 * (CHAIN / 4) * A_ATOM;
}
/* The B descriptor of k16 step c. */
__device__ __forceinline__ uint64_t b_desc(uint32_t base, int c) {
    return desc_sw128(base + B_OFFSET + (uint32_t)(c / 4) * B_ATOM + 32u * (uint32_t)(c % 4));
}

/* One ALU round per 32-bit A word (shift, permute, xor), then forced to a finite f16 pair in [0.5, 1). */
template <int ALU> __device__ __forceinline__ uint32_t decode_word(uint32_t v) {
#pragma unroll
    for (int q = 0; q < ALU; q++) v = __byte_perm(v, v >> 3, 0x5140) ^ (uint32_t)q;
    return (v & 0x03ff03ffu) | 0x38003800u;
}

static_assert(STAGES * 2 * 2 * A_ATOM + 32768 <= 200 * 1024, "the ring fits shared memory at CHAIN 8");
/* The consumers' own decode in the RS modes: chain step c's A fragment from the thread's words and step it + c. */
template <int CHAIN, int ALU>
__device__ __forceinline__ void decode_chain(uint32_t (&aa)[CHAIN][4], const uint32_t (&a)[4], int it) {
#pragma unroll
    for (int c = 0; c < CHAIN; c++)
#pragma unroll
        for (int j = 0; j < 4; j++) aa[c][j] = decode_word<ALU>(a[j] ^ (uint32_t)(it + c));
}

template <int MODE, int CHAIN, int ALU>
__global__ void __launch_bounds__(384, 1) bench(const uint32_t *in, float *out, int iters, long long *cycles) {
    extern __shared__ __align__(1024) uint8_t sm[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t bars = base + SMEM - 1024; /* full[STAGES], empty[STAGES] */
    for (int i = threadIdx.x; i < (int)(SMEM - 1024) / 4; i += blockDim.x) {
        const uint32_t h = (uint32_t)i * 2654435761u;
        reinterpret_cast<uint32_t *>(sm)[i] = 0x38003800u | (h & 0x03ff03ffu);
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            bar_init(bars + 8 * s, 128);                 /* full: the decoder's 128 threads */
            bar_init(bars + 8 * (STAGES + s), 256);      /* empty: both consumers' 256 threads */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the fill above, visible to wgmma's reads */
    __syncthreads();
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
    if (wg == 2) { /* the decoder (modes 2-3); in modes 0-1 it only gives its registers to the consumers */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (MODE < 2) return;
        uint32_t salt = in[t & 1023];
        for (int it = 0; it < iters; it++) {
            const int s = it % STAGES;
            if (it >= STAGES) bar_wait(bars + 8 * (STAGES + s), ((it / STAGES) - 1) & 1);
            const uint32_t stage = stage_at<CHAIN>(base, s);
#pragma unroll
            for (int c = 0; c < CHAIN; c++) {
                /* 4 KB a k16 step (both consumers' A): 32 bytes a thread, from two code words */
                uint32_t code0, code1;
                const uint32_t raw = base + SMEM - 1024 - 4096 + 8 * ((t + 128 * c) & 511);
                asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(code0), "=r"(code1) : "r"(raw));
                code0 ^= salt + it;
                code1 ^= salt - it;
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const uint32_t w = half ? code1 : code0;
                    const uint32_t a0 = decode_word<ALU>(w), a1 = decode_word<ALU>(w >> 4), a2 = decode_word<ALU>(w >> 8),
                                   a3 = decode_word<ALU>(w << 4);
                    /* thread t: row t / 2, 16-byte chunk t % 2 of the step, at its swizzled place in the row */
                    const int row = t >> 1, chunk = (2 * (c % 4) + (t & 1)) ^ (row & 7);
                    const uint32_t dst = stage + ((uint32_t)half * (CHAIN / 4) + (uint32_t)(c / 4)) * A_ATOM +
                                         (uint32_t)(row >> 3) * 1024 + (uint32_t)(row & 7) * 128 + 16u * (uint32_t)chunk;
                    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(a0), "r"(a1), "r"(a2),
                                 "r"(a3)
                                 : "memory");
                }
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_arrive(bars + 8 * s);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;"); /* as the tile's consumers do */
    uint32_t a[4];
    for (int j = 0; j < 4; j++) a[j] = 0x38003800u | ((in[(t * 4 + j) & 1023] + (t * 4 + j) * 2654435761u) & 0x03ff03ffu);
    const float scale = __uint_as_float(in[5]) + 1.0f;
    float acc[64], part[64], part2[64];
    for (int e = 0; e < 64; e++) acc[e] = 0.f;
    long long t0 = clock64();
    if constexpr (MODE == 0) {
        for (int it = 0; it < iters; it++) {
            uint32_t aa[CHAIN][4];
            decode_chain<CHAIN, ALU>(aa, a, it);
            wg_fence();
#pragma unroll
            for (int c = 0; c < CHAIN; c++) wg_rs(part, aa[c], b_desc(base, c), c > 0);
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int e = 0; e < 64; e++) { keep(part[e]); acc[e] = __fmaf_rn(scale, part[e], acc[e]); }
        }
    } else if constexpr (MODE == 1) {
        /* as the 64-token tile does it (kernels_wgmma.cu, TWO_PARTS): two chains a stage, the second decoded and issued
         * while the first runs, the first folded while the second runs, nothing in flight at the loop's back edge (a
         * wgmma in flight across it makes ptxas serialise the wgmmas: C7514) */
        for (int it = 0; it < iters; it += 2) {
            uint32_t aa[CHAIN][4], bb[CHAIN][4];
            decode_chain<CHAIN, ALU>(aa, a, it);
            wg_fence();
#pragma unroll
            for (int c = 0; c < CHAIN; c++) wg_rs(part, aa[c], b_desc(base, c), c > 0);
            wg_commit();
            decode_chain<CHAIN, ALU>(bb, a, it + 1);
            wg_fence();
#pragma unroll
            for (int c = 0; c < CHAIN; c++) wg_rs(part2, bb[c], b_desc(base, c), c > 0);
            wg_commit();
            wg_wait<1>();
#pragma unroll
            for (int e = 0; e < 64; e++) { keep(part[e]); acc[e] = __fmaf_rn(scale, part[e], acc[e]); }
            wg_wait<0>();
#pragma unroll
            for (int e = 0; e < 64; e++) { keep(part2[e]); acc[e] = __fmaf_rn(scale, part2[e], acc[e]); }
        }
    } else if constexpr (MODE == 2) {
        for (int it = 0; it < iters; it++) {
            const int s = it % STAGES;
            bar_wait(bars + 8 * s, (it / STAGES) & 1);
            const uint32_t stage = stage_at<CHAIN>(base, s);
            wg_fence();
#pragma unroll
            for (int c = 0; c < CHAIN; c++) wg_ss(part, desc_sw128(a_tile<CHAIN>(stage, wg, c)), b_desc(base, c), c > 0);
            wg_commit();
            wg_wait<0>();
            bar_arrive(bars + 8 * (STAGES + s));
#pragma unroll
            for (int e = 0; e < 64; e++) { keep(part[e]); acc[e] = __fmaf_rn(scale, part[e], acc[e]); }
        }
    } else { /* MODE 3: two segment accumulators, two chains a stage as in mode 1 (nothing in flight at the back edge) */
        auto chain = [&](float(&d)[64], int it) {
            const int s = it % STAGES;
            bar_wait(bars + 8 * s, (it / STAGES) & 1);
            const uint32_t stage = stage_at<CHAIN>(base, s);
            wg_fence();
#pragma unroll
            for (int c = 0; c < CHAIN; c++) wg_ss(d, desc_sw128(a_tile<CHAIN>(stage, wg, c)), b_desc(base, c), c > 0);
            wg_commit();
        };
        auto fold = [&](float(&d)[64], int it) { /* chain `it` has completed: hand its stage back, fold it */
            bar_arrive(bars + 8 * (STAGES + it % STAGES));
#pragma unroll
            for (int e = 0; e < 64; e++) { keep(d[e]); acc[e] = __fmaf_rn(scale, d[e], acc[e]); }
        };
        for (int it = 0; it < iters; it += 2) {
            chain(part, it);
            chain(part2, it + 1);
            wg_wait<1>();
            fold(part, it);
            wg_wait<0>();
            fold(part2, it + 1);
        }
    }
    long long t1 = clock64();
    float sum = 0;
    for (int e = 0; e < 64; e++) sum += acc[e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int MODE, int CHAIN, int ALU> void run(const char *name, uint32_t *in, float *out, long long *cycles, int sms) {
    auto kernel = bench<MODE, CHAIN, ALU>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    const int iters = 4000; /* even: modes 1 and 3 take two chains a step */
    static_assert(4000 % 2 == 0 && 96 % 2 == 0, "iters must be even");
    kernel<<<sms, 384, SMEM>>>(in, out, 96, cycles);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    kernel<<<sms, 384, SMEM>>>(in, out, iters, cycles);
    cudaEventRecord(e1);
    const cudaError_t failed = cudaEventSynchronize(e1);
    if (failed != cudaSuccess) { /* sticky: the rows after it could not run either */
        printf("%-58s failed: %s\n", name, cudaGetErrorString(failed));
        exit(1);
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    long long h[1024];
    cudaMemcpy(h, cycles, sms * 8, cudaMemcpyDeviceToHost);
    long long most = 0;
    for (int i = 0; i < sms; i++) most = h[i] > most ? h[i] : most;
    const double wgmmas = (double)iters * CHAIN * 2; /* per SM: two consumer warpgroups */
    const double flop = wgmmas * 64.0 * 128 * 16 * 2 * sms;
    printf("%-58s cycles/wgmma/SM %6.1f (ideal 64)  %4.0f TFLOP/s  %.3f ms\n", name, most / wgmmas,
           flop / (ms * 1e-3) / 1e12, ms);
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("%s, %d SMs; wgmma m64n128k16 f16, 2 consumer warpgroups per SM, chains of k16 steps then the fold FMAs\n",
           prop.name, sms);
    uint32_t *in;
    float *out;
    long long *cycles;
    cudaMalloc(&in, 4096 * 4);
    cudaMemset(in, 0, 4096 * 4);
    cudaMalloc(&out, 1 << 20);
    cudaMalloc(&cycles, 8192);
    run<0, 4, 0>("RS, consumers decode: none (chain 4, 1 acc)", in, out, cycles, sms);
    run<0, 4, 1>("RS, consumers decode: ALU 1", in, out, cycles, sms);
    run<0, 4, 2>("RS, consumers decode: ALU 2", in, out, cycles, sms);
    run<0, 4, 4>("RS, consumers decode: ALU 4", in, out, cycles, sms);
    run<1, 4, 1>("RS, 2 seg acc, consumers decode: ALU 1", in, out, cycles, sms);
    run<1, 4, 2>("RS, 2 seg acc, consumers decode: ALU 2", in, out, cycles, sms);
    run<1, 4, 4>("RS, 2 seg acc, consumers decode: ALU 4", in, out, cycles, sms);
    run<2, 4, 0>("SS, decoder WG: ALU 0 (stores only), 1 acc", in, out, cycles, sms);
    run<2, 4, 1>("SS, decoder WG: ALU 1, 1 acc", in, out, cycles, sms);
    run<2, 4, 2>("SS, decoder WG: ALU 2, 1 acc", in, out, cycles, sms);
    run<2, 4, 4>("SS, decoder WG: ALU 4, 1 acc", in, out, cycles, sms);
    run<3, 4, 0>("SS, decoder WG: ALU 0, 2 seg acc", in, out, cycles, sms);
    run<3, 4, 1>("SS, decoder WG: ALU 1, 2 seg acc", in, out, cycles, sms);
    run<3, 4, 2>("SS, decoder WG: ALU 2, 2 seg acc", in, out, cycles, sms);
    run<3, 4, 4>("SS, decoder WG: ALU 4, 2 seg acc", in, out, cycles, sms);
    run<2, 8, 2>("SS, decoder WG: ALU 2, 1 acc, chain 8 (group 128)", in, out, cycles, sms);
    run<3, 8, 2>("SS, decoder WG: ALU 2, 2 seg acc, chain 8 (group 128)", in, out, cycles, sms);
    return 0;
}
