#!/usr/bin/env python3
"""Write the hand-made seed inputs of tests/fuzz/corpus.

    python3 tests/fuzz/gen_corpus.py [OUTDIR]      (default: tests/fuzz/corpus)

Each seed covers one operation (or one setup) of fuzz_pinpool.c; the
encoding is described in tests/fuzz/README.md and must follow the enum and
the readers of fuzz_pinpool.c. Rerun after changing the encoding (the old
seeds stay valid inputs, they only exercise something else).
"""
import os
import struct
import sys

# Operations (enum in fuzz_pinpool.c).
(ALLOC, ALLOC2, FREE, FREE2, FREE_DEAD, FREE_INTERIOR, FREE_NEAR, FREE_FOREIGN,
 BLOCK_SIZE, SIZE_CLASS, RECORD, RECORD_BAD, PROCESS, SYNC, SIM_SUBMIT,
 EMPTY_CACHE, THREAD_FLUSH, STATS, RESET_PEAK, GET_CONFIG, NULL_ARGS, CONFIG,
 BACKEND_FAULT, EVENTS_SCRIPT, POOL_B, THREADS, RECREATE, COOKIES,
 BURST) = range(29)

# Setup byte 0.
HOST, MALLOC, USER, USER_LOCKED = 0, 1, 2, 3
EV_NONE, EV_SIM, EV_USER, EV_USER_QUIET = 0, 4, 8, 12
RESERVE, POOL_B_ON, HUGE, MLOCK = 16, 32, 64, 128
# Setup byte 1: tcache index (0..7: 0, 512, 4K, 64K, 256K, 1M, 4M, 64M),
# (shards - 1) << 3, max_cached index << 5 (0, 1M, 4M, 16M), 128: 24 MiB cap.
def b1(tcache=3, shards=1, cached=0, small_cap=False):
    return tcache | (shards - 1) << 3 | cached << 5 | (128 if small_cap else 0)


def u16(v):
    return list(struct.pack('<H', v & 0xFFFF))


def u32(v):
    return list(struct.pack('<I', v & 0xFFFFFFFF))


# Size selectors (pick_size).
def s_small(n):        # 1 + n % 512
    return [7] + u16(n - 1)


def s_upto64k(n):      # 1 + n % 64 KiB
    return [10] + u32(n - 1)


def s_upto256k(n):
    return [12] + u32(n - 1)


def s_large(n):        # 256 KiB + n % 2 MiB
    return [13] + u32(n - 256 * 1024)


def s_upto8m(n):
    return [14] + u32(n - 1)


S_ZERO = [0]
S_SIZE_MAX = [1]
S_LARGEST = [2]
S_BEYOND = [3] + u16(0)
S_TERA = [4] + u16(5)
S_511 = [5, 0]
S_512 = [5, 1]
S_513 = [5, 2]


def s_boundary(e, j, d):   # 2^e + j 2^(e-3) - 1 + d, e = 9 + (e % 14)
    return [6, e - 9, j, d]


def s_pow2(k):
    return [15, k]


SEEDS = {}


def seed(name, setup, *ops):
    data = bytes(setup)
    for op in ops:
        data += bytes(op)
    SEEDS[name] = data


def alloc(sel):
    return [ALLOC] + sel


seed('alloc-free-host', [HOST, b1()],
     alloc(s_small(100)), alloc(s_upto64k(40000)), alloc(s_upto256k(200000)),
     alloc(s_large(1 << 20)), [FREE, 1], [FREE, 0], [STATS, 0], [FREE2, 0],
     [COOKIES])
seed('double-free', [HOST, b1()],
     alloc(s_small(64)), alloc(s_small(64)), [FREE, 0], [FREE_DEAD, 0, 0],
     [FREE_DEAD, 0, 3], [FREE, 0], [FREE_DEAD, 0, 0], [FREE_DEAD, 1, 0])
seed('interior', [HOST, b1()],
     alloc(s_upto64k(5000)), [FREE_INTERIOR, 0] + u32(0),
     [FREE_INTERIOR, 0] + u32(4095), [FREE_INTERIOR, 0] + u32(12345),
     [FREE, 0])
seed('near', [HOST, b1(tcache=0)],
     alloc(s_small(512)), alloc(s_small(512)), alloc(s_small(512)),
     [FREE_NEAR, 1, 3], [FREE_NEAR, 1, 5], [FREE_NEAR, 0, 0x85],
     [FREE_NEAR, 2, 0x44], [FREE_NEAR, 0, 0x4c], [FREE_NEAR, 0, 8])
seed('foreign', [HOST | POOL_B_ON, b1()],
     [POOL_B, 0, 0] + u16(3000), alloc(s_small(10)),
     *[[FREE_FOREIGN, k | (j << 4)] for k in range(15) for j in (0, 1)])
seed('block-size', [HOST, b1()],
     alloc(s_upto64k(9000)), [FREE, 0], alloc(s_small(1)),
     *[[BLOCK_SIZE, k, 0] + u16(v) for k in range(8) for v in (1, 700)])
seed('size-class', [HOST, b1()],
     *[[SIZE_CLASS] + s for s in (
         S_ZERO, S_SIZE_MAX, S_LARGEST, S_BEYOND, S_TERA, S_511, S_512,
         S_513, s_boundary(9, 1, 0), s_boundary(9, 1, 2), s_boundary(12, 0, 1),
         s_boundary(22, 7, 2), s_pow2(59), s_pow2(60), s_pow2(61),
         s_pow2(63), s_small(1), s_upto64k(65536))])
seed('alloc-special-sizes', [HOST, b1(small_cap=True)],
     *[alloc(s) for s in (S_ZERO, S_SIZE_MAX, S_LARGEST, S_BEYOND, S_TERA,
                          S_511, S_512, S_513, s_pow2(60), s_pow2(63),
                          s_pow2(25), s_pow2(24), s_boundary(21, 7, 2))],
     [STATS, 0])
seed('streams-sim', [HOST | EV_SIM, b1()],
     alloc(s_small(300)), alloc(s_upto64k(20000)), [RECORD, 0, 0, 2],
     [RECORD, 1, 1, 0], [RECORD, 1, 1, 0], [FREE, 0], [FREE_DEAD, 0, 0],
     [PROCESS], [FREE, 0], [SYNC], alloc(s_small(300)), [SYNC])
seed('streams-user-failing', [USER | EV_USER, b1()],
     [EVENTS_SCRIPT, 6, 0x00, 0x04, 0x02, 0x13, 0xc3, 0x43],
     *[alloc(s_small(100 * i + 1)) for i in range(6)],
     *[[RECORD, i, i, 2] for i in range(6)],
     *[[FREE, 0] for _ in range(6)], [PROCESS], [PROCESS], [SYNC],
     [STATS, 0], [FREE_DEAD, 0, 0], [EMPTY_CACHE])
seed('streams-user-sync', [USER | EV_USER | RESERVE, b1(tcache=0)],
     [EVENTS_SCRIPT, 4, 0x0c, 0x0b, 0x4f, 0x8c],
     alloc(s_small(64)), alloc(s_upto64k(9000)), alloc(s_small(64)),
     [RECORD, 0, 0, 2], [RECORD, 1, 1, 1], [RECORD, 2, 7, 0],
     [FREE, 0], [SYNC], [FREE, 0], [FREE, 0], [SYNC], [EMPTY_CACHE],
     alloc(s_small(64)), [RECORD, 0, 2, 0], [FREE, 0], [RECREATE])
seed('streams-user-quiet', [HOST | EV_USER_QUIET, b1(tcache=2)],
     [EVENTS_SCRIPT, 3, 0x0c, 0x03, 0x22], alloc(s_small(42)),
     [RECORD, 0, 200, 2], [RECORD, 0, 255, 0], [FREE, 0], [PROCESS],
     alloc(s_small(42)), [SYNC])
seed('record-bad', [MALLOC | EV_SIM, b1()],
     alloc(s_upto64k(3000)), [FREE, 0], alloc(s_upto64k(3000)),
     *[[RECORD_BAD, k, 0, 1] + u16(v) for k in range(6) for v in (7, 0x41)],
     [SYNC])
seed('record-no-events', [HOST, b1()],
     alloc(s_small(77)), [RECORD, 0, 0, 1], [RECORD_BAD, 3, 0, 0] + u16(2),
     [RECORD_BAD, 4, 0, 0] + u16(0))
seed('sim-submit', [HOST | EV_SIM, b1()],
     [SIM_SUBMIT, 0, 4], [SIM_SUBMIT, 1, 7], [SIM_SUBMIT, 2, 0],
     [SIM_SUBMIT, 3, 0x0f], alloc(s_small(5)), [RECORD, 0, 3, 0], [FREE, 0],
     [SIM_SUBMIT, 3, 4], [SYNC], [RECREATE], [SIM_SUBMIT, 0, 4])
seed('sim-submit-busy', [USER | EV_USER, b1()],
     [SIM_SUBMIT, 0, 4], [NULL_ARGS, 8, 0])
seed('empty-cache-reserve', [HOST | RESERVE, b1()],
     alloc(s_small(100)), alloc(s_upto256k(150000)), alloc(s_large(600000)),
     [FREE, 0], [FREE, 0], [EMPTY_CACHE], [FREE, 0], [EMPTY_CACHE],
     [STATS, 0])
seed('max-cached-trim', [HOST, b1(tcache=1, cached=1)],
     *[alloc(s_upto256k(100000 + 30000 * i)) for i in range(6)],
     *[[FREE, 0] for _ in range(6)], [THREAD_FLUSH], [EMPTY_CACHE])
seed('reset-peak', [HOST, b1()],
     alloc(s_upto64k(1000)), alloc(s_upto64k(2000)), [FREE, 0],
     [RESET_PEAK], [STATS, 1], [STATS, 0], [FREE, 0], [RESET_PEAK])
seed('get-config', [HOST | EV_SIM | RESERVE, b1()],
     *[[GET_CONFIG, k, f, 40] for k in range(6) for f in (0, 1)],
     [GET_CONFIG, 3, 2, 0], [GET_CONFIG, 4, 6, 0])
seed('get-config-user', [USER_LOCKED | EV_USER, b1(tcache=7)],
     [GET_CONFIG, 3, 2, 0], [GET_CONFIG, 3, 6, 0], [GET_CONFIG, 5, 0, 255])
seed('null-args', [HOST | EV_SIM, b1()],
     alloc(s_small(1)), *[[NULL_ARGS, sub, arg] for sub in range(20)
                          for arg in (0, 1)])
seed('null-args-bad-reserve', [USER, b1()],
     *[[NULL_ARGS, 18, mode | (k << 4)] for mode in range(8) for k in (0, 2)])


def cfg_raw(text):
    t = text.encode()
    return [CONFIG, 0, 0x10, len(t)] + list(t)


def cfg_items(sub, sel, items):
    """items: (key index, value index) pairs (cfg_keys / cfg_values)."""
    out = [CONFIG, sub, sel, len(items) - 1]
    for k, v in items:
        out += [k, v]
    return out


seed('config-raw', [HOST, b1()],
     cfg_raw('max_cached=1MiB,shards=2'), cfg_raw('shards=0'),
     cfg_raw('max_cahced=1'), cfg_raw(' tcache_bytes = 4096 , ,'),
     cfg_raw('backend=cuda'), cfg_raw('events=cuda'), cfg_raw('a'),
     cfg_raw('numa_node=0,hugepages=1'), cfg_raw('max_reserved=1'),
     cfg_raw('backend=malloc,cuda_flags=portable+devicemap'))
seed('config-fault', [HOST, b1()],
     cfg_raw('fault=alloc:1'), cfg_raw('fault=alloc:1:3,max_reserved=8MiB'),
     cfg_raw('fault=record:1,events=simulated'), cfg_raw('fault=query:2:2'),
     cfg_raw('fault=mlock:1'), cfg_raw('fault=populate:1'),
     cfg_raw('fault=bogus:1'), cfg_raw('fault=alloc:0'),
     cfg_raw('fault=alloc:1:0'), cfg_raw('fault=alloc'),
     cfg_raw('fault=alloc:1,fault=alloc:2'))
seed('config-items', [HOST, b1()],
     cfg_items(1, 4, [(1, 7), (10, 3)]), cfg_items(1, 0, [(10, 0)]),
     cfg_items(1, 8, [(13, 43), (14, 45)]), cfg_items(1, 0, [(17, 2)]),
     cfg_items(1, 0, [(15, 40), (18, 49)]), cfg_items(1, 0, [(9, 17)]),
     cfg_items(1, 0, [(9, 18), (2, 19)]), cfg_items(1, 0, [(0, 33)]),
     cfg_items(1, 0, [(11, 36), (12, 23), (13, 1)]),
     cfg_items(1, 0, [(0x61, 4)]), cfg_items(1, 0, [(0x80 | 21, 3)]))
seed('config-env', [HOST, b1()],
     cfg_items(2, 0, [(1, 6)]), cfg_items(2, 0, [(19, 1)]))
seed('config-user', [HOST, b1()],
     cfg_items(3, 1, [(3, 7), (2, 8)]), cfg_items(3, 0, [(3, 9)]),
     cfg_items(3, 2, [(0, 30)]), cfg_items(3, 1, [(11, 36)]),
     cfg_items(3, 0, [(4, 28), (5, 1), (6, 1)]),
     cfg_items(3, 0, [(3, 20)]), cfg_items(3, 0, [(2, 21), (3, 22)]))
seed('backend-faults', [USER, b1(tcache=0)],
     *[op for mode in range(8) for op in (
         [BACKEND_FAULT, mode, 1], alloc(s_upto64k(30000 + mode)),
         alloc(s_large(800000)))],
     [BACKEND_FAULT, 0, 3], alloc(s_large(900000)), [EMPTY_CACHE])
seed('backend-fault-recreate', [USER | RESERVE, b1()],
     alloc(s_small(9)), [BACKEND_FAULT, 5, 1], [RECREATE],
     alloc(s_small(9)), [BACKEND_FAULT, 7, 2], [RECREATE], alloc(s_small(9)))
seed('pool-b', [HOST | POOL_B_ON, b1()],
     alloc(s_small(100)),
     *[[POOL_B, sub, 0] + u16(4000) for sub in range(8)],
     [POOL_B, 1, 0, 0, 0], [POOL_B, 7, 0, 0, 0])


def t2_slice(*ops):
    data = []
    for op in ops:
        data += op
    return data


slice1 = t2_slice(alloc(s_small(200)), alloc(s_upto64k(7000)), [FREE, 0],
                  [FREE_INTERIOR, 0] + u32(9), [FREE_FOREIGN, 2],
                  [EMPTY_CACHE], [THREAD_FLUSH], [STATS, 0], [FREE, 3])
seed('threads', [HOST, b1()],
     alloc(s_small(100)), alloc(s_small(100)), alloc(s_upto64k(5000)),
     [THREADS, len(slice1) - 1, 6, 2] + slice1,
     alloc(s_small(100)), [FREE, 0], [EMPTY_CACHE], alloc(s_small(300)),
     [FREE, 1], [STATS, 0], [FREE, 0], [FREE, 0], [FREE, 0])
slice2 = t2_slice(alloc(s_small(50)), [RECORD, 0, 1, 1], [FREE, 0],
                  [SYNC], [SIM_SUBMIT, 1, 4], [PROCESS], alloc(s_small(50)))
seed('threads-sim', [HOST | EV_SIM, b1(tcache=2)],
     alloc(s_small(10)), [RECORD, 0, 2, 0],
     [THREADS, len(slice2) - 1, 4, 1] + slice2,
     alloc(s_small(10)), [RECORD, 0, 0, 0], [FREE, 0], [SYNC], [FREE, 0])
slice3 = t2_slice([EVENTS_SCRIPT, 1, 3], [FREE, 0], alloc(s_small(8)),
                  [RECORD, 0, 0, 0], [FREE, 0], [BACKEND_FAULT, 1, 1],
                  alloc(s_upto64k(60000)), [SYNC])
seed('threads-user', [USER | EV_USER, b1()],
     [EVENTS_SCRIPT, 2, 0, 3], alloc(s_small(10)), alloc(s_small(10)),
     [RECORD, 0, 0, 0], [RECORD, 1, 1, 0],
     [THREADS, len(slice3) - 1, 3, 2] + slice3, [SYNC], [EMPTY_CACHE])
seed('recreate', [HOST | EV_SIM | POOL_B_ON, b1()],
     alloc(s_small(10)), alloc(s_upto64k(10000)), [RECORD, 1, 0, 0],
     [FREE, 1], [SIM_SUBMIT, 0, 0x0c], [RECREATE], [FREE_DEAD, 0, 0],
     alloc(s_small(10)), [FREE_DEAD, 1, 0], [RECREATE])
seed('burst-cap', [HOST, b1(tcache=4, small_cap=True)],
     [BURST] + s_upto64k(65536) + [31, 1],
     [BURST] + s_upto64k(65536) + [31, 0],
     [BURST] + s_upto8m(8 << 20) + [3, 0], [STATS, 0], [EMPTY_CACHE])
seed('burst-small', [MALLOC, b1(tcache=1, shards=4)],
     [BURST] + s_small(512) + [31, 1], [BURST] + s_small(600) + [20, 0],
     [THREAD_FLUSH], [BURST] + s_small(512) + [31, 1], [EMPTY_CACHE])
seed('hugepages-mlock', [HOST | HUGE | MLOCK | RESERVE, b1()],
     alloc(s_small(100)), alloc(s_large(1 << 20)), [FREE, 0], [EMPTY_CACHE],
     [GET_CONFIG, 3, 2, 0])
seed('malloc-backend', [MALLOC | EV_SIM, b1(tcache=5, shards=2)],
     alloc(s_small(1)), alloc(s_upto256k(100000)), [RECORD, 1, 2, 0],
     [FREE, 1], [FREE, 0], [EMPTY_CACHE], [FREE_DEAD, 0, 0],
     [FREE_DEAD, 1, 0], [SYNC], [EMPTY_CACHE])
seed('user-locked-with-backend', [USER_LOCKED, b1(tcache=1) | 1],
     alloc(s_small(100)), alloc(s_large(300000)), [FREE, 0], [EMPTY_CACHE])
seed('tcache-off', [HOST, b1(tcache=0, shards=2)],
     *[op for i in range(8) for op in (alloc(s_small(64 * i + 1)),)],
     *[[FREE, 0] for _ in range(4)], [FREE_DEAD, 1, 0], [THREAD_FLUSH])
seed('cap-large', [USER, b1(small_cap=True)],
     *[alloc(s_upto8m(8 << 20)) for _ in range(4)], [FREE, 0],
     alloc(s_upto8m(8 << 20)), [STATS, 0])
seed('empty', [])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, 'corpus')
    os.makedirs(out, exist_ok=True)
    for i, (name, data) in enumerate(sorted(SEEDS.items())):
        with open(os.path.join(out, 'seed-%s' % name), 'wb') as f:
            f.write(data)
    print('%d seeds in %s' % (len(SEEDS), out))


if __name__ == '__main__':
    main()
