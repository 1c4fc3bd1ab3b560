"""gemv_warps_model.py — a model of the mma_gemv launch's warps per block, fitted to the H200 sweeps of the twenty-sixth
session (docs/PERF.md; bench/results/gemv-warps-sweep-cuda-h200-2026-12-03-s26-c{4,5}.txt). A probe for the next
rule of `gemv_warps` (src/cuda/kernels.cu), not part of the build:  python3 bench/probes/gemv_warps_model.py

The model: `blocks` blocks of w warps, r of them resident per SM (registers and shared memory), spread breadth-first
over the SMs and refilled as they finish; each warp of a block takes ceil(SB / w) super-blocks of K (SB per row) plus
c steps of fixed cost (its pipeline's start, the block's reduction); an SM runs W warps' steps at a rate of
min(1, Wsat / W) per warp (processor sharing: saturated at Wsat warps). The count with the least modelled time is the
prediction. With Wsat = 16 and c = 3 it names the measured best count (or one within 3 %) in 9 of the 10 sweeps
below; the miss is m8n64 at M = 1 on 272 blocks (17408×5120), where it names 4 warps (1.61× the floor) and 8 was
best (1.48) — eight 8-warp blocks left for a second wave cost less than it predicts. The resident blocks per SM of the
forced counts (r below) are worked out from the kernels' registers and shared memory, not asked of the device; the
times are f16, one run each.

In `gemv_warps` since the twenty-seventh session, with Wsat scaled for the tiles of fewer than 4 MMA tiles per k-step
(m8n32: 32, m8n16: 64): with Wsat = 16 they got fewer warps than the one-wave rule and ran up to 1.16× / 1.36× slower.
The sweeps below are all of tiles with Wsat = 16.
"""
import math

def model_time(blocks, w, r, SB, sms=132, Wsat=16.0, c=3.0):
    n = math.ceil(SB / w) + c          # steps per warp of a block
    running = [[] for _ in range(sms)]  # remaining steps of each running block, per SM
    left = blocks
    for _ in range(r):                  # breadth-first: one block per SM, then a second, ...
        for s in range(sms):
            if left > 0:
                running[s].append(n)
                left -= 1
    t = 0.0
    while True:
        dt = None
        for blk in running:
            if blk:
                rate = min(1.0, Wsat / (len(blk) * w))
                d = min(blk) / rate
                dt = d if dt is None or d < dt else dt
        if dt is None:
            return t
        t += dt
        for s, blk in enumerate(running):
            if not blk:
                continue
            rate = min(1.0, Wsat / (len(blk) * w))
            blk[:] = [x - dt * rate for x in blk if x - dt * rate > 1e-9]
            while len(blk) < r and left > 0:
                blk.append(n)
                left -= 1

# (what, blocks, super-blocks per row, {warps: (resident blocks per SM, measured time ÷ floor, f16)})
SWEEPS = [
    ("m16n64 M=16 27648x5120", 432, 40, {12: (1, 2.09), 8: (1, 2.12), 6: (2, 1.88), 4: (3, 2.13)}),
    ("m16n64 M=32 27648x5120 (one grid)", 864, 40, {12: (1, 3.27), 8: (1, 3.45), 6: (2, 3.04), 4: (3, 2.82)}),
    ("m16n64 M=16 14336x5120", 224, 40, {12: (1, 2.13), 8: (1, 2.17), 6: (2, 1.82), 4: (3, 2.31)}),
    ("m16n64 M=32 5120x5120 (one grid)", 160, 40, {12: (1, 4.84), 8: (1, 5.21), 6: (2, 4.53), 4: (3, 5.71)}),
    ("m16n64 M=16 5120x5120", 80, 40, {12: (1, 2.78), 8: (1, 3.02), 6: (2, 4.05), 4: (3, 3.92)}),
    ("m8n64 M=1 17408x5120", 272, 40, {16: (1, 1.68), 12: (1, 1.70), 8: (2, 1.48), 4: (4, 1.61)}),
    ("m8n64 M=1 27648x5120", 432, 40, {16: (1, 1.49), 12: (1, 1.49), 8: (2, 1.33), 4: (4, 1.30)}),
    ("m8n64 M=1 14336x5120", 224, 40, {16: (1, 1.52), 12: (1, 1.53), 8: (2, 1.28), 4: (4, 1.57)}),
    ("m8n64 M=1 5120x5120", 80, 40, {16: (1, 1.84), 12: (1, 1.91), 8: (2, 2.56), 4: (4, 2.64)}),
    ("m8n64 M=1 5120x14336", 80, 112, {16: (1, 1.49), 12: (1, 1.53), 8: (2, 1.65), 4: (4, 2.04)}),
]

if __name__ == "__main__":
    hits = 0
    for what, blocks, SB, counts in SWEEPS:
        pred = {w: model_time(blocks, w, r, SB) for w, (r, _) in counts.items()}
        named = min(pred, key=pred.get)
        best = min(counts, key=lambda w: counts[w][1])
        ok = counts[named][1] <= 1.03 * counts[best][1]
        hits += ok
        print(f"{what:38s} model {named:2d} warps, measured best {best:2d} ({'ok' if ok else 'miss'})")
    print(f"{hits} of {len(SWEEPS)}")
