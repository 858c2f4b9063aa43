"""Owner CPU per Buffer returned through a multiprocessing pickle (issue 36,
second round; docs/benchmarks.md): N 4 KiB blocks lent to a forked worker,
which sends them all back; the owner's thread CPU time around unpickling
them (the return socket's proof read, the C return). Run with the build's
module on the path: PYTHONPATH=build/release/python python3 pickled_cost.py 100
"""
import multiprocessing as mp, pickle, time, os, sys
import pinpool
from pinpool import _share
N = int(sys.argv[1]) if len(sys.argv) > 1 else 500
def worker(inq, outq):
    datas = inq.get()
    bufs = [pickle.loads(d) for d in datas]
    outq.put([pickle.dumps(b) for b in bufs])
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    inq, outq = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=worker, args=(inq, outq)); p.start()
    pool = pinpool.Pool("shared=1,backend=host,mlock=0")
    bufs = [pool.alloc(4096) for _ in range(N)]
    for b in bufs: b.lend(p.pid)
    inq.put([pickle.dumps(b) for b in bufs])
    backs = outq.get(timeout=60)
    t = time.thread_time_ns()
    got = [pickle.loads(d) for d in backs]
    dt = time.thread_time_ns() - t
    assert all(g is b for g, b in zip(got, bufs))
    p.join()
    print(f"pickled returns {N}: owner CPU {dt / N / 1000:.1f} us per return (unpickle, proof read, C return)")
