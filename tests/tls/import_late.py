"""Import the pinpool module after the static TLS surplus is used up
(tests/tls/test_dlopen_tls.c says how). Run by ctest with the module's
directory on PYTHONPATH: python3 import_late.py HOG_DIR NHOGS"""
import ctypes
import sys

hog_dir, nhogs = sys.argv[1], int(sys.argv[2])
why = None
for i in range(nhogs):
    try:
        ctypes.CDLL(f"{hog_dir}/libpp_tlshog_{i}.so")
    except OSError as e:
        why = str(e)
        break
assert why is not None and "static TLS" in why, (
    f"the static TLS surplus was not used up by {nhogs} libraries")
print(f"surplus used up after {i} libraries: {why}")

import pinpool  # noqa: E402  (the point: imported late)

pool = pinpool.Pool("mlock=0,populate=0")
bufs = [pool.alloc(4096 << i) for i in range(6)]
for b in bufs:
    b.close()
assert pool.stats()["blocks"]["current"] == 0
print("pinpool imported late and used: ok")
