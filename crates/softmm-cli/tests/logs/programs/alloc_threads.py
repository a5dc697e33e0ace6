# Allocate in four threads (bytearrays large enough to be mmapped by malloc), then exit.
import threading
def work(n):
    keep = []
    for i in range(n):
        b = bytearray(300 * 1024 + (i % 5) * 8192)
        b[-1] = i & 0xff
        keep.append(b)
        if len(keep) > 8:
            keep.pop(0)
    small = [str(i) * 3 for i in range(20000)]
    return len(small)
ts = [threading.Thread(target=work, args=(50 + 10 * t,)) for t in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print("done")
